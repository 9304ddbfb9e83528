"""Compiled (numba) per-row pass over the old log-probs of a batch, for :func:`stare_verl.methods.stare.core.token_masks`.

Imported lazily by :mod:`stare_verl.methods.stare.core` (``import numba`` takes about 0.4 s, which processes that never compute
an advantage should not pay). The kernel is cached on disk (``cache=True``: ``__pycache__`` beside this file, or
numba's user-wide cache when that is read-only), so only the first process on a machine compiles it (~0.4 s).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

# Let LLVM reorder the sums so the loop vectorises; keep NaN/inf semantics (no "nnan"/"ninf"): a NaN or inf
# anywhere in a row must still reach that row's total, which is the caller's finiteness check.
_FASTMATH = {"reassoc", "nsz", "arcp", "contract"}


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _row_stats(log_probs, mask, threshold, zero, n_high, s_high, s_all):  # pragma: no cover - compiled
    for i in range(log_probs.shape[0]):
        c, s, total = zero, zero, zero
        for j in range(log_probs.shape[1]):
            v = log_probs[i, j]
            m = zero + mask[i, j]
            # every load unconditional, a select rather than a branch: the form LLVM vectorises
            h = m if v < threshold else zero
            c += h
            s += v * h
            total += v * m
        n_high[i], s_high[i], s_all[i] = c, s, total


def log_prob_row_stats(
    log_probs: np.ndarray, mask: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-response sums over the masked tokens, in one pass: ``(n_high, s_high, s_all)``.

    Args:
        log_probs: ``[B, T]`` float32 or float64 log-probs (nats); other dtypes are widened to float64.
        mask: ``[B, T]`` bool, the tokens to count.
        threshold: log-prob threshold (nats), a real number compared in the dtype the sums run in (float32 or
            float64; other dtypes are widened to float64 first): a token is ``high`` when ``log_prob < threshold``
            (surprisal above ``-threshold``). NaN counts no token.

    Returns:
        Three ``[B]`` float64 arrays: the number of masked tokens below ``threshold`` and the sum of their
        log-probs, and the sum of all masked log-probs. Accumulated in ``log_probs``' dtype per row (counts are
        exact below 2**24 tokens per row); a NaN or inf anywhere in a row, masked or not, makes its ``s_all``
        non-finite (the caller's finiteness check), and the other two undefined.

    Raises:
        ValueError: the arrays are not 2-D NumPy arrays of one shape, the mask is not bool, or ``threshold`` is
            not a real number.
    """
    if not isinstance(log_probs, np.ndarray) or not isinstance(mask, np.ndarray):
        raise ValueError(f"log_probs and mask must be NumPy arrays, got {type(log_probs)} and {type(mask)}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
        raise ValueError(f"threshold must be a real number, got {threshold!r}")
    if log_probs.ndim != 2 or mask.shape != log_probs.shape:
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and mask {tuple(mask.shape)} must be one [B, T] shape")
    if mask.dtype != np.bool_:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    if log_probs.dtype not in (np.float32, np.float64):
        if not np.issubdtype(log_probs.dtype, np.floating) and not np.issubdtype(log_probs.dtype, np.integer):
            raise ValueError(f"log_probs must be real numbers, got {log_probs.dtype}")
        log_probs = log_probs.astype(np.float64)
    dtype = log_probs.dtype.type
    out = [np.empty(log_probs.shape[0]) for _ in range(3)]
    _row_stats(log_probs, mask.view(np.uint8), dtype(threshold), dtype(0), *out)
    return out[0], out[1], out[2]


# --- the fused per-row passes of the CPU estimator (stare_verl.methods.stare.fused) --------------------------------
# Two passes over [B, T], each a serial kernel over a range of rows [r0, r1) (the caller runs row ranges on several
# threads: the kernels release the GIL), each reading a row's tokens only up to its last model token.
# Pass A: per row where its model tokens end, the model and valid token counts, the entropy and log-prob sums, and,
# for rows of a token set (advantage > 0 or < 0), the candidates below a window [lo, hi] (counted) and inside it
# (copied into the row's segment of `window`, in row order). Pass B, with the selection threshold known: the
# covariance metrics' high-surprisal sums, and the chosen tokens' advantages reweighted (with `rows_mode` each row's
# advantages are written whole from its per-response advantage and the mask, so that the [B, T] GRPO advantages need
# not exist beforehand; else the chosen entries of `adv` are multiplied in place). A token is valid when mask > 0
# and its log-prob and entropy are finite; sums run in float64.


@intrinsic
def _trailing_zeros(typingctx, x):  # pragma: no cover - compiled
    """The number of trailing zero bits of a uint64 (LLVM's ``cttz``; 64 for 0)."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.uint64(types.uint64), codegen


@numba.njit(cache=True, nogil=True)
def first_model(mask):  # pragma: no cover - compiled
    """``[B]`` int64: the position of each row's first model token (``mask > 0``), -1 for a row without one."""
    n, t = mask.shape
    first = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        row = mask[i]
        for j in range(t):
            if row[j] > 0:
                first[i] = j
                break
    return first


@numba.njit(cache=True, nogil=True)
def _row_end(row):  # pragma: no cover - compiled
    """One past the last model token of a row that holds one: its tokens from there on are no model tokens."""
    j = row.size
    while j >= 16:  # whole blocks of 16 from the end while none holds a model token: a loop LLVM vectorises
        any_model = False
        for q in range(j - 16, j):
            any_model |= row[q] > 0
        if any_model:
            break
        j -= 16
    while not row[j - 1] > 0:  # the row has a model token before j
        j -= 1
    return j


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def pass_a(r0, r1, log_probs, entropys, mask, first, row_set, lo, hi, window, end, n_model, n_valid, ent_sum, lp_sum,
           below, n_window):  # pragma: no cover - compiled
    """Pass A (see above) over rows ``[r0, r1)``. ``first``: from :func:`first_model`; ``row_set[i]``: the set of
    row i (0 or 1), -1 for none; ``lo``/``hi``: ``[2]`` window bounds of each set in the log-probs' dtype;
    ``window``: ``[B, T]`` scratch of the log-probs' dtype. Writes ``end`` (one past each row's last model token,
    0 for a row without one) and the ``[B]`` counts and sums."""
    for i in range(r0, r1):
        lp_row, ent_row, mask_row = log_probs[i], entropys[i], mask[i]
        stop = _row_end(mask_row) if first[i] >= 0 else 0
        end[i] = stop
        s = row_set[i]
        a = lo[s] if s >= 0 else -np.inf
        cm, cv, nb, es, ls = 0.0, 0.0, 0.0, 0.0, 0.0
        # branch-free, float64 counters (selects, not jumps; no int/float mix): the form LLVM vectorises
        for j in range(stop):
            v = lp_row[j]
            e = ent_row[j]
            m = mask_row[j] > 0
            ok = m & ((v - v) == 0) & ((e - e) == 0)  # finite: inf - inf and NaN - NaN are NaN
            cm += 1.0 if m else 0.0
            cv += 1.0 if ok else 0.0
            nb += 1.0 if ok & (v < a) else 0.0
            es += e if ok else 0.0
            ls += v if ok else 0.0
        n_model[i], n_valid[i], ent_sum[i], lp_sum[i], below[i] = int(cm), int(cv), es, ls, int(nb)
        nw = 0
        if s >= 0:
            b = hi[s]
            win_row = window[i]
            # few tokens fall inside the window: per block of 64 tokens a bit mask of those whose log-prob does
            # (a loop LLVM vectorises), then a visit of its set bits only, in order
            for j0 in range(0, stop, 64):
                bits = np.uint64(0)
                for j in range(j0, min(j0 + 64, stop)):
                    v = lp_row[j]
                    bits |= np.uint64((v >= a) & (v <= b)) << np.uint64(j - j0)  # NaN compares False
                while bits != 0:
                    j = j0 + np.int64(_trailing_zeros(bits))
                    v = lp_row[j]
                    e = ent_row[j]
                    if (mask_row[j] > 0) & ((v - v) == 0) & ((e - e) == 0):
                        win_row[nw] = v
                        nw += 1
                    bits &= bits - np.uint64(1)  # clear the lowest set bit
        n_window[i] = nw


@numba.njit(cache=True, nogil=True)
def sample_candidates(log_probs, entropys, mask, row_set, n_sets, stride):  # pragma: no cover - compiled
    """A strided sample of each set's candidates: ``(samples, counts)``, ``samples[s, :counts[s]]`` the log-probs of
    the valid tokens of set ``s``'s rows (``row_set``) among the flat positions ``stride // 2 + q * stride`` of the
    ``[B, T]`` batch, in position order (``samples``: ``[n_sets, ceil(B * T / stride)]`` of the log-probs' dtype)."""
    t = log_probs.shape[1]
    size = log_probs.shape[0] * t
    n = (size - stride // 2 + stride - 1) // stride if size > stride // 2 else 0
    samples = np.empty((n_sets, n), dtype=log_probs.dtype)
    counts = np.zeros(n_sets, dtype=np.int64)
    lp, ent = np.empty(n, dtype=log_probs.dtype), np.empty(n, dtype=entropys.dtype)
    ok = np.empty(n, dtype=np.bool_)
    # the reads first, without a branch between them, so that the processor overlaps their cache misses
    for q in range(n):
        pos = stride // 2 + q * stride
        r = pos // t
        c = pos - r * t
        lp[q] = log_probs[r, c]
        ent[q] = entropys[r, c]
        ok[q] = mask[r, c] > 0
    for q in range(n):
        s = row_set[(stride // 2 + q * stride) // t]
        v, e = lp[q], ent[q]
        if 0 <= s < n_sets and ok[q] and np.isfinite(v) and np.isfinite(e):
            samples[s, counts[s]] = v
            counts[s] += 1
    return samples, counts


@numba.njit(cache=True, nogil=True)
def gather_window(window, n_window, rows):  # pragma: no cover - compiled
    """The window values of ``rows`` (ascending), concatenated in row order: 1-D, a new array."""
    total = 0
    for r in rows:
        total += n_window[r]
    out = np.empty(total, dtype=window.dtype)
    k = 0
    for r in rows:
        for j in range(n_window[r]):
            out[k] = window[r, j]
            k += 1
    return out


@numba.njit(cache=True, nogil=True)
def count_equal(window, n_window, rows, value):  # pragma: no cover - compiled
    """``[len(rows)]`` int64: how many of each row's window values equal ``value``."""
    out = np.zeros(rows.size, dtype=np.int64)
    for k in range(rows.size):
        r = rows[k]
        c = 0
        for j in range(n_window[r]):
            c += 1 if window[r, j] == value else 0
        out[k] = c
    return out


@numba.njit(cache=True, nogil=True)
def _scaled(row_adv, mask_value, factor):  # pragma: no cover - compiled
    """``(row_adv * mask_value) * factor``, rounded after each product. Compiled without fast-math, so that inlined
    into :func:`pass_b` the products keep their order (reassociated, ``row_adv * factor`` would be hoisted out of the
    loop and round differently)."""
    return (row_adv * mask_value) * factor


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def pass_b(r0, r1, log_probs, entropys, mask, end, high_thr, row_set, thr, weight, allow, row_adv, adv, n_high, s_high,
           n_sel, s_sel, n_sel_high, s_sel_high, n_above):  # pragma: no cover - compiled
    """Pass B (see above) over rows ``[r0, r1)``. ``high_thr``: a token is high-surprisal when
    ``log_prob < high_thr`` (the log-probs' dtype); ``thr``/``weight``: ``[2]`` per set (the k-th smallest log-prob,
    the weight in the advantages' dtype); ``allow[i]``: how many tokens equal to the threshold row i may take (-1:
    all); ``end``: from :func:`pass_a`. ``adv``: ``[B, T]``. With ``row_adv`` None the chosen entries of ``adv`` are
    multiplied by their weight in place; with ``row_adv`` (``[B]``, ``adv``'s dtype) every entry is written,
    ``row_adv[i] * mask[i, j]`` in ``adv``'s dtype (as torch's ``row_adv[:, None] * mask``), times the weight where
    chosen. (``row_adv is None`` is settled when the kernel is compiled: each mode has its own loops.)"""
    cast = adv.dtype.type
    one = cast(1)
    for i in range(r0, r1):
        s = row_set[i]
        t = thr[max(s, 0)]
        w = weight[max(s, 0)]
        left = allow[i]
        all_ties = left < 0
        stop = end[i]
        # row views: the loops read and write through them (indexing the [B, T] arrays per token, the in-place
        # update is not vectorised)
        lp_row, ent_row, mask_row, adv_row = log_probs[i], entropys[i], mask[i], adv[i]
        rv = cast(0) if row_adv is None else row_adv[i]
        c, sh = 0.0, 0.0
        ns, ss, nsh, ssh, na = 0.0, 0.0, 0.0, 0.0, 0.0
        if s < 0:
            for j in range(stop):
                v = lp_row[j]
                e = ent_row[j]
                ok = (mask_row[j] > 0) & ((v - v) == 0) & ((e - e) == 0)
                vz = v if ok else 0.0  # finite: products with the 0/1 flags below stay exact
                h = 1.0 if ok & (v < high_thr) else 0.0
                c += h
                sh += vz * h
            if row_adv is not None:  # nothing chosen: the row's GRPO advantages
                for j in range(mask_row.size):
                    adv_row[j] = rv * cast(mask_row[j])
        else:
            for j in range(stop):
                v = lp_row[j]
                e = ent_row[j]
                ok = (mask_row[j] > 0) & ((v - v) == 0) & ((e - e) == 0)
                vz = v if ok else 0.0
                h = 1.0 if ok & (v < high_thr) else 0.0
                c += h
                sh += vz * h
                # the tokens below the threshold, and those equal to it when every tie is taken (-1)
                chosen = ok & ((v < t) | ((v == t) & all_ties))
                sel = 1.0 if chosen else 0.0
                if row_adv is None:
                    adv_row[j] = adv_row[j] * (w if chosen else one)
                else:
                    adv_row[j] = _scaled(rv, cast(mask_row[j]), w if chosen else one)
                ns += sel
                ss += vz * sel
                nsh += h * sel
                ssh += vz * (h * sel)
                na += sel if -v > e else 0.0
            if row_adv is not None:  # past the last model token: no token chosen
                for j in range(stop, mask_row.size):
                    adv_row[j] = rv * cast(mask_row[j])
            if left > 0:  # the row's share of the tied tokens: the earliest
                for j in range(stop):
                    v = lp_row[j]
                    e = ent_row[j]
                    if left > 0 and v == t and (mask_row[j] > 0) and (e - e) == 0:
                        left -= 1
                        adv_row[j] = adv_row[j] * w
                        ns += 1
                        ss += v
                        if v < high_thr:
                            nsh += 1
                            ssh += v
                        if -v > e:
                            na += 1
        n_high[i], s_high[i] = c, sh
        n_sel[i], s_sel[i], n_sel_high[i], s_sel_high[i], n_above[i] = int(ns), ss, int(nsh), ssh, int(na)
