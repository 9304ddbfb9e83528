"""STARE's token selection and reweighting: pure NumPy, no verl import.

Source: STARE (arXiv 2606.19236), "Per training step" steps 3-6 as written down in
``docs/stare.md``. All per-token arrays are ``[B, T]`` (B responses, T response tokens).
``response_mask`` is 1 for tokens the model generated and 0 for padding and for tool/observation
tokens: only mask-1 tokens enter the quantiles, the gate's entropy and the weights.

NumPy rather than torch: verl computes advantages on the driver's CPU, and on a loaded CPU
NumPy's single-threaded boolean compaction and selection are an order of magnitude faster than
torch's (see ``bench/bench_estimator.py``). ``stare_verl.methods.stare.reweight`` converts at the boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache

import numpy as np

from stare_verl.methods.metrics import QUADRANTS


def top_count(p: float, n: int) -> int:
    """Return ``ceil(p * n)`` computed on the decimal value of ``p`` (so ``ceil(0.1 * 30) == 3``, not 4).

    Args:
        p: the selection ratio P in (0, 1].
        n: number of candidate tokens (>= 0).
    """
    return math.ceil(_decimal_fraction(float(p)) * int(n))


@lru_cache(maxsize=64)
def _decimal_fraction(p: float) -> Fraction:
    """``p``'s shortest decimal representation as an exact fraction (a run uses one or two ratios: kept)."""
    return Fraction(repr(p))


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
    n = int(np.count_nonzero(candidates))
    k = top_count(ratio, n)
    if k == 0:
        return np.zeros_like(candidates), None
    if k >= n:
        return candidates.copy(), -float(log_probs[candidates].max())
    thr, n_at_most = _kth_smallest_candidate(log_probs, candidates, n, k)
    # when exactly k candidates are <= thr the set is those (one compare over [R, T], no tie pass)
    if n_at_most == k:
        with np.errstate(invalid="ignore"):  # NaN off the candidates compares False
            selected = np.less_equal(log_probs, thr)
        selected &= candidates
        return selected, -float(thr)
    with np.errstate(invalid="ignore"):
        selected = np.less(log_probs, thr)
        selected &= candidates
        need = k - int(np.count_nonzero(selected))
        ties = np.equal(log_probs, thr)
    ties &= candidates
    tied = np.flatnonzero(ties)
    if tied.size > need:  # the earliest `need` tied tokens in row-major order win
        ties.flat[tied[need:]] = False  # (.flat writes into any layout; reshape(-1) of a non-C-ordered array copies)
    selected |= ties
    return selected, -float(thr)


SAMPLED_SELECTION_MIN = 1 << 16
"""Below this many candidates :func:`_kth_smallest_candidate` partitions all of them (a sample would not pay)."""
SAMPLE_SIZE = 1 << 14
"""About how many positions the strided sample of :func:`_kth_smallest_candidate` reads."""


