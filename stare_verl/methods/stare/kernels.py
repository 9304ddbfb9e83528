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
from numba.extending import intrinsic, overload

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
# for rows of a token set (advantage > 0 or < 0), the candidates below a window [lo, hi] (counted, their log-probs
# summed, those with surprisal above their entropy counted: all of them are chosen) and inside it (log-prob and
# entropy copied into the row's segment of `window` / `window_ent`, in row order). With the threshold known,
# `chosen_sums` completes the chosen tokens' sums from the window alone, and pass B sums the covariance metrics'
# high-surprisal tokens and reweights the chosen tokens' advantages (with `rows_mode` each row's advantages are
# written whole from its per-response advantage and the mask, so that the [B, T] GRPO advantages need not exist
# beforehand; else the chosen entries of `adv` are multiplied in place). A token is valid when mask > 0
# and its log-prob and entropy are finite; sums run in float64.


@intrinsic
def _trailing_zeros(typingctx, x):  # pragma: no cover - compiled
    """The number of trailing zero bits of a uint64 (LLVM's ``cttz``; 64 for 0)."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.uint64(types.uint64), codegen


@intrinsic
def _contiguous_window_bits(typingctx, row, start, lo, hi):  # pragma: no cover - compiled
    """:func:`_window_bits` of a contiguous row: one vector load of the 64 values and two vector compares whose 64
    flags are the bits (LLVM's ``bitcast <64 x i1> to i64``; a loop that shifts each flag into place is compiled
    to scalar code)."""
    if not (
        isinstance(row, types.Array)
        and row.ndim == 1
        and row.layout == "C"
        and row.dtype in (types.float32, types.float64)
        and lo == row.dtype
        and hi == row.dtype
        and isinstance(start, types.Integer)
    ):
        return None

    def codegen(context, builder, signature, args):
        arr, j, a, b = args
        row_type = signature.args[0]
        data = context.make_array(row_type)(context, builder, arr).data
        vec = ir.VectorType(context.get_value_type(row_type.dtype), 64)
        ptr = builder.bitcast(builder.gep(data, [j]), vec.as_pointer())
        values = builder.load(ptr, align=row_type.dtype.bitwidth // 8)
        undef = ir.Constant(vec, ir.Undefined)
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), 64), [0] * 64)

        def splat(x):
            one = builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(one, undef, zeros)

        above, below = builder.fcmp_ordered(">=", values, splat(a)), builder.fcmp_ordered("<=", values, splat(b))
        inside = builder.and_(above, below)
        return builder.bitcast(inside, ir.IntType(64))

    return types.uint64(row, start, lo, hi), codegen


def _window_bits(row, start, lo, hi):  # pragma: no cover - compiled (see the overload below)
    """A uint64 whose bit q is set when ``lo <= row[start + q] <= hi`` (q < 64; NaN sets no bit), for a 1-D
    float32/float64 ``row`` with ``start + 64 <= row.size`` and bounds of its dtype. Only in compiled code."""
    raise NotImplementedError("_window_bits is compiled only")


@overload(_window_bits)
def _window_bits_impl(row, start, lo, hi):  # pragma: no cover - compiled
    """The vector form for a contiguous row, a loop for a strided one."""
    if isinstance(row, types.Array) and row.layout == "C":
        return lambda row, start, lo, hi: _contiguous_window_bits(row, start, lo, hi)

    def strided(row, start, lo, hi):
        bits = np.uint64(0)
        for q in range(64):
            v = row[start + q]
            bits |= np.uint64((v >= lo) & (v <= hi)) << np.uint64(q)
        return bits

    return strided


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


SUM_BLOCK = 1024
"""Tokens :func:`pass_a` sums in the inputs' own dtype before adding the block's sums to a row's float64 totals."""


