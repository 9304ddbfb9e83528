"""STARE's token selection and reweighting: pure PyTorch, no verl import.

Source: STARE (arXiv 2606.19236), "Per training step" steps 2-6 as written down in
``shared/specs/stare.md``. All per-token tensors are ``[B, T]`` (B responses, T response tokens).
``response_mask`` is 1 for tokens the model generated and 0 for padding and for tool/observation
tokens: only mask-1 tokens enter the quantiles, the gate's entropy and the weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch


def top_count(p: float, n: int) -> int:
    """Return ``ceil(p * n)`` computed on the decimal value of ``p`` (so ``ceil(0.1 * 30) == 3``, not 4).

    Args:
        p: the selection ratio P in (0, 1].
        n: number of candidate tokens (>= 0).
    """
    return math.ceil(Fraction(repr(float(p))) * int(n))


def _kth_smallest(values: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th smallest entry (1 <= k <= numel) of a 1-D tensor, as a 0-d tensor of its dtype."""
    if values.device.type == "cpu":
        # numpy's introselect is ~2x faster than torch.kthvalue on CPU.
        return torch.as_tensor(np.partition(values.numpy(), k - 1)[k - 1])
    return torch.kthvalue(values, k).values


def select_top_surprisal(
    log_probs: torch.Tensor, candidates: torch.Tensor, ratio: float
) -> tuple[torch.Tensor, float | None]:
    """Select exactly the top ``ceil(ratio * n)`` candidate tokens by surprisal ``s = -log_probs``.

    Ties at the threshold are broken deterministically: the earliest tokens in row-major order
    (lower row, then lower position) win.

    Args:
        log_probs: ``[R, T]`` float, old log-probs (nats); values at non-candidate positions are ignored
            (they may be anything, including NaN or inf).
        candidates: ``[R, T]`` bool, the tokens eligible for selection (n = number of True).
        ratio: P in (0, 1].

    Returns:
        ``(selected, threshold)``: ``[R, T]`` bool mask with exactly ``ceil(P * n)`` True entries, all within
        ``candidates``; and the smallest selected surprisal (nats), ``None`` when nothing is selected.
    """
    n = int(torch.count_nonzero(candidates))
    k = top_count(ratio, n)
    if k == 0:
        return torch.zeros_like(candidates), None
    values = log_probs[candidates]
    if k >= n:
        return candidates.clone(), -float(values.max())
    thr = _kth_smallest(values, k).to(log_probs.dtype)  # the k-th highest surprisal
    selected = candidates & (log_probs < thr)
    need = k - int(torch.count_nonzero(selected))
    ties = candidates & (log_probs == thr)
    if int(torch.count_nonzero(ties)) > need:
        order = torch.cumsum(ties.reshape(-1), dim=0, dtype=torch.int64).view_as(ties)
        ties &= order <= need
    return selected | ties, -float(thr)


def select_in_chunks(
    log_probs: torch.Tensor, candidates: torch.Tensor, ratio: float, chunk_rows: list[torch.Tensor] | None
) -> tuple[torch.Tensor, float | None]:
    """``select_top_surprisal`` over all rows (``chunk_rows=None``) or separately within row groups.

    Args:
        log_probs, candidates, ratio: as for ``select_top_surprisal``.
        chunk_rows: list of 1-D index tensors partitioning the rows; each part selects ``ceil(P * n_c)``
            of its own candidates, as the reference code does per micro-batch.

    Returns:
        The selection ``[R, T]`` bool and the mean of the per-part thresholds (None if nothing selected).
    """
    if chunk_rows is None:
        return select_top_surprisal(log_probs, candidates, ratio)
    selected = torch.zeros_like(candidates)
    thresholds = []
    for rows in chunk_rows:
        sel, thr = select_top_surprisal(log_probs[rows], candidates[rows], ratio)
        selected[rows] = sel
        if thr is not None:
            thresholds.append(thr)
    return selected, (sum(thresholds) / len(thresholds) if thresholds else None)


@dataclass(frozen=True)
class TokenMasks:
    """Token masks of one batch.

    Attributes:
        valid: ``[B, T]`` bool, model tokens (response_mask == 1) whose old log-prob and entropy are finite;
            only these are ever selected or enter the gate's entropy.
        n_model: number of model tokens.
        n_valid: number of valid tokens.
        entropy_sum: sum of the entropy over valid tokens (nats).
    """

    valid: torch.Tensor
    n_model: int
    n_valid: int
    entropy_sum: float

    @property
    def n_nonfinite(self) -> int:
        """Model tokens dropped because their log-prob or entropy was NaN or +-inf."""
        return self.n_model - self.n_valid

    @property
    def batch_entropy(self) -> float | None:
        """The gate's H_batch: token-mean entropy over valid tokens (nats); None when there is none."""
        return self.entropy_sum / self.n_valid if self.n_valid else None


