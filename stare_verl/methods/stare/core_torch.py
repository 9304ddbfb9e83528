"""STARE's token selection and reweighting on torch tensors, where the batch lives (a GPU): pure torch, no verl.

The same steps, inputs and results as :mod:`stare_verl.methods.stare.core` (STARE steps 3-6, ``shared/specs/stare.md``), with
every ``[B, T]`` array a tensor on one device: nothing is copied to the host but a few scalars (the counts,
the threshold and the entropy sum). Selection is exact: the k-th smallest candidate log-prob comes from a sort
on the device, ties at the threshold go to the earliest tokens in row-major order (a cumulative count over the
tied tokens, no branch), exactly as in :func:`stare_verl.methods.stare.core.select_top_surprisal`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from stare_verl.methods.stare.core import top_count


def kth_smallest(values: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k``-th smallest entry (1-based) of a 1-D tensor, as a 0-dim tensor on its device.

    A full sort on an accelerator (a radix sort there beats a single-slice selection), ``kthvalue`` on the CPU.
    """
    if values.device.type == "cpu":
        return torch.kthvalue(values, k).values
    return torch.sort(values).values[k - 1]


def select_top_surprisal(
    log_probs: torch.Tensor, candidates: torch.Tensor, ratio: float
) -> tuple[torch.Tensor, float | None]:
    """:func:`stare_verl.methods.stare.core.select_top_surprisal` on tensors.

    Args:
        log_probs: ``[R, T]`` float, old log-probs (nats); values off ``candidates`` are ignored.
        candidates: ``[R, T]`` bool, the eligible tokens (n = number of True).
        ratio: P in (0, 1].

    Returns:
        ``(selected, threshold)``: ``[R, T]`` bool tensor with exactly ``ceil(P * n)`` True entries, all within
        ``candidates`` (earliest tied tokens in row-major order win); the smallest selected surprisal (nats), None
        when nothing is selected.
    """
    values = log_probs[candidates]
    n = values.numel()
    k = top_count(ratio, n)
    if k == 0:
        return torch.zeros_like(candidates), None
    if k >= n:
        return candidates.clone(), -float(values.max())
    thr = kth_smallest(values, k)
    below = candidates & (log_probs < thr)
    ties = candidates & (log_probs == thr)
    need = k - below.sum()  # 0-dim tensor: no host round trip
    # the earliest `need` tied tokens in row-major order (all of them when fewer tie)
    rank = ties.reshape(-1).cumsum(0, dtype=torch.int32).reshape(ties.shape)
    return below | (ties & (rank <= need)), -float(thr)


@dataclass(frozen=True)
class TokenMasks:
    """:class:`stare_verl.methods.stare.core.TokenMasks` with a ``valid`` tensor: ``[B, T]`` bool on the batch's device."""

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
    """:func:`stare_verl.methods.stare.core.token_masks` on tensors (one host round trip for the three scalars).

    The entropy sum accumulates in float64 on the device (NumPy's float32 row sums may differ in the last bits).

    Raises:
        ValueError: the three tensors are not 2-D of one shape.
    """
    if response_mask.ndim != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(response_mask.shape)}")
    for name, a in (("old_log_probs", old_log_probs), ("entropys", entropys)):
        if a.shape != response_mask.shape:
            raise ValueError(f"{name} has shape {tuple(a.shape)}, response_mask {tuple(response_mask.shape)}")
    model = response_mask if response_mask.dtype == torch.bool else response_mask > 0
    valid = model & torch.isfinite(old_log_probs) & torch.isfinite(entropys)
    ent_sum = torch.where(valid, entropys, 0).sum(dtype=torch.float64)
    n_model, n_valid, ent = torch.stack([model.sum().double(), valid.sum().double(), ent_sum]).tolist()
    return TokenMasks(valid=valid, n_model=int(n_model), n_valid=int(n_valid), entropy_sum=float(ent))


