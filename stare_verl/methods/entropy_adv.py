"""Entropy advantage (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective", arXiv 2506.14758):
per token ``A' = A + min(alpha * H_detached, abs(A) / kappa)``. The clip by ``abs(A) / kappa`` keeps the term from
reversing the sign of a negative advantage or dominating it; a token with A = 0 gets nothing.

H is the pre-update policy's entropy from the old log-prob pass (on-policy: the entropy of the policy being
updated, detached, as in the paper); only model tokens (mask 1, finite entropy) are changed.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from stare_verl.methods.base import EntropyControl, finite_model_tokens


class EntropyAdvConfig(BaseModel):
    """Attributes:
    alpha: scale of the entropy term (>= 0); 0.4 as reported.
    kappa: the clip ``abs(A) / kappa`` (> 0); 2 as reported.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    alpha: float = Field(0.4, ge=0.0)
    kappa: float = Field(2.0, gt=0.0)


def entropy_advantages(advantages: torch.Tensor, response_mask: torch.Tensor, entropys: torch.Tensor,
                       alpha: float, kappa: float) -> torch.Tensor:  # fmt: skip
    """``A + min(alpha * H, abs(A) / kappa)`` on model tokens with a finite entropy, ``A`` elsewhere.

    Args:
        advantages: ``[B, T]`` float (0 where the mask is 0). response_mask: ``[B, T]``, 1 = model token.
        entropys: ``[B, T]`` float per-token entropy (nats), detached here.
        alpha, kappa: see :class:`EntropyAdvConfig`.

    Returns:
        a new ``[B, T]`` tensor of the advantages' dtype.
    """
    valid = finite_model_tokens(response_mask, entropys)
    h = torch.where(valid, entropys.detach().to(advantages.dtype), torch.zeros_like(advantages))
    bonus = torch.minimum(alpha * h, advantages.abs() / kappa)
    return advantages + torch.where(valid, bonus, torch.zeros_like(bonus))


class EntropyAdv(EntropyControl):
    """An entropy term added to each token's advantage, clipped by the advantage's magnitude."""

    name: ClassVar[str] = "entropy_adv"
    summary: ClassVar[str] = "entropy advantage: A + min(alpha * H, |A| / kappa) per token"
    Config: ClassVar[type] = EntropyAdvConfig
    estimator: ClassVar[str] = "entropy_adv"
    metric_prefix: ClassVar[str] = "entropy_adv/"

    def reshape(self, advantages, response_mask, old_log_probs, entropys, metrics):
        out = entropy_advantages(advantages, response_mask, entropys, self.config.alpha, self.config.kappa)
        valid = response_mask.bool()
        metrics["entropy_adv/mean_bonus"] = float((out - advantages)[valid].double().mean()) if valid.any() else 0.0
        return out