@numba.njit(cache=True, nogil=True, inline="always")
def _window_copy(lp_row, ent_row, mask_row, j0, j1, stop, a, b, win_row, win_ent, nw):  # pragma: no cover - compiled
    """Copy the valid tokens of ``[j0, j1)`` (``j1 <= stop``) whose log-prob lies in ``[a, b]`` to ``win_row`` /
    ``win_ent`` from position ``nw`` on, in order; returns the new ``nw``. Few tokens fall inside the window: per
    64 tokens a bit mask of those whose log-prob does (vector compares), then a visit of its set bits only."""
    for k0 in range(j0, j1, 64):
        if k0 + 64 <= lp_row.size:  # the block's tokens from j1 on are cleared
            bits = _window_bits(lp_row, k0, a, b)
            if j1 - k0 < 64:
                bits &= (np.uint64(1) << np.uint64(j1 - k0)) - np.uint64(1)
        else:  # the last block of a row shorter than 64 beyond k0
            bits = np.uint64(0)
            for j in range(k0, j1):
                v = lp_row[j]
                bits |= np.uint64((v >= a) & (v <= b)) << np.uint64(j - k0)  # NaN compares False
        while bits != 0:
            j = k0 + np.int64(_trailing_zeros(bits))
            v = lp_row[j]
            e = ent_row[j]
            if (mask_row[j] > 0) & ((v - v) == 0) & ((e - e) == 0):
                win_row[nw] = v
                win_ent[nw] = e
                nw += 1
            bits &= bits - np.uint64(1)  # clear the lowest set bit
    return nw


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def pass_a(r0, r1, log_probs, entropys, mask, first, row_set, lo, hi, window, window_ent, end, n_model, n_valid,
           ent_sum, lp_sum, below, below_sum, below_above, n_window):  # pragma: no cover - compiled
    """Pass A (see above) over rows ``[r0, r1)``. ``first``: from :func:`first_model`; ``row_set[i]``: the set of
    row i (0 or 1), -1 for none; ``lo``/``hi``: ``[2]`` window bounds of each set in the log-probs' dtype;
    ``window``/``window_ent``: ``[B, T]`` scratch of the log-probs' / entropies' dtype, receiving the log-probs and
    entropies of the window's tokens. Writes ``end`` (one past each row's last model token, 0 for a row without
    one), the ``[B]`` counts and sums, and for the rows of a set the count ``below``, log-prob sum ``below_sum`` and
    count with surprisal above their entropy ``below_above`` of the valid tokens below ``lo``.

    The sums run over blocks of :data:`SUM_BLOCK` tokens in the inputs' dtype (counts exact: a block holds fewer
    than 2**24 tokens), each block's sums added to the row's float64 totals: float32 inputs are summed at full
    vector width (float64 sums of float32 values convert every token, twice the work). A row with a NaN or inf among
    its model tokens, or whose block sums overflow, is summed again token by token in float64 with the finiteness
    test. The window's tokens are copied block by block, while the block is in cache."""
    for i in range(r0, r1):
        lp_row, ent_row, mask_row = log_probs[i], entropys[i], mask[i]
        stop = _row_end(mask_row) if first[i] >= 0 else 0
        end[i] = stop
        s = row_set[i]
        cm, nb, es, ls, sb, na = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        one, z = np.float32(1.0), np.float32(0.0)
        ez, lz = ent_row.dtype.type(0.0), lp_row.dtype.type(0.0)
        nw = 0
        # first without the finiteness test: a NaN or inf among the row's model tokens makes its entropy or
        # log-prob sum non-finite, and only then is the row summed again with the test. Branch-free (selects, not
        # jumps; no int/float mix), over slices of the row: the form LLVM vectorises.
        if s >= 0:
            a, b = lo[s], hi[s]
            win_row, win_ent = window[i], window_ent[i]
            for j0 in range(0, stop, SUM_BLOCK):
                j1 = min(j0 + SUM_BLOCK, stop)
                lb, eb, mb = lp_row[j0:j1], ent_row[j0:j1], mask_row[j0:j1]
                c1, c4, c6, c2, c3, c5 = z, z, z, ez, lz, lz
                for q in range(j1 - j0):
                    v = lb[q]
                    e = eb[q]
                    m = mb[q] > 0
                    low = m & (v < a)
                    c1 += one if m else z
                    c2 += e if m else ez
                    c3 += v if m else lz
                    c4 += one if low else z
                    c5 += v if low else lz
                    c6 += one if low & (-v > e) else z
                cm += c1
                es += c2
                ls += c3
                nb += c4
                sb += c5
                na += c6
                nw = _window_copy(lp_row, ent_row, mask_row, j0, j1, stop, a, b, win_row, win_ent, nw)
        else:
            for j0 in range(0, stop, SUM_BLOCK):
                j1 = min(j0 + SUM_BLOCK, stop)
                lb, eb, mb = lp_row[j0:j1], ent_row[j0:j1], mask_row[j0:j1]
                c1, c2, c3 = z, ez, lz
                for q in range(j1 - j0):
                    v = lb[q]
                    m = mb[q] > 0
                    c1 += one if m else z
                    c2 += eb[q] if m else ez
                    c3 += v if m else lz
                cm += c1
                es += c2
                ls += c3
        cv = cm
        if not ((es - es) == 0 and (ls - ls) == 0 and (sb - sb) == 0):
            a = lo[s] if s >= 0 else -np.inf
            cm, cv, nb, es, ls, sb, na = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            for j in range(stop):
                v = lp_row[j]
                e = ent_row[j]
                m = mask_row[j] > 0
                ok = m & ((v - v) == 0) & ((e - e) == 0)  # finite: inf - inf and NaN - NaN are NaN
                low = ok & (v < a)
                vd, ed = np.float64(v), np.float64(e)
                cm += 1.0 if m else 0.0
                cv += 1.0 if ok else 0.0
                es += ed if ok else 0.0
                ls += vd if ok else 0.0
                nb += 1.0 if low else 0.0
                sb += vd if low else 0.0
                na += 1.0 if low & (-v > e) else 0.0
        n_model[i], n_valid[i], ent_sum[i], lp_sum[i] = int(cm), int(cv), es, ls
        below[i], below_sum[i], below_above[i] = int(nb), sb, int(na)
        n_window[i] = nw