@dataclass(frozen=True)
class Selection:
    """L+ or L- of one batch: ``selected`` ``[B, T]`` bool tensor (full batch, rows of the other sign all False),
    ``count`` chosen tokens, ``threshold`` the smallest chosen surprisal (nats; mean over chunks), None if empty."""

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
    """:func:`stare_verl.methods.stare.core.select_token_set` on tensors: L+ (``sign=+1``, A > 0) or L- (``sign=-1``, A < 0).

    Args:
        row_advantages: ``[B]`` float, each response's outcome advantage (or anything of its sign).
        old_log_probs: ``[B, T]`` float log-probs (nats). valid: ``[B, T]`` bool.
        ratio: P in (0, 1]. sign: +1 or -1.
        chunk_size: None for whole-batch selection, else sequences per chunk (``ceil(P * n_c)`` per chunk).
    """
    in_set = row_advantages > 0 if sign > 0 else row_advantages < 0
    cand = valid & in_set[:, None]
    b = old_log_probs.shape[0]
    if chunk_size is None or chunk_size >= b:
        sel, thr = select_top_surprisal(old_log_probs, cand, ratio)
    else:
        sel = torch.zeros_like(cand)
        thresholds = []
        for start in range(0, b, chunk_size):
            part = slice(start, start + chunk_size)
            sel[part], t = select_top_surprisal(old_log_probs[part], cand[part], ratio)
            if t is not None:
                thresholds.append(t)
        thr = sum(thresholds) / len(thresholds) if thresholds else None
    return Selection(selected=sel, count=int(sel.sum()), threshold=thr)


def reweight_advantages(advantages: torch.Tensor, sets: list[tuple[Selection, float]]) -> torch.Tensor:
    """``A_eff = omega * A`` (STARE steps 5-6) on tensors: ``A * weight`` on each set's tokens (the weight in
    ``A``'s dtype, as :func:`stare_verl.methods.stare.core.reweight_advantages`), ``A`` bit for bit elsewhere.

    Returns:
        A new ``[B, T]`` tensor of ``advantages``' dtype and device.
    """
    out = advantages
    for sel, weight in sets:
        if sel.count == 0:
            continue
        w = torch.tensor(weight, dtype=advantages.dtype, device=advantages.device)
        out = torch.where(sel.selected, advantages * w, out)
    return out.clone() if out is advantages else out


def covariance_row_stats(
    log_probs: torch.Tensor, valid: torch.Tensor, batch_entropy: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-response sums for the covariance metrics, computed on the device; only ``[B]`` vectors reach the host.

    Returns:
        ``(n_high, s_high, n_valid, s_valid)``: float64 NumPy ``[B]`` arrays: the number and the log-prob sum
        (nats) of each row's valid tokens with surprisal above ``batch_entropy`` (``log p < -H``), and of all its
        valid tokens; the inputs of :func:`stare_verl.methods.stare.core.class_sums`.
    """
    thr = -float(batch_entropy or 0.0)
    high = valid & (log_probs < thr)
    lp64 = log_probs.double()
    stats = (
        torch.stack(
            [
                high.sum(dim=1, dtype=torch.float64),
                torch.where(high, lp64, 0.0).sum(dim=1),
                valid.sum(dim=1, dtype=torch.float64),
                torch.where(valid, lp64, 0.0).sum(dim=1),
            ]
        )
        .cpu()
        .numpy()
    )
    return stats[0], stats[1], stats[2], stats[3]


def reweighted_class_deltas(
    row_advantages: torch.Tensor, log_probs: torch.Tensor, sets: list[tuple[Selection, float]], batch_entropy
) -> tuple[np.ndarray, np.ndarray]:
    """What reweighting adds to the covariance sums' ``adv`` and ``lp_adv`` (``[5]`` float64 NumPy arrays, in
    :data:`stare_verl.methods.stare.core.QUADRANTS` order), as :func:`stare_verl.methods.stare.core.reweighted_covariance_sums` computes it:
    each chosen token adds ``(omega - 1) * A`` (and times its log-prob) to its class. Gathers and class sums run on
    the device."""
    adv = torch.zeros(5, dtype=torch.float64, device=log_probs.device)
    lp_adv = torch.zeros_like(adv)
    thr = -float(batch_entropy or 0.0)
    t = log_probs.shape[1]
    for sel, weight in sets:
        if sel.count == 0 or weight == 1.0:
            continue
        pos = sel.selected.reshape(-1).nonzero().squeeze(1)
        rows = pos // t
        lp_raw = log_probs.reshape(-1)[pos]
        lp = lp_raw.double()
        a = row_advantages[rows]
        delta = (float(weight) - 1.0) * a.double()
        # compared in the log-probs' dtype, as the base sums and the NumPy path do (a float64 compare splits a
        # token at exactly float32(-H) differently)
        cls = torch.where(a > 0, 0, 2) + (lp_raw >= thr).long()
        adv += torch.bincount(cls, weights=delta, minlength=5)
        lp_adv += torch.bincount(cls, weights=delta * lp, minlength=5)
    out = torch.stack([adv, lp_adv]).cpu().numpy()
    return out[0], out[1]
