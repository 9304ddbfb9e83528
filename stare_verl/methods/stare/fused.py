"""STARE steps 3-6 on CPU arrays in two compiled passes over ``[B, T]`` (whole-batch scope).

The same results as the step-by-step NumPy path (:func:`stare_verl.methods.stare.core.token_masks`,
:func:`~stare_verl.methods.stare.core.select_token_set`, :func:`~stare_verl.methods.stare.core.reweight_advantages`
and the covariance sums), without its ``[B, T]`` temporaries: pass A finds where each row's model tokens end,
counts the model and valid tokens and sums their entropy and log-probs, sums the candidates below a window around the
expected top-P threshold (taken from a sample of the batch) and copies those inside it; the exact threshold is the k-th
smallest of those few values, and the chosen tokens' sums follow from the window's; pass B sums the covariance
metrics' high-surprisal tokens and reweights the chosen ones.
The window decides only the cost: when it misses the k-th smallest (a sample that misrepresents the batch) pass A
runs again with a window that holds every candidate. Both passes run over ranges of rows that threads take one at a
time (:func:`_in_row_ranges`).

Two entry points: :func:`fused_reweight` takes the ``[B, T]`` GRPO advantages; :func:`fused_reweight_rows` takes
them per response (``[B]``, the advantages being ``row[:, None] * mask``), and its pass B writes each row of the
effective advantages whole, so the ``[B, T]`` GRPO advantages are never materialised (what
:func:`stare_verl.methods.stare.method.compute_stare_advantage` uses on CPU tensors).

Numba (``stare_verl.methods.stare.kernels``) is imported with this module: import it only where an advantage is
computed.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from stare_verl.methods.stare import kernels
from stare_verl.methods.stare.core import (
    SAMPLE_SIZE,
    SAMPLED_SELECTION_MIN,
    CovarianceSums,
    class_sums,
    top_count,
)

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class SetSummary:
    """What the metrics need of L+ or L-: ``count`` chosen tokens, ``threshold`` their smallest surprisal (nats;
    None when empty), ``above`` how many of them have surprisal above their own state's entropy."""

    count: int
    threshold: float | None
    above: int


@dataclass(frozen=True)
class FusedStep:
    """The outcome of :func:`fused_reweight`.

    Attributes:
        n_model: model tokens. n_valid: those with finite log-prob and entropy.
        batch_entropy: token-mean entropy over valid tokens (nats), None when there is none.
        sets: ``[L+, L-]`` summaries (L- None for O1, both None with the gate off).
        cov_base, cov_eff: covariance sums of the GRPO and the effective advantage.
    """

    n_model: int
    n_valid: int
    batch_entropy: float | None
    sets: list[SetSummary | None]
    cov_base: CovarianceSums
    cov_eff: CovarianceSums

    @property
    def n_nonfinite(self) -> int:
        """Model tokens left out because their log-prob or entropy was NaN or +-inf."""
        return self.n_model - self.n_valid


def supports(advantages: np.ndarray, log_probs: np.ndarray, entropys: np.ndarray, mask: np.ndarray) -> bool:
    """Whether :func:`fused_reweight` (``[B, T]`` advantages) or :func:`fused_reweight_rows` (``[B]`` per-response
    advantages) takes these arrays: 2-D log-probs, entropies and mask of one shape ``[B, T]``, advantages of that
    shape or ``[B]``; float32/float64 advantages, log-probs and entropies; a bool or real-number mask."""
    shape = log_probs.shape
    if log_probs.ndim != 2 or entropys.shape != shape or mask.shape != shape:
        return False
    if advantages.shape not in (shape, shape[:1]):
        return False
    if any(a.dtype not in FLOAT_DTYPES for a in (advantages, log_probs, entropys)):
        return False
    return mask.dtype == np.bool_ or np.issubdtype(mask.dtype, np.integer) or np.issubdtype(mask.dtype, np.floating)


