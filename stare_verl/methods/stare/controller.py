"""STARE's target-entropy gate and adaptive W/M schedule, with state that survives checkpoints.

Source: STARE step 3 (``docs/stare.md``): ``gate_on = H_batch < H_target``; optional adaptive
schedule ``sgn = sign(H_target - H_batch)``, ``W = clip(W + alpha*sgn, 1, W_max)``,
``M = clip(M - alpha*sgn, M_min, 1)``. The update is applied before the step's weights are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stare_verl.methods.stare.config import StareConfig


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
        """Restore the state saved by ``state_dict``.

        W and M are state only under the adaptive schedule: without it they are configuration, so a resumed run
        uses the W and M it is configured with now (a changed ``reweight_w``/``reweight_m`` takes effect) and
        restores only the step count. With it, the saved W and M are restored and must lie within the schedule's
        clips ([1, w_max], [m_min, 1]) of the current configuration (clipped into them).

        Raises:
            ValueError: the state has an unknown version, lacks a key, or holds a W/M/steps that no controller
                could have written (non-numeric, non-finite or non-positive W/M, negative steps): a corrupt file.
        """
        if state.get("version") != self.STATE_VERSION:
            raise ValueError(f"unsupported STARE controller state version {state.get('version')!r}")
        try:
            w, m, steps = float(state["w"]), float(state["m"]), int(state["steps"])
        except KeyError as err:
            raise ValueError(f"STARE controller state lacks key {err}") from None
        except (TypeError, ValueError, OverflowError) as err:
            raise ValueError(f"STARE controller state holds a non-numeric w/m/steps: {err}") from None
        if steps < 0:
            raise ValueError(f"STARE controller state has steps={steps} < 0")
        if not (math.isfinite(w) and math.isfinite(m) and w > 0 and m > 0):
            raise ValueError(f"STARE controller state has w={w}, m={m}: weights must be finite and > 0")
        cfg = self.config
        if cfg.adaptive:  # clipped into this run's schedule (w_max / m_min may have changed since the save)
            self.w = min(max(w, 1.0), cfg.w_max)
            self.m = min(max(m, cfg.m_min), 1.0)
        self.steps = steps
