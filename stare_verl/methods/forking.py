"""Forking tokens, "80/20" (Wang et al. 2025, arXiv 2506.01939; TRL's ``top_entropy_quantile``): the policy gradient
only on the top ``rho`` share of tokens by entropy.

Here the selection is made once per training batch, over all model tokens (mask 1, finite entropy) of the batch,
from the pre-update policy's entropy (the same forward pass that gives the old log-probs; on-policy this is the
entropy of the policy being updated), and the other tokens' advantage is set to 0. A token with advantage 0
contributes nothing to the clipped surrogate (dual clip included), so this equals masking their loss while
keeping the loss's token-mean denominator over all model tokens (as TRL does). The paper's code selects per
micro-batch on each rank (TRL gathers over ranks); this scope is the whole batch, independent of how it is split.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from stare_verl.methods.base import EntropyControl, finite_model_tokens, top_share_mask


class ForkingConfig(BaseModel):
    """Attributes:
    rho: share of model tokens, by entropy, that keep their advantage (0, 1]; the paper's 0.2.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    rho: float = Field(0.2, gt=0.0, le=1.0)


def forking_advantages(advantages: torch.Tensor, response_mask: torch.Tensor, entropys: torch.Tensor,
                       rho: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The 80/20 rule on one batch.

    Args:
        advantages: ``[B, T]`` float advantages (0 where the mask is 0).
        response_mask: ``[B, T]``, 1 for model tokens, 0 for padding and tool output (never selected).
        entropys: ``[B, T]`` float per-token entropy (nats) of the pre-update policy.
        rho: share of the model tokens with a finite entropy to keep, ``ceil(rho * n)`` of them.

    Returns:
        ``(advantages_eff, selected)``: a new ``[B, T]`` tensor, ``advantages`` on the selected tokens and 0
        elsewhere, and the ``[B, T]`` bool selection.
    """
    selected = top_share_mask(entropys.detach(), finite_model_tokens(response_mask, entropys), rho)
    return torch.where(selected, advantages, torch.zeros_like(advantages)), selected


class Forking(EntropyControl):
    """Policy gradient on the high-entropy "forking" tokens only."""

    name: ClassVar[str] = "forking"
    summary: ClassVar[str] = "80/20 forking tokens: policy gradient on the top-rho entropy tokens only"
    Config: ClassVar[type] = ForkingConfig
    estimator: ClassVar[str] = "forking"
    metric_prefix: ClassVar[str] = "forking/"

    def reshape(self, advantages, response_mask, old_log_probs, entropys, metrics):
        out, selected = forking_advantages(advantages, response_mask, entropys, self.config.rho)
        n = max(int(response_mask.bool().sum()), 1)
        metrics["forking/selected_frac"] = float(selected.sum()) / n
        metrics["forking/entropy_threshold"] = float(entropys[selected].min()) if selected.any() else -1.0
        return out