def fused_reweight(
    advantages: np.ndarray,
    mask: np.ndarray,
    log_probs: np.ndarray,
    entropys: np.ndarray,
    decide,
    ratio: float,
    variant: str,
    inplace: bool,
) -> tuple[np.ndarray | None, FusedStep]:
    """STARE steps 3-6 for whole-batch scope: ``omega * advantages`` and what the metrics need.

    Args:
        advantages: ``[B, T]`` float32/float64 GRPO advantages, constant along each row's model tokens (each row's
            advantage is read at its first model token).
        mask: ``[B, T]`` bool or real numbers; a token is a model token when ``mask > 0``.
        log_probs, entropys: ``[B, T]`` float32/float64 old log-probs and entropies (nats); a model token whose
            value is NaN/inf in either is left out of the entropy, the selection and the covariance sums.
        decide: called once with the batch entropy (nats, or None): returns ``(gate_on, w, m)``.
        ratio: P in (0, 1]. variant: ``"O1"`` (L+ only) or ``"C2"`` (L+ and L-).
        inplace: write into ``advantages`` (only the chosen tokens are written) instead of a copy.

    Returns:
        ``(effective, step)``: the ``[B, T]`` effective advantages (``advantages`` itself with ``inplace``; None with
        the gate off: nothing is reweighted) and :class:`FusedStep`.

    Raises:
        ValueError: arrays :func:`supports` does not take (or ``[B]`` advantages).
    """
    if advantages.ndim != 2 or not supports(advantages, log_probs, entropys, mask):
        raise ValueError(
            f"fused_reweight takes [B, T] float32/float64 arrays of one shape, got advantages {advantages.shape} "
            f"{advantages.dtype}, mask {mask.shape} {mask.dtype}, log_probs {log_probs.shape} {log_probs.dtype}, "
            f"entropys {entropys.shape} {entropys.dtype}"
        )
    if mask.dtype == np.bool_:
        mask = mask.view(np.uint8)
    first = kernels.first_model(mask)
    b, t = log_probs.shape
    if t == 0:  # empty responses: no model token, every row's advantage is 0
        row_adv = np.zeros(b, dtype=advantages.dtype)
    else:  # outcome advantages are constant along a row's model tokens: read each row at its first
        row_adv = np.where(first >= 0, advantages[np.arange(b), np.maximum(first, 0)], 0).astype(advantages.dtype)

    def output(gate_on: bool) -> np.ndarray | None:
        return (advantages if inplace else advantages.copy()) if gate_on else None

    return _reweight(row_adv, mask, log_probs, entropys, first, decide, ratio, variant, output, advantages)


def fused_reweight_rows(
    row_advantages: np.ndarray,
    mask: np.ndarray,
    log_probs: np.ndarray,
    entropys: np.ndarray,
    decide,
    ratio: float,
    variant: str,
) -> tuple[np.ndarray, FusedStep]:
    """:func:`fused_reweight` of the advantages ``row_advantages[:, None] * mask`` without materialising them: pass B
    writes the effective advantages whole, each row once.

    Args:
        row_advantages: ``[B]`` float32/float64 per-response GRPO advantages, in the dtype of the ``[B, T]``
            advantages they stand for (verl's ``scalars.unsqueeze(-1) * response_mask``: each entry is
            ``row_advantages[i] * mask[i, j]`` computed in that dtype).
        mask, log_probs, entropys, decide, ratio, variant: as for :func:`fused_reweight`.

    Returns:
        ``(effective, step)``: a new ``[B, T]`` array of ``row_advantages``' dtype, ``omega * row_advantages[:, None]
        * mask`` (the GRPO advantages where the gate is off: omega is 1), and :class:`FusedStep`.

    Raises:
        ValueError: arrays :func:`supports` does not take (or ``[B, T]`` advantages).
    """
    if row_advantages.ndim != 1 or not supports(row_advantages, log_probs, entropys, mask):
        raise ValueError(
            f"fused_reweight_rows takes [B] float32/float64 row advantages and [B, T] arrays of one shape, got "
            f"row_advantages {row_advantages.shape} {row_advantages.dtype}, mask {mask.shape} {mask.dtype}, log_probs "
            f"{log_probs.shape} {log_probs.dtype}, entropys {entropys.shape} {entropys.dtype}"
        )
    if mask.dtype == np.bool_:
        mask = mask.view(np.uint8)
    first = kernels.first_model(mask)
    b, t = log_probs.shape
    dtype = row_advantages.dtype
    if t == 0:
        row_adv = np.zeros(b, dtype=dtype)
    else:  # the advantage at each row's first model token, as the [B, T] advantages hold it
        at_first = mask[np.arange(b), np.maximum(first, 0)].astype(dtype)
        row_adv = np.where(first >= 0, row_advantages * at_first, 0).astype(dtype)
    out = np.empty((b, t), dtype=dtype)
    _, step = _reweight(row_adv, mask, log_probs, entropys, first, decide, ratio, variant, lambda _: out, None,
                        row_advantages)  # fmt: skip
    return out, step


