"""Entropy bonus: loss = pg_loss - c * token-mean entropy of the current policy, verl's ``actor.entropy_coeff``
(verl's examples use c = 0; 0.001 was the old default, blamed for entropy explosions at LLM scale)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from stare_verl.methods.base import _hydra_value
from stare_verl.methods.grpo import TwinBased


class EntropyBonusConfig(BaseModel):
    """Attributes:
    coef: c, the entropy coefficient (>= 0), verl's ``actor_rollout_ref.actor.entropy_coeff``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    coef: float = Field(0.001, ge=0.0)


class EntropyBonus(TwinBased):
    """A constant entropy bonus in the actor's loss."""

    name: ClassVar[str] = "entropy_bonus"
    summary: ClassVar[str] = "entropy bonus: loss - c * H (verl actor.entropy_coeff)"
    Config: ClassVar[type] = EntropyBonusConfig

    def verl_keys(self) -> dict[str, str]:
        return {"actor_rollout_ref.actor.entropy_coeff": _hydra_value(self.config.coef)}
