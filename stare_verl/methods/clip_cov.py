"""Clip-Cov (Cui et al. 2025, arXiv 2505.22617): per token cov_i = (A_i - mean A)(log pi_i - mean log pi); a random
``ratio`` share of the tokens with lb < cov < ub get no gradient. verl's own policy loss ``clip_cov`` does it
(per micro-batch on each rank, as the paper's code); this method sets its keys. The paper's recipes also set the
PPO clip range to 1 (no ratio clipping); here the recipes' clip-higher stays unless ``clip_ratio`` is given."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from stare_verl.methods.base import _hydra_value
from stare_verl.methods.grpo import TwinBased


class ClipCovConfig(BaseModel):
    """Attributes:
    ratio: share of tokens whose gradient is detached (``clip_cov_ratio``, paper 2e-4; verl keeps at least one).
    lb: lower bound of the covariance window (``clip_cov_lb``, paper 1).
    ub: upper bound of the covariance window (``clip_cov_ub``, paper 5).
    clip_ratio: the PPO clip range (both sides) if given (the paper's recipes: 1); None keeps the recipe's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    ratio: float = Field(2e-4, gt=0.0, le=1.0)
    lb: float = 1.0
    ub: float = 5.0
    clip_ratio: float | None = Field(None, gt=0.0)


class ClipCov(TwinBased):
    """verl's ``clip_cov`` policy loss."""

    name: ClassVar[str] = "clip_cov"
    summary: ClassVar[str] = "Clip-Cov: detach the gradient of a random share of high-covariance tokens (verl loss)"
    Config: ClassVar[type] = ClipCovConfig

    def verl_keys(self) -> dict[str, str]:
        c, pl = self.config, "actor_rollout_ref.actor.policy_loss"
        keys = {f"{pl}.loss_mode": "clip_cov", f"{pl}.clip_cov_ratio": _hydra_value(c.ratio),
                f"{pl}.clip_cov_lb": _hydra_value(c.lb), f"{pl}.clip_cov_ub": _hydra_value(c.ub)}  # fmt: skip
        if c.clip_ratio is not None:
            for side in ("low", "high"):
                keys[f"actor_rollout_ref.actor.clip_ratio_{side}"] = _hydra_value(c.clip_ratio)
        return keys
