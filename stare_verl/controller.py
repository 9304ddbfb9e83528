"""STARE's target-entropy gate and adaptive W/M schedule, with state that survives checkpoints.

Source: STARE step 3 (``docs/stare.md``): ``gate_on = H_batch < H_target``; optional adaptive
schedule ``sgn = sign(H_target - H_batch)``, ``W = clip(W + alpha*sgn, 1, W_max)``,
``M = clip(M - alpha*sgn, M_min, 1)``. The update is applied before the step's weights are computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stare_verl.config import StareConfig


@dataclass(frozen=True)
class GateDecision:
    """The controller's decision for one training step.

    Attributes:
        gate_on: reweighting is applied this step.
        w: W used this step. m: M used this step (only applied for variant C2).
        batch_entropy: H_batch in nats (token mean over valid model tokens), None if there were none.
    """

    gate_on: bool
    w: float
    m: float
    batch_entropy: float | None


class StareController:
    """Holds W, M and the step count across training steps.

    Args:
        config: validated STARE hyperparameters.
    """

    STATE_VERSION = 1

    def __init__(self, config: StareConfig):
        self.config = config
        self.w = float(config.reweight_w)
        self.m = float(config.reweight_m)
        self.steps = 0

    def step(self, batch_entropy: float | None) -> GateDecision:
        """Advance one training step given the batch entropy (nats; None when no valid model token).

        With no valid token the gate stays off and the adaptive state is not moved.
        """
        cfg = self.config
        self.steps += 1
        if batch_entropy is None:
            return GateDecision(False, self.w, self.m, None)
        if cfg.adaptive:
            diff = cfg.target_entropy - batch_entropy
            sgn = (diff > 0) - (diff < 0)
            self.w = min(max(self.w + cfg.alpha * sgn, 1.0), cfg.w_max)
            self.m = min(max(self.m - cfg.alpha * sgn, cfg.m_min), 1.0)
        return GateDecision(batch_entropy < cfg.target_entropy, self.w, self.m, batch_entropy)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: W, M, steps, and the config it was built with."""
        return {
            "version": self.STATE_VERSION,
            "w": self.w,
            "m": self.m,
            "steps": self.steps,
            "config": self.config.model_dump(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore W, M and steps saved by ``state_dict``.

        Raises:
            ValueError: the state has an unknown version or lacks a key.
        """
        if state.get("version") != self.STATE_VERSION:
            raise ValueError(f"unsupported STARE controller state version {state.get('version')!r}")
        try:
            self.w, self.m, self.steps = float(state["w"]), float(state["m"]), int(state["steps"])
        except KeyError as err:
            raise ValueError(f"STARE controller state lacks key {err}") from None