def token_masks(
    response_mask: torch.Tensor, old_log_probs: torch.Tensor, entropys: torch.Tensor
) -> TokenMasks:
    """Find the valid model tokens of a batch and their entropy sum (STARE step 3's H_batch numerator).

    Args:
        response_mask: ``[B, T]`` bool/int/float, 1 (or True) for model tokens, 0 elsewhere.
        old_log_probs: ``[B, T]`` float log-probs (nats). entropys: ``[B, T]`` float entropy (nats).

    The common case (every model token finite) costs two dot products; NaN/inf anywhere in the masked
    sums switches to an exact per-token check.

    Raises:
        ValueError: the three tensors are not 2-D of one shape.
    """
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(response_mask.shape)}")
    for name, t in (("old_log_probs", old_log_probs), ("entropys", entropys)):
        if t.shape != response_mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, response_mask {tuple(response_mask.shape)}")
    model = response_mask if response_mask.dtype == torch.bool else response_mask > 0
    weights = model.to(entropys.dtype).reshape(-1)
    n_model = int(torch.count_nonzero(model))
    ent_sum = torch.dot(entropys.reshape(-1), weights)
    lp_sum = torch.dot(old_log_probs.reshape(-1).to(weights.dtype), weights)
    if bool(torch.isfinite(ent_sum)) and bool(torch.isfinite(lp_sum)):
        return TokenMasks(valid=model, n_model=n_model, n_valid=n_model, entropy_sum=float(ent_sum))
    valid = model & torch.isfinite(old_log_probs) & torch.isfinite(entropys)
    ent_clean = torch.where(valid, entropys, 0).reshape(-1)
    ent_sum = torch.dot(ent_clean, weights)
    return TokenMasks(
        valid=valid, n_model=n_model, n_valid=int(torch.count_nonzero(valid)), entropy_sum=float(ent_sum)
    )


@dataclass(frozen=True)
class Selection:
    """L+ or L- of one batch in row-compact form.

    Attributes:
        rows: 1-D long tensor, the rows (responses) whose advantage has the set's sign, ascending.
        selected: ``[len(rows), T]`` bool, the chosen tokens within those rows.
        count: number of chosen tokens.
        threshold: smallest chosen surprisal (nats), None when the set is empty.
    """

    rows: torch.Tensor
    selected: torch.Tensor
    count: int
    threshold: float | None


def select_token_set(
    row_advantages: torch.Tensor,
    old_log_probs: torch.Tensor,
    valid: torch.Tensor,
    ratio: float,
    sign: int,
    chunk_size: int | None = None,
) -> Selection:
    """Pick L+ (``sign=+1``: top-P surprisal among valid tokens with A > 0) or L- (``sign=-1``, A < 0).

    Tokens with A == 0 are never selected. Source: STARE step 4.

    Args:
        row_advantages: ``[B]`` float, each response's (outcome) advantage.
        old_log_probs: ``[B, T]`` float log-probs of the sampled tokens under the pre-update policy (nats).
        valid: ``[B, T]`` bool, model tokens with finite log-prob and entropy.
        ratio: P in (0, 1].
        sign: +1 for L+, -1 for L-.
        chunk_size: ``None`` for whole-batch selection, else sequences per chunk (consecutive rows).
    """
    rows = torch.nonzero(row_advantages > 0 if sign > 0 else row_advantages < 0).reshape(-1)
    chunk_rows = None
    if chunk_size is not None and chunk_size < old_log_probs.shape[0]:
        chunk_id = rows // chunk_size
        chunk_rows = [torch.nonzero(chunk_id == c).reshape(-1) for c in torch.unique(chunk_id).tolist()]
    sel, thr = select_in_chunks(old_log_probs[rows].detach(), valid[rows], ratio, chunk_rows)
    return Selection(rows=rows, selected=sel, count=int(torch.count_nonzero(sel)), threshold=thr)


def row_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each response's scalar advantage ``[B]``, read at its first model token (0 for an empty row).

    Args:
        advantages: ``[B, T]`` float outcome advantages (one value per row, 0 outside the mask).
        response_mask: ``[B, T]`` bool, model tokens.
    """
    first = torch.argmax(response_mask.to(torch.uint8), dim=1)
    return advantages.gather(1, first[:, None]).squeeze(1)


def reweight_advantages(advantages: torch.Tensor, sets: list[tuple[Selection, float]]) -> torch.Tensor:
    """Effective advantage ``A_eff = omega * A``: omega = the set's weight on its tokens, 1 elsewhere.

    Source: STARE steps 5-6. Positions outside the sets keep their advantage bit for bit, so masked
    positions stay exactly 0.

    Args:
        advantages: ``[B, T]`` float.
        sets: ``(selection, weight)`` pairs, e.g. ``[(L+, W), (L-, M)]``; their rows are disjoint.

    Returns:
        A new ``[B, T]`` tensor of the dtype of ``advantages``.
    """
    out = advantages.clone()
    for sel, weight in sets:
        if sel.count == 0:
            continue
        part = advantages[sel.rows]
        out[sel.rows] = torch.where(sel.selected, part * weight, part)
    return out
