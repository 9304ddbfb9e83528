"""Adaptive entropy coefficient (Skywork-OR1, arXiv 2505.22312; TRL's ``use_adaptive_entropy``): an entropy bonus
whose coefficient follows the batch entropy, ``c <- clip(c + delta * sign(target - H), c_min, c_max)``, applied
only while ``H < target``.

verl's ``actor.entropy_coeff`` is a frozen field of the workers' config, so the coefficient of each step travels
with the actor update (``KVBatchMeta.extra_info["entropy_coeff"]``) and the workers' loss reads it
(:func:`stare_verl.verl_compat.ppo_loss_with_step_settings`, installed by our trainer modes). The current policy's
entropy is computed in the update (``actor.calculate_entropy=true``). H here is the step's batch token-mean entropy
over model tokens of the pre-update policy; the coefficient is updated with it, then applied to the same step.
The controller state (c, steps) is checkpointed as ``adaptive_entropy_state.json``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stare_verl.methods.base import EntropyControl, finite_model_tokens


class AdaptiveEntropyConfig(BaseModel):
    """Attributes:
    target_entropy: the target H (nats); OR1 7B 0.2 (the CPU recipes set their family's target).
    delta: the coefficient's step per training step (OR1 7B 1e-4; TRL 0.005).
    coef_init: the coefficient before the first step (OR1 0).
    coef_min, coef_max: its clip range (OR1 [0, 0.005]; TRL [0, 1]).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    target_entropy: float = Field(0.2, ge=0.0)
    delta: float = Field(1e-4, ge=0.0)
    coef_init: float = Field(0.0, ge=0.0)
    coef_min: float = Field(0.0, ge=0.0)
    coef_max: float = Field(0.005, ge=0.0)

    @model_validator(mode="after")
    def _check_range(self) -> AdaptiveEntropyConfig:
        if not self.coef_min <= self.coef_init <= self.coef_max:
            raise ValueError(f"need coef_min <= coef_init <= coef_max, got {self.coef_min}, {self.coef_init}, "
                             f"{self.coef_max}")  # fmt: skip
        return self


def next_coefficient(coef: float, batch_entropy: float | None, cfg: AdaptiveEntropyConfig) -> tuple[float, float]:
    """One step of the controller: ``(new_coef, applied_coef)``; ``applied`` is ``new_coef`` while
    ``batch_entropy < target`` and 0 otherwise. ``batch_entropy`` None or NaN (no valid model token) moves nothing
    and applies nothing."""
    if batch_entropy is None or not math.isfinite(batch_entropy):
        return coef, 0.0
    diff = cfg.target_entropy - batch_entropy
    sgn = (diff > 0) - (diff < 0)
    new = min(max(coef + cfg.delta * sgn, cfg.coef_min), cfg.coef_max)
    return new, (new if batch_entropy < cfg.target_entropy else 0.0)


class AdaptiveEntropy(EntropyControl):
    """An entropy bonus with a coefficient steered toward a target entropy."""

    name: ClassVar[str] = "adaptive_entropy"
    summary: ClassVar[str] = "adaptive entropy coefficient: c += delta * sign(target - H), bonus while H < target"
    Config: ClassVar[type] = AdaptiveEntropyConfig
    estimator: ClassVar[str] = "adaptive_entropy"
    target_key: ClassVar[str] = "target_entropy"
    state_file: ClassVar[str] = "adaptive_entropy_state.json"
    metric_prefix: ClassVar[str] = "adaptive_entropy/"
    STATE_VERSION: ClassVar[int] = 1

    def __init__(self, config: AdaptiveEntropyConfig):
        super().__init__(config)
        self.coef = float(config.coef_init)
        self.applied = 0.0
        self.steps = 0

    def launch_overrides(self) -> list[str]:
        """Its section and estimator, the current policy's entropy in the update; a target left unset follows the
        recipe's STARE target (the family's calibrated one), so both methods aim at the same entropy."""
        out = super().launch_overrides()
        if "target_entropy" not in self.config.model_fields_set:
            out = [o if ".target_entropy=" not in o else
                   "++algorithm.adaptive_entropy.target_entropy=${algorithm.stare.target_entropy}" for o in out]  # fmt: skip
        return [*out, "++actor_rollout_ref.actor.calculate_entropy=true"]

    def reshape(self, advantages, response_mask, old_log_probs, entropys, metrics):
        valid = finite_model_tokens(response_mask, entropys)
        h = float(entropys.detach()[valid].double().mean()) if valid.any() else None
        self.coef, self.applied = next_coefficient(self.coef, h, self.config)
        self.steps += 1
        metrics["adaptive_entropy/coef"] = self.coef
        metrics["adaptive_entropy/applied_coef"] = self.applied
        metrics["adaptive_entropy/target_entropy"] = self.config.target_entropy
        return advantages

    def actor_extra(self) -> dict[str, Any]:
        return {"entropy_coeff": self.applied}

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.STATE_VERSION, "coef": self.coef, "steps": self.steps,
                "config": self.config.model_dump()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore c and the step count (c clipped into the current config's range).

        Raises:
            ValueError: unknown version, a missing key, a non-finite or negative coefficient, negative steps.
        """
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION:
            raise ValueError(f"unsupported adaptive-entropy state {state!r:.80}")
        try:
            coef, steps = float(state["coef"]), int(state["steps"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"corrupt adaptive-entropy state: {err}") from None
        if not math.isfinite(coef) or coef < 0 or steps < 0:
            raise ValueError(f"corrupt adaptive-entropy state: coef {coef}, steps {steps}")
        self.coef = min(max(coef, self.config.coef_min), self.config.coef_max)
        self.steps = steps
