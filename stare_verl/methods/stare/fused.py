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
time: torch's own OpenMP threads where :mod:`stare_verl.methods.stare.omp` applies (Linux, float32 inputs), else the
module's threads (:func:`_in_row_ranges`); the outcome does not depend on which thread runs which rows.

Two entry points: :func:`fused_reweight` takes the ``[B, T]`` GRPO advantages; :func:`fused_reweight_rows` takes
them per response (``[B]``, the advantages being ``row[:, None] * mask``), and its pass B writes each row of the
effective advantages whole, so the ``[B, T]`` GRPO advantages are never materialised (what
:func:`stare_verl.methods.stare.method.compute_stare_advantage` uses on CPU tensors).

Numba (``stare_verl.methods.stare.kernels``) is imported with this module: import it only where an advantage is
computed.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from stare_verl.methods.stare import kernels
from stare_verl.methods.stare.core import (
    SAMPLED_SELECTION_MIN,
    CovarianceSums,
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
    with _window_scratch(log_probs.shape, log_probs.dtype, entropys.dtype) as (window, window_ent):
        return _reweight_in(window, window_ent, row_adv, mask, log_probs, entropys, first, decide, ratio, variant,
                            output, advantages, row_advantages)  # fmt: skip


def _reweight_in(window, window_ent, row_adv, mask, log_probs, entropys, first, decide, ratio, variant, output,
                 advantages, row_advantages) -> tuple[np.ndarray | None, FusedStep]:  # fmt: skip
    """:func:`_reweight` with its window scratch (``[B, T]`` of the log-probs' and the entropies' dtype)."""
    b, t = log_probs.shape
    sets = [np.flatnonzero(row_adv > 0)] + ([np.flatnonzero(row_adv < 0)] if variant == "C2" else [])
    row_set = np.full(b, -1, dtype=np.int64)
    for s, rows in enumerate(sets):
        row_set[rows] = s
    lp_type = log_probs.dtype.type
    lo, hi = _windows(log_probs, mask, row_set, len(sets), ratio)
    end, n_model, n_valid, below, below_above, n_window = (np.empty(b, dtype=np.int64) for _ in range(6))
    ent_sum, lp_sum, below_sum = np.empty(b), np.empty(b), np.empty(b)
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
        totals = kernels.set_totals(row_set, len(sets), n_valid, below, n_window)
        ks = [top_count(ratio, int(totals[0, s])) for s in range(len(sets))]
        missed = [k > 0 and not (totals[1, s] < k <= totals[1, s] + totals[2, s]) for s, k in enumerate(ks)]
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
    n_high, s_high, s_low = np.empty(b), np.empty(b), np.empty(b)
    b_args = (log_probs, entropys, mask, end, n_model, n_valid, high_thr, row_set, thr, weight, allow, row_advantages,
              advantages if out is None else out,  # gate off, [B, T] advantages: no row set, nothing written
              n_high, s_high, s_low)  # fmt: skip
    parallel = _openmp(log_probs, entropys, mask, None if row_advantages is None else out)
    if parallel is not None:
        from stare_verl.methods.stare import omp

        omp.run_pass_b(log_probs.shape, *parallel, *b_args)
    else:
        _in_row_ranges(kernels.pass_b, log_probs.shape, *b_args)
    n_sel, n_above = np.zeros(b, dtype=np.int64), np.zeros(b, dtype=np.int64)
    s_sel = np.zeros(b)
    if gate_on:
        widest = int(n_window.max(initial=0))  # ranges sized by the window tokens a row holds (few), not by T
        c_args = (window, window_ent, n_window, below, below_sum, below_above, row_set, thr, allow, n_sel, s_sel,
                  n_above)  # fmt: skip
        parallel = _openmp(window, window_ent, None, window, shape=(b, widest))
        if parallel is not None:
            from stare_verl.methods.stare import omp

            omp.run_chosen_sums((b, widest), *parallel, *c_args)
        else:
            _in_row_ranges(kernels.chosen_sums, (b, widest), *c_args)

    weights = np.array([w, m], dtype=np.float64)
    chosen_high = np.array([thr[0] < high_thr, thr[1] < high_thr])
    apply = np.array([gate_on and s < len(ks) and ks[s] > 0 and weights[s] != 1.0 for s in range(2)])
    sums, above = kernels.covariance_rows(row_adv, n_high, s_high, s_low, n_valid, row_set, n_sel, s_sel, n_above,
                                          chosen_high, weights, apply)  # fmt: skip
    cov_base = CovarianceSums(n=sums[0], lp=sums[1], adv=sums[2], lp_adv=sums[3])
    cov_eff = CovarianceSums(n=sums[0], lp=sums[1], adv=sums[4], lp_adv=sums[5])
    summaries: list[SetSummary | None] = [None, None]
    if gate_on:
        for s, k in enumerate(ks):
            summaries[s] = SetSummary(k, -float(thr[s]) if k else None, int(above[s]))
    return out, FusedStep(int(n_model.sum()), n_valid_all, batch_entropy, summaries, cov_base, cov_eff)


_scratch: tuple[int, np.ndarray] | None = None
_scratch_lock = threading.Lock()


@contextlib.contextmanager
def _window_scratch(shape: tuple[int, int], lp_dtype: np.dtype, ent_dtype: np.dtype):
    """Pass A's window scratch: ``(window, window_ent)``, uninitialised ``shape`` arrays of ``lp_dtype`` and
    ``ent_dtype``, views of one buffer the module keeps from call to call (grown to the largest batch seen: two
    ``[B, T]`` arrays' worth of memory stay allocated between steps).

    Why kept: pass A writes a few tokens at the start of each row of both arrays, and a fresh allocation has every
    such page faulted in again on each call (one page per row and array; at 512 x 8192 about 2,000 page faults, 3-5 ms
    of CPU time a call on this project's CPU machines, measured in ``docs/results/estimator-speed.md``). A second
    thread computing an advantage while the buffer is in use gets fresh arrays (:func:`_empty`).
    """
    global _scratch
    b, t = shape
    lp_bytes = -(-b * t * np.dtype(lp_dtype).itemsize // 64) * 64  # the second array 64-byte aligned
    need = lp_bytes + b * t * np.dtype(ent_dtype).itemsize
    if not _scratch_lock.acquire(blocking=False):
        yield _empty(shape, lp_dtype), _empty(shape, ent_dtype)
        return
    try:
        pid = os.getpid()
        if _scratch is None or _scratch[0] != pid or _scratch[1].size < need:
            _scratch = None  # the old buffer freed before the larger one is allocated
            raw = np.empty(need + 64, dtype=np.uint8)
            _scratch = (pid, raw[-raw.ctypes.data % 64 :])  # 64-byte aligned (a cache line)
        buf = _scratch[1]
        yield (buf[: b * t * np.dtype(lp_dtype).itemsize].view(lp_dtype).reshape(shape),
               buf[lp_bytes:need].view(ent_dtype).reshape(shape))  # fmt: skip
    finally:
        _scratch_lock.release()


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
    """:func:`kernels.pass_a` over every row: on torch's OpenMP threads where :func:`_openmp` allows, else
    :func:`_in_row_ranges`."""
    parallel = _openmp(log_probs, entropys, mask, log_probs)
    if parallel is not None:
        from stare_verl.methods.stare import omp

        omp.run_pass_a(log_probs.shape, *parallel, log_probs, entropys, mask, first, row_set, lo, hi, *out)
    else:
        _in_row_ranges(kernels.pass_a, log_probs.shape, log_probs, entropys, mask, first, row_set, lo, hi, *out)


USE_OPENMP = True
"""Run the two passes on torch's OpenMP threads where possible (:mod:`stare_verl.methods.stare.omp`); False: always
on the module's own threads (:func:`_in_row_ranges`)."""


def _openmp(log_probs, entropys, mask, adv, shape=None) -> tuple[int, int, object] | None:
    """``(rows_per_range, threads, GOMP_parallel)`` when a pass over these arrays runs on torch's OpenMP threads
    (:mod:`stare_verl.methods.stare.omp`): more than one thread and one range, arrays it takes (``adv`` None: pass
    B's in-place mode, which it does not), and torch's OpenMP runtime found; else None. ``shape``: ``(B, T)`` that
    sizes the ranges (default: the log-probs' shape); ``mask`` None: a job without one (the chosen sums)."""
    b, t = log_probs.shape if shape is None else shape
    threads = max(1, min(_torch_threads(), _CPUS))
    rows_per = max(1, CHUNK_TOKENS // max(t, 1))
    if not USE_OPENMP or adv is None or threads == 1 or b <= rows_per:
        return None
    from stare_verl.methods.stare import omp

    if not omp.covers(log_probs, entropys, mask, adv):
        return None
    parallel = omp.openmp_parallel()
    return None if parallel is None else (rows_per, threads, parallel)


SAMPLE_SIZES = (1 << 14, 1 << 16)
"""The fewest and most positions :func:`_windows`' sample reads (one in 128 of the batch between them, in blocks of
:data:`kernels.SAMPLE_BLOCK`, a cache line of each array read per block). The window around the sampled quantile
narrows as one over the square root of the sample, and the threshold's partition and the chosen tokens' sums read
the window's tokens: a larger batch pays for a larger sample (at 512 x 8192, 32k positions, the window holds about 3%
of a set's candidates at P = 0.2)."""

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
    lo_n, hi_n = SAMPLE_SIZES
    stride = max(size // min(max(size // 128, lo_n), hi_n), 1)
    samples, counts = kernels.sample_candidates(log_probs, mask, row_set, n_sets, stride)
    for s in range(n_sets):
        sample = samples[s, : counts[s]]
        m = sample.size
        if m < 1024 or m * stride < SAMPLED_SELECTION_MIN:
            continue
        q = min(float(ratio), 1.0)
        margin = 5.0 * math.sqrt(q * (1.0 - q) / m) + 2.0 / m
        j_lo, j_hi = math.floor((q - margin) * m) - 1, math.ceil((q + margin) * m)
        # two partitions of one order statistic each (NumPy's partition at two at once took ~7x as long)
        if 0 <= j_lo < m:
            sample.partition(j_lo)
            lo[s] = sample[j_lo]
        if 0 <= j_hi < m:
            rest = sample[max(j_lo + 1, 0) :]  # the j_hi-th smallest lies above the j_lo-th
            rest.partition(j_hi - max(j_lo + 1, 0))
            hi[s] = rest[j_hi - max(j_lo + 1, 0)]
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
