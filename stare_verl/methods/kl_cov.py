"""KL-Cov (Cui et al. 2025, arXiv 2505.22617): the top ``ratio`` tokens by cov_i = (A_i - mean A)(log pi_i - mean
log pi) get an extra penalty ``coef * abs(log pi - log pi_old)``. verl's own policy loss ``kl_cov`` does it (per
micro-batch on each rank, as the paper's code); this method sets its keys."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from stare_verl.methods.base import _hydra_value
from stare_verl.methods.grpo import TwinBased


class KlCovConfig(BaseModel):
    """Attributes:
    ratio: share of tokens penalised (``kl_cov_ratio``; paper 2e-3 for 7B, 2e-4 for 32B; verl keeps at least one).
    coef: the penalty's coefficient (``ppo_kl_coef``; paper 1, verl's config default 0.1).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    ratio: float = Field(2e-3, gt=0.0, le=1.0)
    coef: float = Field(1.0, ge=0.0)


class KlCov(TwinBased):
    """verl's ``kl_cov`` policy loss."""

    name: ClassVar[str] = "kl_cov"
    summary: ClassVar[str] = "KL-Cov: a |log pi - log pi_old| penalty on the top-covariance tokens (verl loss)"
    Config: ClassVar[type] = KlCovConfig

    def verl_keys(self) -> dict[str, str]:
        c, pl = self.config, "actor_rollout_ref.actor.policy_loss"
        return {f"{pl}.loss_mode": "kl_cov", f"{pl}.kl_cov_ratio": _hydra_value(c.ratio),
                f"{pl}.ppo_kl_coef": _hydra_value(c.coef)}  # fmt: skip
