"""STARE's token selection and reweighting: pure NumPy, no verl import.

Source: STARE (arXiv 2606.19236), "Per training step" steps 3-6 as written down in
``docs/stare.md``. All per-token arrays are ``[B, T]`` (B responses, T response tokens).
``response_mask`` is 1 for tokens the model generated and 0 for padding and for tool/observation
tokens: only mask-1 tokens enter the quantiles, the gate's entropy and the weights.

NumPy rather than torch: verl computes advantages on the driver's CPU, and on a loaded CPU
NumPy's single-threaded boolean compaction and selection are an order of magnitude faster than
torch's (see ``bench/bench_estimator.py``). ``stare_verl.stare`` converts at the boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np


def top_count(p: float, n: int) -> int:
    """Return ``ceil(p * n)`` computed on the decimal value of ``p`` (so ``ceil(0.1 * 30) == 3``, not 4).

    Args:
        p: the selection ratio P in (0, 1].
        n: number of candidate tokens (>= 0).
    """
    return math.ceil(Fraction(repr(float(p))) * int(n))


def select_top_surprisal(
    log_probs: np.ndarray, candidates: np.ndarray, ratio: float
) -> tuple[np.ndarray, float | None]:
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
    values = log_probs[candidates]
    n = values.size
    k = top_count(ratio, n)
    if k == 0:
        return np.zeros_like(candidates), None
    if k >= n:
        return candidates.copy(), -float(values.max())
    thr = np.partition(values, k - 1)[k - 1]  # k-th smallest log-prob = k-th highest surprisal
    selected = candidates & (log_probs < thr)
    need = k - int(np.count_nonzero(selected))
    ties = candidates & (log_probs == thr)
    if int(np.count_nonzero(ties)) > need:
        ties &= (np.cumsum(ties.ravel()) <= need).reshape(ties.shape)
    return selected | ties, -float(thr)


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

    valid: np.ndarray
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


def token_masks(response_mask: np.ndarray, old_log_probs: np.ndarray, entropys: np.ndarray) -> TokenMasks:
    """Find the valid model tokens of a batch and their entropy sum (STARE step 3's H_batch numerator).

    Args:
        response_mask: ``[B, T]`` bool/int/float, 1 (or True) for model tokens, 0 elsewhere.
        old_log_probs: ``[B, T]`` float log-probs (nats). entropys: ``[B, T]`` float entropy (nats).

    The common case (every model token finite) needs two dot products; a NaN/inf in either switches to
    an exact per-token check.

    Raises:
        ValueError: the three arrays are not 2-D of one shape.
    """
    if response_mask.ndim != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(response_mask.shape)}")
    for name, a in (("old_log_probs", old_log_probs), ("entropys", entropys)):
        if a.shape != response_mask.shape:
            raise ValueError(f"{name} has shape {tuple(a.shape)}, response_mask {tuple(response_mask.shape)}")
    model = response_mask if response_mask.dtype == np.bool_ else response_mask > 0
    n_model = int(np.count_nonzero(model))
    weights = model.ravel().astype(entropys.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        ent_sum = np.dot(entropys.ravel(), weights)
        lp_sum = np.dot(old_log_probs.ravel(), weights.astype(old_log_probs.dtype, copy=False))
    if np.isfinite(ent_sum) and np.isfinite(lp_sum):
        return TokenMasks(valid=model, n_model=n_model, n_valid=n_model, entropy_sum=float(ent_sum))
    valid = model & np.isfinite(old_log_probs) & np.isfinite(entropys)
    # same dot over the same terms as the fast path, so both paths give bit-identical sums
    ent_sum = np.dot(np.where(valid, entropys, 0).ravel(), weights)
    return TokenMasks(
        valid=valid, n_model=n_model, n_valid=int(np.count_nonzero(valid)), entropy_sum=float(ent_sum)
    )


@dataclass(frozen=True)
class Selection:
    """L+ or L- of one batch in row-compact form.

    Attributes:
        rows: 1-D int array, the rows (responses) whose advantage has the set's sign, ascending.
        selected: ``[len(rows), T]`` bool, the chosen tokens within those rows.
        count: number of chosen tokens.
        threshold: smallest chosen surprisal (nats; the mean over chunks for chunked selection), None when
            the set is empty.
    """

    rows: np.ndarray
    selected: np.ndarray
    count: int
    threshold: float | None


def select_token_set(
    row_advantages: np.ndarray,
    old_log_probs: np.ndarray,
    valid: np.ndarray,
    ratio: float,
    sign: int,
    chunk_size: int | None = None,
) -> Selection:
    """Pick L+ (``sign=+1``: top-P surprisal among valid tokens with A > 0) or L- (``sign=-1``, A < 0).

    Tokens with A == 0 are never selected. Source: STARE step 4. With ``chunk_size`` the selection is made
    separately within each block of ``chunk_size`` consecutive sequences (``ceil(P * n_c)`` per block), as
    the reference code does per micro-batch.

    Args:
        row_advantages: ``[B]`` float, each response's (outcome) advantage.
        old_log_probs: ``[B, T]`` float log-probs of the sampled tokens under the pre-update policy (nats).
        valid: ``[B, T]`` bool, model tokens with finite log-prob and entropy.
        ratio: P in (0, 1].
        sign: +1 for L+, -1 for L-.
        chunk_size: ``None`` for whole-batch selection, else sequences per chunk.
    """
    rows = np.flatnonzero(row_advantages > 0 if sign > 0 else row_advantages < 0)
    lp, cand = old_log_probs[rows], valid[rows]
    if chunk_size is None or chunk_size >= old_log_probs.shape[0]:
        sel, thr = select_top_surprisal(lp, cand, ratio)
    else:
        sel = np.zeros_like(cand)
        thresholds = []
        chunk_of_row = rows // chunk_size
        for c in np.unique(chunk_of_row):
            part = np.flatnonzero(chunk_of_row == c)
            sel[part], t = select_top_surprisal(lp[part], cand[part], ratio)
            if t is not None:
                thresholds.append(t)
        thr = sum(thresholds) / len(thresholds) if thresholds else None
    return Selection(rows=rows, selected=sel, count=int(np.count_nonzero(sel)), threshold=thr)


def reweight_advantages(advantages: np.ndarray, sets: list[tuple[Selection, float]]) -> np.ndarray:
    """Effective advantage ``A_eff = omega * A``: omega = the set's weight on its tokens, 1 elsewhere.

    Source: STARE steps 5-6. Positions outside the sets keep their advantage bit for bit, so masked
    positions stay exactly 0.

    Args:
        advantages: ``[B, T]`` float.
        sets: ``(selection, weight)`` pairs, e.g. ``[(L+, W), (L-, M)]``; their rows are disjoint.

    Returns:
        A new ``[B, T]`` array of the dtype of ``advantages``.
    """
    out = advantages.copy()
    for sel, weight in sets:
        if sel.count == 0:
            continue
        r, c = np.nonzero(sel.selected)
        rows = sel.rows[r]
        out[rows, c] = advantages[rows, c] * np.asarray(weight, dtype=advantages.dtype)
    return out