def _reweight(row_adv, mask, log_probs, entropys, first, decide, ratio, variant, output, advantages,
              row_advantages=None) -> tuple[np.ndarray | None, FusedStep]:  # fmt: skip
    """The two passes of :func:`fused_reweight` (``advantages`` given: the chosen tokens rescaled in
    ``output(gate_on)``, None with the gate off) and :func:`fused_reweight_rows` (``row_advantages`` given: every
    entry of ``output(gate_on)`` written). ``row_adv``: ``[B]``, each row's advantage at its first model token;
    ``mask``: not bool (a bool mask is passed as its uint8 view); ``first``: from :func:`kernels.first_model`."""
    b, t = log_probs.shape
    sets = [np.flatnonzero(row_adv > 0)] + ([np.flatnonzero(row_adv < 0)] if variant == "C2" else [])
    row_set = np.full(b, -1, dtype=np.int64)
    for s, rows in enumerate(sets):
        row_set[rows] = s
    lp_type = log_probs.dtype.type
    lo, hi = _windows(log_probs, mask, row_set, len(sets), ratio)
    end, n_model, n_valid, below, below_above, n_window = (np.empty(b, dtype=np.int64) for _ in range(6))
    ent_sum, lp_sum, below_sum = np.empty(b), np.empty(b), np.empty(b)
    window, window_ent = _empty((b, t), log_probs.dtype), _empty((b, t), entropys.dtype)
    a_args = (log_probs, entropys, mask, first, row_set)
    a_out = (window, window_ent, end, n_model, n_valid, ent_sum, lp_sum, below, below_sum, below_above, n_window)
    _pass_a(*a_args, lo, hi, *a_out)
    n_valid_all = int(n_valid.sum())
    total_ent = float(ent_sum.sum())
    batch_entropy = total_ent / n_valid_all if n_valid_all else None
    gate_on, w, m = decide(batch_entropy)
    high_thr = lp_type(-(total_ent / n_valid_all if n_valid_all else 0.0))

    thr = np.zeros(2, dtype=log_probs.dtype)
    allow = np.full(b, -1, dtype=np.int64)
    ks = []
    if gate_on:
        ks = [top_count(ratio, int(n_valid[rows].sum())) for rows in sets]
        missed = [
            k > 0 and not (below[rows].sum() < k <= below[rows].sum() + n_window[rows].sum())
            for k, rows in zip(ks, sets, strict=True)
        ]
        if any(missed):  # the sampled window does not hold the k-th smallest: every candidate into the window
            lo, hi = np.full(2, -np.inf, dtype=log_probs.dtype), np.full(2, np.inf, dtype=log_probs.dtype)
            _pass_a(*a_args, lo, hi, *a_out)
        for s, (k, rows) in enumerate(zip(ks, sets, strict=True)):
            if k == 0:
                row_set[rows] = -1
                continue
            thr[s] = _threshold(window, n_window, below, rows, k, allow)
    else:
        row_set[:] = -1
    out = output(gate_on)
    weight = np.array([w, m], dtype=row_adv.dtype)
    n_high, s_high = np.empty(b), np.empty(b)
    _in_row_ranges(kernels.pass_b, log_probs.shape,
                   log_probs, entropys, mask, end, n_model, n_valid, high_thr, row_set, thr, weight, allow,
                   row_advantages,
                   advantages if out is None else out,  # gate off, [B, T] advantages: no row set, nothing written
                   n_high, s_high)  # fmt: skip
    n_sel, n_above = np.zeros(b, dtype=np.int64), np.zeros(b, dtype=np.int64)
    s_sel = np.zeros(b)
    if gate_on:
        widest = int(n_window.max(initial=0))  # ranges sized by the window tokens a row holds (few), not by T
        _in_row_ranges(kernels.chosen_sums, (b, widest), window, window_ent, n_window, below, below_sum, below_above,
                       row_set, thr, allow, n_sel, s_sel, n_above)  # fmt: skip

    cov_base = class_sums(row_adv, n_high, s_high, n_valid.astype(np.float64), lp_sum)
    adv_d, lp_adv_d = cov_base.adv.copy(), cov_base.lp_adv.copy()
    summaries: list[SetSummary | None] = [None, None]
    if gate_on:
        for s, rows in enumerate(sets):
            k = ks[s]
            summaries[s] = SetSummary(k, -float(thr[s]) if k else None, int(n_above[rows].sum()))
            weight_s = float(w if s == 0 else m)
            if k == 0 or weight_s == 1.0:
                continue
            a = row_adv[rows].astype(np.float64)
            delta = (weight_s - 1.0) * a  # what each chosen token adds to its advantage
            cnt, lp_s = n_sel[rows].astype(np.float64), s_sel[rows]
            # the chosen tokens of high surprisal: all of them when the threshold lies below the high-surprisal
            # bound (v <= thr < high_thr), else the row's high tokens (v < high_thr <= thr: all chosen; a tie at
            # thr is not high)
            nh, lp_h = (cnt, lp_s) if thr[s] < high_thr else (n_high[rows], s_high[rows])
            for q, part in ((0, a > 0), (2, a < 0)):
                d = delta[part]
                adv_d[q] += float(np.dot(d, nh[part]))
                adv_d[q + 1] += float(np.dot(d, cnt[part] - nh[part]))
                lp_adv_d[q] += float(np.dot(d, lp_h[part]))
                lp_adv_d[q + 1] += float(np.dot(d, lp_s[part] - lp_h[part]))
    cov_eff = CovarianceSums(n=cov_base.n, lp=cov_base.lp, adv=adv_d, lp_adv=lp_adv_d)
    return out, FusedStep(int(n_model.sum()), n_valid_all, batch_entropy, summaries, cov_base, cov_eff)


