"""Entropy-dynamics metrics every entropy-control method logs (``entropy_control/*``), from one step's tensors.

Pure torch on the tensors' device; only scalars reach the host. Source of the covariance reading: Cui et al. 2025
(arXiv 2505.22617), dH ~ -eta * Cov(log pi, A) for a softmax policy under natural policy gradient: a positive
covariance lowers the entropy. "Forking" tokens: Wang et al. 2025 (arXiv 2506.01939), the top 20% of tokens by
entropy.
"""

from __future__ import annotations

import math

import torch

from stare_verl.methods.base import finite_model_tokens, top_share_mask

FORKING_SHARE = 0.2
"""Share of model tokens, by entropy, whose mean entropy is ``entropy_control/forking_entropy``."""


def _cov(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(((x - x.mean()) * (y - y.mean())).mean())


def entropy_dynamics(
    advantages: torch.Tensor,
    advantages_eff: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    entropys: torch.Tensor,
) -> dict[str, float]:
    """The step's ``entropy_control/*`` metrics over valid model tokens (mask 1, finite log-prob and entropy).

    Args:
        advantages: ``[B, T]`` float, the GRPO advantages before the method's change.
        advantages_eff: ``[B, T]`` float, what the actor's update receives (equal to ``advantages`` for methods
            that act in the loss only).
        response_mask: ``[B, T]``, 1 for model tokens, 0 for padding and tool output (never counted).
        old_log_probs: ``[B, T]`` float, log-probs (nats) of the sampled tokens under the pre-update policy.
        entropys: ``[B, T]`` float, per-token entropy (nats) from the same forward pass.

    Returns:
        floats: ``batch_entropy`` (token mean, nats; NaN without a valid token), ``forking_entropy`` (mean entropy
        of the top 20% tokens by entropy, nats), ``forking_threshold`` (the smallest entropy among them),
        ``cov_logp_adv`` / ``cov_logp_adv_eff`` (token-level Cov(old log-prob, A) before / after the method's
        change, nats x advantage units), ``adv_changed_frac`` (share of valid model tokens whose advantage the
        method changed), ``mean_abs_adv`` / ``mean_abs_adv_eff`` and ``model_tokens``.

    Raises:
        ValueError: the tensors are not all of one ``[B, T]`` shape.
    """
    shapes = {tuple(t.shape) for t in (advantages, advantages_eff, response_mask, old_log_probs, entropys)}
    if len(shapes) != 1:
        raise ValueError(f"entropy_dynamics needs tensors of one [B, T] shape, got {sorted(shapes)}")
    valid = finite_model_tokens(response_mask, old_log_probs, entropys)
    n = int(valid.sum())
    out = {"entropy_control/model_tokens": float(n)}
    if n == 0:
        nan = math.nan
        keys = ("batch_entropy", "forking_entropy", "forking_threshold", "cov_logp_adv", "cov_logp_adv_eff",
                "adv_changed_frac", "mean_abs_adv", "mean_abs_adv_eff")  # fmt: skip
        return out | {f"entropy_control/{k}": nan for k in keys}
    ent = entropys.detach()[valid].double()
    lp = old_log_probs.detach()[valid].double()
    a0 = advantages.detach()[valid].double()
    a1 = advantages_eff.detach()[valid].double()
    top = top_share_mask(entropys.detach(), valid, FORKING_SHARE)
    top_ent = entropys.detach()[top].double()
    return out | {
        "entropy_control/batch_entropy": float(ent.mean()),
        "entropy_control/forking_entropy": float(top_ent.mean()),
        "entropy_control/forking_threshold": float(top_ent.min()),
        "entropy_control/cov_logp_adv": _cov(lp, a0),
        "entropy_control/cov_logp_adv_eff": _cov(lp, a1),
        "entropy_control/adv_changed_frac": float((a0 != a1).double().mean()),
        "entropy_control/mean_abs_adv": float(a0.abs().mean()),
        "entropy_control/mean_abs_adv_eff": float(a1.abs().mean()),
    }