def _kth_smallest_candidate(log_probs: np.ndarray, candidates: np.ndarray, n: int, k: int) -> tuple[float, int]:
    """``(thr, n_at_most)``: the ``k``-th smallest (1-based, ``1 <= k < n``) of the ``n`` candidate log-probs, exact
    (a scalar of the log-probs' dtype), and how many candidates are ``<= thr`` (``k`` plus the ties beyond it).

    With many candidates a strided sample of the positions gives a bound that lies, with a wide margin (five
    standard errors of the sample quantile), above the ``k``-th smallest; only the candidates at or below it are
    gathered and partitioned (about a tenth of them for P = 0.1, instead of all). The sample decides only the
    cost: when fewer than ``k`` candidates lie at or below its bound (a sample that misrepresents the batch) all
    candidates are partitioned, so the result never depends on it.
    """
    if n >= SAMPLED_SELECTION_MIN:
        flat_lp, flat_cand = log_probs.reshape(-1), candidates.reshape(-1)
        stride = max(flat_lp.size // SAMPLE_SIZE, 1)
        sample = flat_lp[stride // 2 :: stride][flat_cand[stride // 2 :: stride]]  # a copy: partitioned below
        m = sample.size
        if m >= 1024:
            q = k / n
            j = math.ceil((q + 5.0 * math.sqrt(q * (1.0 - q) / m) + 2.0 / m) * m)
            if j < m:
                sample.partition(j)
                with np.errstate(invalid="ignore"):  # NaN off the candidates compares False
                    below = np.less_equal(log_probs, sample[j])
                below &= candidates
                sub = log_probs[below]
                if sub.size >= k:
                    return _kth_of(sub, k)
    return _kth_of(log_probs[candidates], k)


def _kth_of(values: np.ndarray, k: int) -> tuple[float, int]:
    """The k-th smallest of a 1-D array the caller owns (partitioned in place) and the count of values <= it."""
    values.partition(k - 1)
    thr = values[k - 1]
    # after the partition values[:k] <= thr <= values[k:]: those beyond the k-th that are <= thr equal it
    return thr, k + int(np.count_nonzero(values[k:] == thr))


@dataclass(frozen=True)
class TokenMasks:
    """Token masks of one batch, and the per-response sums the covariance metrics are built from.

    Attributes:
        valid: ``[B, T]`` bool, model tokens (response_mask == 1) whose old log-prob and entropy are finite;
            only these are ever selected or enter the gate's entropy.
        n_model: number of model tokens.
        n_valid: number of valid tokens.
        entropy_sum: sum of the entropy over valid tokens (nats).
        row_count: ``[B]`` int64, valid tokens per response.
        row_log_prob_sum: ``[B]`` float64, sum of the old log-probs over each response's valid tokens (nats).
        row_high_count: ``[B]`` float64, valid tokens per response with surprisal above :attr:`batch_entropy`
            (``log_prob < -H_batch`` in the log-probs' dtype; 0 when there is no valid token).
        row_high_log_prob_sum: ``[B]`` float64, the sum of those tokens' old log-probs (nats).
    """

    valid: np.ndarray
    n_model: int
    n_valid: int
    entropy_sum: float
    row_count: np.ndarray
    row_log_prob_sum: np.ndarray
    row_high_count: np.ndarray
    row_high_log_prob_sum: np.ndarray

    @property
    def n_nonfinite(self) -> int:
        """Model tokens dropped because their log-prob or entropy was NaN or +-inf."""
        return self.n_model - self.n_valid

    @property
    def batch_entropy(self) -> float | None:
        """The gate's H_batch: token-mean entropy over valid tokens (nats); None when there is none."""
        return self.entropy_sum / self.n_valid if self.n_valid else None


def _row_sum(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``[B]`` float64 row sums of ``values`` over the True entries of the bool ``where`` (both ``[B, T]``).

    One einsum pass (no BLAS, whose threads stall on a loaded CPU). A NaN/inf anywhere in a row, selected or
    not, makes that row's sum NaN: callers use it as the finiteness check of the fast path.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        return np.einsum("ij,ij->i", values, where).astype(np.float64)


def _row_count(where: np.ndarray) -> np.ndarray:
    """``[B]`` int64 number of True entries per row of a ``[B, T]`` bool array (a byte sum: several times
    faster than ``np.count_nonzero(axis=1)``)."""
    return np.add.reduce(np.ascontiguousarray(where).view(np.uint8), axis=1, dtype=np.int32).astype(np.int64)


def token_masks(response_mask: np.ndarray, old_log_probs: np.ndarray, entropys: np.ndarray) -> TokenMasks:
    """Find the valid model tokens of a batch, their entropy sum (STARE step 3's H_batch numerator) and the
    per-row counts and log-prob sums of the covariance metrics (all valid tokens, and those with surprisal above
    H_batch).

    Args:
        response_mask: ``[B, T]`` bool/int/float, 1 (or True) for model tokens, 0 elsewhere.
        old_log_probs: ``[B, T]`` float log-probs (nats). entropys: ``[B, T]`` float entropy (nats).

    The common case (every entry finite) makes two passes: an entropy row sum, then one compiled pass over the
    log-probs (:func:`stare_verl.methods.stare.kernels.log_prob_row_stats`: its row totals are also the finiteness check, so
    the metrics' sums cost no pass of their own). A NaN/inf anywhere switches to an exact per-token check.

    Raises:
        ValueError: the three arrays are not 2-D of one shape.
    """
    from stare_verl.methods.stare.kernels import (
        log_prob_row_stats,  # numba: imported by the processes that need it
    )

    if response_mask.ndim != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(response_mask.shape)}")
    for name, a in (("old_log_probs", old_log_probs), ("entropys", entropys)):
        if a.shape != response_mask.shape:
            raise ValueError(f"{name} has shape {tuple(a.shape)}, response_mask {tuple(response_mask.shape)}")
    model = response_mask if response_mask.dtype == np.bool_ else response_mask > 0
    row_model = _row_count(model)
    n_model = int(row_model.sum())
    # row sums, then a float64 total: a float32 dot over the whole batch drifts by ~1e-7 relative at 4 M tokens,
    # enough to put the gate on the other side of the target than the torch path's float64 sum
    with np.errstate(invalid="ignore", over="ignore"):
        ent_sum = _row_sum(entropys, model).sum()
    if np.isfinite(ent_sum):
        threshold = -(float(ent_sum) / n_model if n_model else 0.0)  # high surprisal: log p < -H_batch
        n_hi, s_hi, row_lp = log_prob_row_stats(old_log_probs, model, threshold)
        if np.isfinite(row_lp).all():
            return TokenMasks(model, n_model, n_model, float(ent_sum), row_model, row_lp, n_hi, s_hi)
    valid = model & np.isfinite(old_log_probs) & np.isfinite(entropys)
    # the same sums over the same terms as the fast path, so both paths give bit-identical sums
    ent_sum = _row_sum(np.where(valid, entropys, 0), model).sum()
    row_count = _row_count(valid)
    n_valid = int(row_count.sum())
    threshold = -(float(ent_sum) / n_valid if n_valid else 0.0)
    n_hi, s_hi, row_lp = log_prob_row_stats(np.where(valid, old_log_probs, 0), valid, threshold)
    return TokenMasks(valid, n_model, n_valid, float(ent_sum), row_count, row_lp, n_hi, s_hi)


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

    @cached_property
    def positions(self) -> np.ndarray:
        """``[count]`` int64 flat indices ``row * T + col`` of the chosen tokens in the full ``[B, T]`` batch,
        ascending (row-major). One 1-D scan of ``selected``: far cheaper than a 2-D ``np.nonzero``."""
        t = self.selected.shape[1]
        flat = np.flatnonzero(self.selected)
        return self.rows[flat // t].astype(np.int64, copy=False) * t + flat % t

    @property
    def coords(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, cols)``: 1-D int64 arrays, the batch coordinates of the chosen tokens (from :attr:`positions`)."""
        t = self.selected.shape[1]
        return self.positions // t, self.positions % t


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


def reweight_advantages(
    advantages: np.ndarray, sets: list[tuple[Selection, float]], inplace: bool = False
) -> np.ndarray:
    """Effective advantage ``A_eff = omega * A``: omega = the set's weight on its tokens, 1 elsewhere.

    Source: STARE steps 5-6. Positions outside the sets keep their advantage bit for bit, so masked
    positions stay exactly 0.

    Args:
        advantages: ``[B, T]`` float.
        sets: ``(selection, weight)`` pairs, e.g. ``[(L+, W), (L-, M)]``; their rows are disjoint.
        inplace: write into ``advantages`` (the caller owns it) instead of a copy: saves a ``[B, T]`` copy.

    Returns:
        ``[B, T]`` array of the dtype of ``advantages``: a new one, or ``advantages`` itself with ``inplace``.
    """
    out = advantages if inplace else advantages.copy()
    # row-major positions: a flat view where the array is C-ordered, else .flat, which writes into any layout
    # (reshape(-1) of a column-major array is a copy, and writes into it would be lost)
    flat_out, flat_in = (a.reshape(-1) if a.flags.c_contiguous else a.flat for a in (out, advantages))
    for sel, weight in sets:
        if sel.count == 0:
            continue
        pos = sel.positions
        flat_out[pos] = flat_in[pos] * np.asarray(weight, dtype=advantages.dtype)
    return out


@dataclass(frozen=True)
class CovarianceSums:
    """Sufficient statistics of Cov(log pi, A) over valid model tokens, per token class (see :data:`stare_verl.methods.metrics.QUADRANTS`).

    Attributes (each a ``[5]`` float64 array in ``QUADRANTS`` order):
        n: number of tokens. lp: sum of log-probs (nats). adv: sum of advantages. lp_adv: sum of log-prob x
            advantage.
    """

    n: np.ndarray
    lp: np.ndarray
    adv: np.ndarray
    lp_adv: np.ndarray

    def terms(self) -> tuple[float, dict[str, float]]:
        """``(cov, contributions)``: the token-level covariance over valid model tokens (nats x advantage units)

            ``Cov(log pi, A) = (1/N) sum_t (lp_t - mean lp)(A_t - mean A)``

        and each class's share ``(1/N) sum_{t in class} (lp_t - mean lp)(A_t - mean A)``, centred by the batch
        means, so the five contributions sum to ``cov``. 0.0 everywhere when there is no valid token.

        Source: Cui et al. 2025 (arXiv 2505.22617), the entropy change of a softmax policy under one policy-
        gradient step, ``H(t+1) - H(t) ~ -eta * Cov(log pi, A)``: a positive covariance (confident tokens
        rewarded, rare tokens penalised) lowers the entropy, a negative one raises it.
        """
        total = float(self.n.sum())
        if total == 0:
            return 0.0, dict.fromkeys(QUADRANTS, 0.0)
        m_lp, m_adv = self.lp.sum() / total, self.adv.sum() / total
        parts = (self.lp_adv - m_adv * self.lp - m_lp * self.adv + self.n * m_lp * m_adv) / total
        return float(parts.sum()), {q: float(v) for q, v in zip(QUADRANTS, parts, strict=True)}


def covariance_sums(row_advantages: np.ndarray, masks: TokenMasks) -> CovarianceSums:
    """Per-class sums for Cov(log pi, A) of outcome advantages (constant along each response's model tokens).

    Args:
        row_advantages: ``[B]`` float, each response's advantage (the value on its model tokens).
        masks: the batch's :class:`TokenMasks`: per response, the number and log-prob sum of its valid tokens,
            all and those with surprisal above the batch entropy (the split between ``high`` and ``low``).

    Returns:
        :class:`CovarianceSums` (float64), from ``[B]``-sized sums only (no pass over ``[B, T]``).
    """
    return class_sums(
        row_advantages, masks.row_high_count, masks.row_high_log_prob_sum, masks.row_count.astype(np.float64),
        masks.row_log_prob_sum,
    )  # fmt: skip


def class_sums(
    row_advantages: np.ndarray, n_hi: np.ndarray, s_hi: np.ndarray, n_all: np.ndarray, s_all: np.ndarray
) -> CovarianceSums:
    """:class:`CovarianceSums` from per-response sums (all ``[B]``): ``n_hi`` / ``s_hi`` the number and log-prob sum
    (nats) of a row's valid tokens with surprisal above the batch entropy, ``n_all`` / ``s_all`` those of all its
    valid tokens (float64). Shared by the NumPy and the torch path (which computes the row sums on the device)."""
    a = row_advantages.astype(np.float64)
    n, s = np.zeros(5), np.zeros(5)
    sa, sla = np.zeros(5), np.zeros(5)
    for k, rows in enumerate((a > 0, a < 0)):
        for j, (cnt, tot) in enumerate(((n_hi, s_hi), (n_all - n_hi, s_all - s_hi))):
            q = 2 * k + j
            n[q], s[q] = cnt[rows].sum(), tot[rows].sum()
            sa[q], sla[q] = (a * cnt)[rows].sum(), (a * tot)[rows].sum()
    zero = a == 0
    n[4], s[4] = n_all[zero].sum(), s_all[zero].sum()
    return CovarianceSums(n=n, lp=s, adv=sa, lp_adv=sla)


def reweighted_covariance_sums(
    base: CovarianceSums,
    row_advantages: np.ndarray,
    log_probs: np.ndarray,
    sets: list[tuple[Selection, float]],
    batch_entropy: float | None,
) -> CovarianceSums:
    """The sums of :func:`covariance_sums` for the effective advantage ``A_eff = omega * A`` (STARE step 6).

    Only the reweighted tokens change: each adds ``(omega - 1) * A`` (and times its log-prob) to its class.
    With no set (gate off) or omega == 1 the result equals ``base``.

    Args:
        base: sums of the GRPO advantage. row_advantages, log_probs, batch_entropy: as in
            :func:`covariance_sums`. sets: ``(selection, weight)`` pairs as in :func:`reweight_advantages`.
    """
    adv, lp_adv = base.adv.copy(), base.lp_adv.copy()
    thr = -float(batch_entropy or 0.0)
    flat = np.ascontiguousarray(log_probs).reshape(-1)
    t = log_probs.shape[1]
    for sel, weight in sets:
        if sel.count == 0 or weight == 1.0:
            continue
        pos = sel.positions  # ascending: each row's chosen tokens are one contiguous segment, rows in order
        lp = flat[pos]
        starts = np.searchsorted(pos, sel.rows.astype(np.int64) * t)
        counts = np.diff(starts, append=pos.size)
        chosen = counts > 0  # reduceat needs non-empty segments
        starts, counts = starts[chosen], counts[chosen].astype(np.float64)
        a = row_advantages[sel.rows[chosen]].astype(np.float64)
        delta = (float(weight) - 1.0) * a  # what each chosen token adds to its advantage, per row
        row_lp = np.add.reduceat(lp, starts, dtype=np.float64)
        if lp.max() < thr:  # every chosen token is high-surprisal (the usual case: L+/L- are the top-P)
            n_hi, s_hi = counts, row_lp
        else:
            high = lp < thr
            n_hi = np.add.reduceat(high, starts, dtype=np.float64)
            s_hi = np.add.reduceat(np.where(high, lp, 0), starts, dtype=np.float64)
        # a set's rows share the advantage's sign (L+: A > 0, L- : A < 0); split anyway, it is [rows]-sized
        # (einsum, not `@`: BLAS threads stall on a loaded CPU, see _row_sum)
        for q, part in ((0, a > 0), (2, a < 0)):
            if not part.any():
                continue
            d = delta[part]
            adv[q] += float(np.einsum("i,i->", d, n_hi[part]))
            adv[q + 1] += float(np.einsum("i,i->", d, counts[part] - n_hi[part]))
            lp_adv[q] += float(np.einsum("i,i->", d, s_hi[part]))
            lp_adv[q + 1] += float(np.einsum("i,i->", d, row_lp[part] - s_hi[part]))
    return CovarianceSums(n=base.n, lp=base.lp, adv=adv, lp_adv=lp_adv)