def _empty(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """An uninitialised ``shape`` array of ``dtype`` (float32/float64) whose memory torch's CPU allocator gives.

    Not ``np.empty``: NumPy advises the kernel to back arrays of 4 MiB or more with transparent huge pages (where
    THP is in ``madvise`` mode, the usual default), so the first write anywhere in a 2 MiB page zero-fills all of
    it. Pass A writes a few tokens at the start of each row of its ``[B, T]`` window scratch: with huge pages that
    zero-fills the whole scratch on every call (measured in ``docs/results/estimator-speed.md``). torch allocates
    with ``malloc`` and no advice: only the 4 KiB pages written are faulted in, and freed blocks are reused.
    """
    import torch

    return torch.empty(shape, dtype=torch.float64 if np.dtype(dtype) == np.float64 else torch.float32).numpy()


def _pass_a(log_probs, entropys, mask, first, row_set, lo, hi, *out) -> None:
    """:func:`kernels.pass_a` over every row (see :func:`_in_row_ranges`)."""
    _in_row_ranges(kernels.pass_a, log_probs.shape, log_probs, entropys, mask, first, row_set, lo, hi, *out)


CHUNK_TOKENS = 1 << 17
"""About how many ``[B, T]`` entries one row range of :func:`_in_row_ranges` covers."""

_CPUS = os.cpu_count() or 1
"""The machine's CPUs, read once (``os.cpu_count`` reads ``/sys`` on every call)."""

_pool: tuple[int, int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _in_row_ranges(kernel, shape: tuple[int, int], *args) -> None:
    """Run ``kernel(r0, r1, *args)`` (a compiled kernel that releases the GIL) over consecutive row ranges covering
    the ``shape = (B, T)`` batch (``T``: about how many entries the kernel visits per row, which sizes the ranges), on
    as many threads as torch's intra-op thread count (the CPU budget the driver gives its tensor work).

    The ranges are handed out one at a time to whichever thread asks next, the calling thread included: on a loaded
    machine a helper thread that gets no CPU takes no range (and is called off once the caller has run every range),
    instead of holding up the pass with a fixed share as a static split would. The kernels write per-row results
    only, so the outcome does not depend on which thread runs which range.
    """
    b, t = shape
    threads = max(1, min(_torch_threads(), _CPUS))
    rows_per = max(1, CHUNK_TOKENS // max(t, 1))
    n_chunks = -(-b // rows_per) if b else 0
    if threads == 1 or n_chunks <= 1:
        kernel(0, b, *args)
        return
    lock = threading.Lock()
    taken = [0]

    def work() -> None:
        while True:
            with lock:
                c = taken[0]
                taken[0] += 1
            if c >= n_chunks:
                return
            kernel(c * rows_per, min(b, (c + 1) * rows_per), *args)

    helpers = [_executor(threads - 1).submit(work) for _ in range(min(threads, n_chunks) - 1)]
    work()
    for f in helpers:
        if not f.cancel():  # started: let it finish its range (a helper not yet started has nothing left to do)
            f.result()


def _executor(workers: int) -> ThreadPoolExecutor:
    """The module's helper threads (at least ``workers``), created once per process (a forked child makes its own)."""
    global _pool
    with _pool_lock:
        pid = os.getpid()
        if _pool is None or _pool[0] != pid or _pool[1] < workers:
            if _pool is not None and _pool[0] == pid:
                _pool[2].shutdown(wait=False)
            _pool = (pid, workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stare-rows"))
        return _pool[2]


def _torch_threads() -> int:
    """torch's intra-op thread count (the budget the driver gives its CPU work); 1 without torch."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 1
    return torch.get_num_threads()


def _windows(log_probs, mask, row_set, n_sets: int, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)``: ``[2]`` bounds (log-probs' dtype) of each set's window, from a sample of the batch in blocks of
    adjacent positions (:func:`kernels.sample_candidates`).

    The bounds lie five standard errors of the sample quantile (plus two sample steps) on either side of the
    ratio-quantile of the sampled candidates (standard errors of independent draws: adjacent tokens' surprisals
    correlate, so the blocks hold fewer independent draws and the margin is somewhat less than five of their
    errors; a window that misses only costs pass A a second run); with fewer than 1024 sampled candidates, or a batch
    too small for a sample to pay (:data:`~stare_verl.methods.stare.core.SAMPLED_SELECTION_MIN`), the window holds
    every candidate.
    """
    dtype = log_probs.dtype
    lo, hi = np.full(2, -np.inf, dtype=dtype), np.full(2, np.inf, dtype=dtype)
    size = log_probs.size
    if size == 0:
        return lo, hi
    stride = max(size // SAMPLE_SIZE, 1)
    samples, counts = kernels.sample_candidates(log_probs, mask, row_set, n_sets, stride)
    for s in range(n_sets):
        sample = samples[s, : counts[s]]
        m = sample.size
        if m < 1024 or m * stride < SAMPLED_SELECTION_MIN:
            continue
        q = min(float(ratio), 1.0)
        margin = 5.0 * math.sqrt(q * (1.0 - q) / m) + 2.0 / m
        j_lo, j_hi = math.floor((q - margin) * m) - 1, math.ceil((q + margin) * m)
        want = [j for j in (j_lo, j_hi) if 0 <= j < m]
        if want:
            sample.partition(want)
        if 0 <= j_lo < m:
            lo[s] = sample[j_lo]
        if 0 <= j_hi < m:
            hi[s] = sample[j_hi]
    return lo, hi


def _threshold(window, n_window, below, rows, k: int, allow: np.ndarray):
    """The k-th smallest candidate log-prob of a set (its window holds it) and, where candidates beyond the k-th
    tie with it, how many of the tied tokens each row takes (``allow``, the earliest in row-major order win)."""
    values = kernels.gather_window(window, n_window, rows)
    n_below = int(below[rows].sum())
    j = k - n_below - 1
    values.partition(j)
    thr = values[j]
    n_at_most = k + int(np.count_nonzero(values[j + 1 :] == thr))
    if n_at_most > k:
        need = k - n_below - int(np.count_nonzero(values[:j] < thr))
        ties = kernels.count_equal(window, n_window, rows, thr)
        before = np.cumsum(ties) - ties
        allow[rows] = np.clip(need - before, 0, ties)
    return thr