SAMPLE_BLOCK = 16
"""Adjacent positions :func:`sample_candidates` reads together (64 bytes of float32: one cache line per array)."""


@intrinsic
def _prefetch(typingctx, array, row, col):  # pragma: no cover - compiled
    """Hint the CPU to bring ``array[row, col]`` (a 2-D array, in bounds) into its caches (LLVM's ``prefetch``: a
    read, kept in all levels); nothing else happens."""
    if not (isinstance(array, types.Array) and array.ndim == 2):
        return None

    def codegen(context, builder, signature, args):
        from numba.core import cgutils

        arr_type = signature.args[0]
        arr = context.make_array(arr_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, arr_type, arr, [args[1], args[2]], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        name = "llvm.prefetch.p0"  # (opaque pointers: the address space is the only overload)
        fn = builder.module.globals.get(name) or ir.Function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), name=name
        )
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.none(array, types.intp, types.intp), codegen


SAMPLE_PREFETCH = 16
"""How many blocks ahead :func:`sample_candidates` asks for the next blocks' cache lines."""


@numba.njit(cache=True, nogil=True)
def sample_candidates(log_probs, mask, row_set, n_sets, stride):  # pragma: no cover - compiled
    """A sample of each set's candidates in blocks of :data:`SAMPLE_BLOCK` adjacent positions, one position in
    ``stride`` on average: ``(samples, counts)``, ``samples[s, :counts[s]]`` the finite log-probs of the model tokens
    of set ``s``'s rows (``row_set``) among the flat positions ``p0 + q * SAMPLE_BLOCK * stride + r`` of the ``[B, T]``
    batch (``r < SAMPLE_BLOCK``, ``p0`` half a block step), in position order (``samples``: ``[n_sets, n]`` of the
    log-probs' dtype, ``n`` the positions read). Blocks, not single strided positions: each block costs one cache
    miss per array read instead of one per position (most of the sample's time). The entropies are not read: a
    token whose entropy is NaN or inf, no candidate, may enter the sample, which sets only the window's bounds."""
    t = log_probs.shape[1]
    size = log_probs.shape[0] * t
    step = SAMPLE_BLOCK * stride
    p0 = step // 2 if size > step else 0
    n_blocks = (size - p0 + step - 1) // step if size > p0 else 0
    n = n_blocks * SAMPLE_BLOCK
    samples = np.empty((n_sets, n), dtype=log_probs.dtype)
    counts = np.zeros(n_sets, dtype=np.int64)
    for q in range(n_blocks):
        start = p0 + q * step
        if q + SAMPLE_PREFETCH < n_blocks:  # the block's lines are cache misses: ask for them well ahead
            ahead = start + SAMPLE_PREFETCH * step
            r = ahead // t
            _prefetch(log_probs, r, ahead - r * t)
            _prefetch(mask, r, ahead - r * t)
        r = start // t
        c0 = start - r * t
        if c0 + SAMPLE_BLOCK <= t:  # the block within one row: its set read once, the appends branch-free
            s = row_set[r]
            if 0 <= s < n_sets:
                k = counts[s]
                for c in range(c0, c0 + SAMPLE_BLOCK):
                    v = log_probs[r, c]
                    samples[s, k] = v  # kept only when the count moves past it
                    k += 1 if (mask[r, c] > 0) & ((v - v) == 0) else 0  # finite: NaN - NaN, inf - inf are NaN
                counts[s] = k
            continue
        for pos in range(start, min(start + SAMPLE_BLOCK, size)):
            r = pos // t
            c = pos - r * t
            s = row_set[r]
            v = log_probs[r, c]
            if 0 <= s < n_sets and mask[r, c] > 0 and np.isfinite(v):
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


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH, inline="always")
def _pass_b_row(lp_row, ent_row, mask_row, adv_row, stop, checked, high_thr, chosen_ok, t, all_ties, w, rv,
                row_adv):  # pragma: no cover - compiled
    """Pass B's loop over one row's tokens up to ``stop``: ``(n_high, s_high, s_low)``, and the row's advantages written
    (see :func:`pass_b`). ``checked``: test each token for finite log-prob and entropy (a row with a non-finite
    one); without, the entropies are not read. ``chosen_ok``: the row belongs to a set (its tokens below ``t``, and
    equal to it with ``all_ties``, are chosen). Inlined with constant ``checked``/``chosen_ok``, each combination
    compiles to its own loop."""
    cast = adv_row.dtype.type
    one = cast(1)
    c, sh, sl = 0.0, 0.0, 0.0
    for j in range(stop):
        v = lp_row[j]
        mv = mask_row[j]
        ok = mv > 0
        if checked:
            e = ent_row[j]
            ok = ok & ((v - v) == 0) & ((e - e) == 0)
        vz = v if ok else 0.0  # finite: its product with the 0/1 flag below stays exact
        h = 1.0 if ok & (v < high_thr) else 0.0
        c += h
        sh += vz * h  # (the form LLVM vectorises: a select of v itself into the sum is not)
        sl += vz * (1.0 - h)
        if chosen_ok:
            # the tokens below the threshold, and those equal to it when every tie is taken
            chosen = ok & ((v < t) | ((v == t) & all_ties))
            if row_adv is None:
                adv_row[j] = adv_row[j] * (w if chosen else one)
            else:
                adv_row[j] = _scaled(rv, cast(mv), w if chosen else one)
        elif row_adv is not None:
            adv_row[j] = rv * cast(mv)
    return c, sh, sl


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def pass_b(r0, r1, log_probs, entropys, mask, end, n_model, n_valid, high_thr, row_set, thr, weight, allow, row_adv,
           adv, n_high, s_high, s_low):  # pragma: no cover - compiled
    """Pass B (see above) over rows ``[r0, r1)``. ``high_thr``: a token is high-surprisal when
    ``log_prob < high_thr`` (the log-probs' dtype); ``thr``/``weight``: ``[2]`` per set (the k-th smallest log-prob,
    the weight in the advantages' dtype); ``allow[i]``: how many tokens equal to the threshold row i may take (-1:
    all); ``end``, ``n_model``, ``n_valid``: from :func:`pass_a` (a row whose model tokens are all valid is read
    without the finiteness test and without its entropies). ``adv``: ``[B, T]``. With ``row_adv`` None the chosen
    entries of ``adv`` are multiplied by their weight in place; with ``row_adv`` (``[B]``, ``adv``'s dtype) every
    entry is written, ``row_adv[i] * mask[i, j]`` in ``adv``'s dtype (as torch's ``row_adv[:, None] * mask``),
    times the weight where chosen. (``row_adv is None`` is settled when the kernel is compiled: each mode has its
    own loops.) Writes the ``[B]`` count ``n_high`` and log-prob sum ``s_high`` of each row's valid tokens below
    ``high_thr`` and the log-prob sum ``s_low`` of the others (float64, in token order: a class without a token sums
    to exactly 0); the chosen tokens' own sums come from pass A and the window."""
    cast = adv.dtype.type
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
        checked = n_valid[i] != n_model[i]
        if s >= 0:
            if checked:
                c, sh, sl = _pass_b_row(lp_row, ent_row, mask_row, adv_row, stop, True, high_thr, True, t, all_ties, w,
                                    rv, row_adv)
            else:
                c, sh, sl = _pass_b_row(lp_row, ent_row, mask_row, adv_row, stop, False, high_thr, True, t, all_ties, w,
                                    rv, row_adv)
        elif checked:
            c, sh, sl = _pass_b_row(lp_row, ent_row, mask_row, adv_row, stop, True, high_thr, False, t, all_ties, w, rv,
                                row_adv)
        else:
            c, sh, sl = _pass_b_row(lp_row, ent_row, mask_row, adv_row, stop, False, high_thr, False, t, all_ties, w,
                                rv, row_adv)
        if row_adv is not None:  # past the last model token: no token chosen
            for j in range(stop, mask_row.size):
                adv_row[j] = rv * cast(mask_row[j])
        if s >= 0 and left > 0:  # the row's share of the tied tokens: the earliest
            for j in range(stop):
                v = lp_row[j]
                e = ent_row[j]
                if left > 0 and v == t and (mask_row[j] > 0) and (e - e) == 0:
                    left -= 1
                    adv_row[j] = adv_row[j] * w
        n_high[i], s_high[i], s_low[i] = c, sh, sl


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def chosen_sums(r0, r1, window, window_ent, n_window, below, below_sum, below_above, row_set, thr, allow, n_sel,
                s_sel, n_above):  # pragma: no cover - compiled
    """The chosen tokens' sums of each row of a set (``row_set[i] >= 0``), from pass A's: its valid tokens below the
    window (all chosen: the window's lower bound lies at or below the threshold) and its window tokens below
    ``thr`` of its set, or equal to it (all with ``allow[i]`` -1, else the first ``allow[i]``, the window holding a
    row's tokens in order). Writes ``[B]`` ``n_sel``, ``s_sel`` (their log-prob sum, float64) and ``n_above`` (those
    whose surprisal exceeds their entropy) for the rows ``[r0, r1)``; rows of no set are left untouched."""
    for i in range(r0, r1):
        s = row_set[i]
        if s < 0:
            continue
        t = thr[s]
        left = allow[i]
        ns, ss, na = below[i], below_sum[i], below_above[i]
        win_row, win_ent = window[i][: n_window[i]], window_ent[i][: n_window[i]]
        if left < 0:  # every tie taken: the tokens at or below the threshold, branch-free (a loop LLVM vectorises)
            c, sv, ca = 0.0, 0.0, 0.0
            for q in range(win_row.size):
                v = win_row[q]
                take = v <= t
                c += 1.0 if take else 0.0
                sv += v if take else 0.0
                ca += 1.0 if take & (-v > win_ent[q]) else 0.0
            ns += int(c)
            ss += sv
            na += int(ca)
        else:
            for q in range(win_row.size):
                v = win_row[q]
                take = v < t
                if v == t:
                    take = left != 0
                    left -= 1 if left > 0 else 0
                if take:
                    ns += 1
                    ss += v
                    na += 1 if -v > win_ent[q] else 0
        n_sel[i], s_sel[i], n_above[i] = ns, ss, na


