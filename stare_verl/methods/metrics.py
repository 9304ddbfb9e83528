"""Entropy-dynamics metrics every entropy-control method logs (``entropy_control/*``), from one step's tensors.

Pure torch on the tensors' device; only scalars reach the host. Source of the covariance reading: Cui et al. 2025
(arXiv 2505.22617), dH ~ -eta * Cov(log pi, A) for a softmax policy under natural policy gradient: a positive
covariance lowers the entropy. "Forking" tokens: Wang et al. 2025 (arXiv 2506.01939), the top 20% of tokens by
entropy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from stare_verl.methods.base import finite_model_tokens, top_share_mask

FORKING_SHARE = 0.2
"""Share of model tokens, by entropy, whose mean entropy is ``entropy_control/forking_entropy``."""

QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low", "zero_adv")
"""Token classes of the covariance's split (``entropy_control/cov_quadrant[_eff]/<class>``): advantage sign (A > 0,
A < 0, A == 0) x surprisal above (``high``: ``-log_prob > H_batch``) or at/below (``low``) the batch entropy; A == 0
tokens form one class."""


def _cov_terms(lp: torch.Tensor, adv: torch.Tensor, high: torch.Tensor) -> tuple[float, dict[str, float]]:
    """Cov(lp, adv) over the given tokens (float64 ``[N]``) and each class's contribution
    ``(1/N) sum_{t in class} (lp_t - mean lp)(A_t - mean A)`` (the five sum to the covariance)."""
    d = (lp - lp.mean()) * (adv - adv.mean())
    n = d.numel()
    classes = {"pos_high": (adv > 0) & high, "pos_low": (adv > 0) & ~high, "neg_high": (adv < 0) & high,
               "neg_low": (adv < 0) & ~high, "zero_adv": adv == 0}  # fmt: skip
    return float(d.sum() / n), {q: float(d[classes[q]].sum() / n) for q in QUADRANTS}


def entropy_dynamics(
    advantages: torch.Tensor,
    advantages_eff: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    entropys: torch.Tensor,
    computed: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """The step's ``entropy_control/*`` metrics over valid model tokens (mask 1, finite log-prob and entropy).

    Args:
        advantages: ``[B, T]`` float, the GRPO advantages before the method's change.
        advantages_eff: ``[B, T]`` float, what the actor's update receives (equal to ``advantages`` for methods
            that act in the loss only).
        response_mask: ``[B, T]``, 1 for model tokens, 0 for padding and tool output (never counted).
        old_log_probs: ``[B, T]`` float, log-probs (nats) of the sampled tokens under the pre-update policy.
        entropys: ``[B, T]`` float, per-token entropy (nats) from the same forward pass.
        computed: the step's metrics so far: a shared quantity the method computed already on its way (STARE's
            batch entropy and covariance sums) is not computed again and not returned (each is computed once).

    Returns:
        floats: ``batch_entropy`` (token mean, nats; NaN without a valid token), ``forking_entropy`` (mean entropy
        of the top 20% tokens by entropy, nats), ``forking_threshold`` (the smallest entropy among them),
        ``cov_logp_adv`` / ``cov_logp_adv_eff`` (token-level Cov(old log-prob, A) before / after the method's
        change, nats x advantage units) and their split ``cov_quadrant[_eff]/<class>`` (:data:`QUADRANTS`, at the
        batch entropy), ``adv_changed_frac`` (share of valid model tokens whose advantage the
        method changed), ``mean_abs_adv`` / ``mean_abs_adv_eff`` and ``model_tokens``.

    Raises:
        ValueError: the tensors are not all of one ``[B, T]`` shape.
    """
    shapes = {tuple(t.shape) for t in (advantages, advantages_eff, response_mask, old_log_probs, entropys)}
    if len(shapes) != 1:
        raise ValueError(f"entropy_dynamics needs tensors of one [B, T] shape, got {sorted(shapes)}")
    computed = computed or {}
    valid = finite_model_tokens(response_mask, old_log_probs, entropys)
    n = int(valid.sum())
    out = {"entropy_control/model_tokens": float(n)}
    if n == 0:
        nan = math.nan
        keys = ("batch_entropy", "forking_entropy", "forking_threshold", "cov_logp_adv", "cov_logp_adv_eff",
                "adv_changed_frac", "mean_abs_adv", "mean_abs_adv_eff")  # fmt: skip
        out |= {f"entropy_control/{k}": nan for k in keys}
        return {k: v for k, v in out.items() if k not in computed}
    ent = entropys.detach()[valid].double()
    lp = old_log_probs.detach()[valid].double()
    a0 = advantages.detach()[valid].double()
    a1 = advantages_eff.detach()[valid].double()
    top = top_share_mask(entropys.detach(), valid, FORKING_SHARE)
    top_ent = entropys.detach()[top].double()
    h = float(computed.get("entropy_control/batch_entropy", ent.mean()))
    out |= {
        "entropy_control/batch_entropy": h,
        "entropy_control/forking_entropy": float(top_ent.mean()),
        "entropy_control/forking_threshold": float(top_ent.min()),
        "entropy_control/adv_changed_frac": float((a0 != a1).double().mean()),
        "entropy_control/mean_abs_adv": float(a0.abs().mean()),
        "entropy_control/mean_abs_adv_eff": float(a1.abs().mean()),
    }
    high = -lp > h
    for suffix, a in (("", a0), ("_eff", a1)):
        if f"entropy_control/cov_logp_adv{suffix}" in computed:
            continue
        cov, parts = _cov_terms(lp, a, high)
        out[f"entropy_control/cov_logp_adv{suffix}"] = cov
        out |= {f"entropy_control/cov_quadrant{suffix}/{q}": v for q, v in parts.items()}
    return {k: v for k, v in out.items() if k not in computed}