@numba.njit(cache=True, nogil=True)
def set_totals(row_set, n_sets, n_valid, below, n_window):  # pragma: no cover - compiled
    """``[3, n_sets]`` int64: per set (``row_set``), its rows' valid tokens, tokens below the window and window
    tokens (from :func:`pass_a`)."""
    out = np.zeros((3, max(n_sets, 1)), dtype=np.int64)
    for i in range(row_set.size):
        s = row_set[i]
        if 0 <= s < n_sets:
            out[0, s] += n_valid[i]
            out[1, s] += below[i]
            out[2, s] += n_window[i]
    return out


@numba.njit(cache=True, nogil=True)
def covariance_rows(row_adv, n_high, s_high, s_low, n_valid, row_set, n_sel, s_sel, n_above, chosen_high, weight,
                    apply):  # pragma: no cover - compiled
    """The covariance metrics' per-class sums from per-row sums, in one loop over ``[B]``.

    Args:
        row_adv: ``[B]`` each row's GRPO advantage. n_high, s_high, s_low: ``[B]`` float64 count and log-prob sum
            of a row's valid tokens of high surprisal, and the log-prob sum of the others (pass B: float64 sums in
            token order). n_valid: ``[B]`` a row's valid tokens (pass A). row_set: ``[B]`` the row's set (-1: none, or a set of no chosen token). n_sel,
            s_sel, n_above: ``[B]`` the chosen tokens' count, log-prob sum and count above their entropy
            (:func:`chosen_sums`). chosen_high: ``[2]`` bool, every chosen token of the set is of high surprisal (its
            threshold below the high-surprisal bound). weight: ``[2]`` float64 the sets' weights. apply: ``[2]``
            bool, the set's tokens are reweighted (chosen tokens and a weight other than 1).

    Returns:
        ``(sums, above)``: ``[6, 5]`` float64, the rows ``n, lp, adv, lp_adv`` of the GRPO advantage's
        :class:`~stare_verl.methods.stare.core.CovarianceSums` and ``adv, lp_adv`` of the effective advantage's, per
        class (``QUADRANTS`` order: A > 0 high / low surprisal, A < 0 high / low, A = 0); ``[2]`` int64 the sets'
        chosen tokens above their entropy.
    """
    sums = np.zeros((6, 5))
    above = np.zeros(2, dtype=np.int64)
    for i in range(row_adv.size):
        a = np.float64(row_adv[i])
        nh, sh, sl = n_high[i], s_high[i], s_low[i]
        na = np.float64(n_valid[i])
        if a == 0:
            sums[0, 4] += na
            sums[1, 4] += sh + sl
            continue
        q = 0 if a > 0 else 2
        sums[0, q] += nh
        sums[1, q] += sh
        sums[2, q] += a * nh
        sums[3, q] += a * sh
        sums[0, q + 1] += na - nh
        sums[1, q + 1] += sl
        sums[2, q + 1] += a * (na - nh)
        sums[3, q + 1] += a * sl
        s = row_set[i]
        if s < 0:
            continue
        above[s] += n_above[i]
        if apply[s]:
            delta = (weight[s] - 1.0) * a  # what each chosen token adds to its advantage
            cnt, lps = np.float64(n_sel[i]), s_sel[i]
            # the chosen tokens of high surprisal: all of them when the threshold lies below the high-surprisal
            # bound, else the row's high tokens (all chosen then; a tie at the threshold is not high)
            ch, lph = (cnt, lps) if chosen_high[s] else (nh, sh)
            sums[4, q] += delta * ch
            sums[4, q + 1] += delta * (cnt - ch)
            sums[5, q] += delta * lph
            sums[5, q + 1] += delta * (lps - lph)
    sums[4] += sums[2]
    sums[5] += sums[3]
    return sums, above
