"""The estimator's row passes on torch's own OpenMP threads (CPU, Linux).

torch runs its CPU kernels on an OpenMP thread pool whose workers, after each parallel region, spin for a few
milliseconds waiting for the next one (GNU OpenMP's default wait policy; measured ~4.5 ms here). The estimator's two
passes over ``[B, T]`` used to run on a thread of their own, which then shared a core with that spinning worker:
right after any torch operation (the rewards' row sum, or whatever the trainer ran just before) the second thread
added nothing, or less than nothing (``docs/results/estimator-speed.md``). Here the passes run *inside* a parallel
region of torch's OpenMP runtime instead (its ``GOMP_parallel`` entry point, called through ctypes with a compiled C
callback): the spinning worker takes its share at once, the team is torch's intra-op thread count (the CPU budget
the driver gives its tensor work), and no second thread pool competes with torch's.

The callback takes rows in ranges from a shared atomic counter (dynamic scheduling: a worker that gets no CPU takes
no range), each range the same compiled kernel call as before, so the results are the same whichever thread runs
which rows. Where this does not apply (no OpenMP runtime of torch's found, other dtypes, non-contiguous arrays) the
caller runs its own threads (:func:`stare_verl.methods.stare.fused._in_row_ranges`).

Covered: float32 log-probs and entropies, a mask of uint8 (a bool mask's view), int64 or float32, float32 advantages
written per row (``fused_reweight_rows``): what verl hands the estimator. Compiled once per machine (cached beside this
file), on the first call that needs it.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import carray, cfunc, types
from numba.extending import intrinsic

from stare_verl.methods.stare import kernels

MASK_KINDS = {np.dtype(np.uint8): 0, np.dtype(np.int64): 1, np.dtype(np.float32): 2}
"""The mask dtypes the compiled callbacks take, and their codes in a job's header."""

_HEADER = 6  # counter address, ranges, rows per range, B, T, mask kind


@intrinsic
def _fetch_add(typingctx, address, value):  # pragma: no cover - compiled
    """Atomically add ``value`` to the int64 at ``address``; returns the value before."""
    if address != types.int64 or value != types.int64:
        return None

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.atomic_rmw("add", ptr, args[1], "monotonic")

    return types.int64(types.int64, types.int64), codegen


def _pointer_intrinsic(numba_type, llvm_type):
    @intrinsic
    def as_pointer(typingctx, address):  # pragma: no cover - compiled
        if address != types.int64:
            return None

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], llvm_type.as_pointer())

        return types.CPointer(numba_type)(types.int64), codegen

    return as_pointer


_f32 = _pointer_intrinsic(types.float32, ir.FloatType())
_f64 = _pointer_intrinsic(types.float64, ir.DoubleType())
_i64 = _pointer_intrinsic(types.int64, ir.IntType(64))
_u8 = _pointer_intrinsic(types.uint8, ir.IntType(8))


@intrinsic
def _header(typingctx, data):  # pragma: no cover - compiled
    """The job's int64 words (``data`` is the address of an int64 array)."""
    if data != types.voidptr:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64).as_pointer())

    return types.CPointer(types.int64)(types.voidptr), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _ranges(h):  # pragma: no cover - compiled
    """The next row range ``(r0, r1)`` of a job, ``(0, 0)`` when every range is taken."""
    c = _fetch_add(h[0], 1)
    if c >= h[1]:
        return 0, 0
    return c * h[2], min(h[3], (c + 1) * h[2])


@numba.njit(cache=True, nogil=True)
def _pass_a_rows(h, log_probs, entropys, mask, b):  # pragma: no cover - compiled
    a = _HEADER + 3  # the other arrays' addresses follow the header and the three [B, T] inputs
    first, row_set = carray(_i64(h[a]), (b,)), carray(_i64(h[a + 1]), (b,))
    lo, hi = carray(_f32(h[a + 2]), (2,)), carray(_f32(h[a + 3]), (2,))
    t = h[4]
    window, window_ent = carray(_f32(h[a + 4]), (b, t)), carray(_f32(h[a + 5]), (b, t))
    end, n_model, n_valid = carray(_i64(h[a + 6]), (b,)), carray(_i64(h[a + 7]), (b,)), carray(_i64(h[a + 8]), (b,))
    ent_sum, lp_sum = carray(_f64(h[a + 9]), (b,)), carray(_f64(h[a + 10]), (b,))
    below, below_sum = carray(_i64(h[a + 11]), (b,)), carray(_f64(h[a + 12]), (b,))
    below_above, n_window = carray(_i64(h[a + 13]), (b,)), carray(_i64(h[a + 14]), (b,))
    while True:
        r0, r1 = _ranges(h)
        if r1 <= r0:
            return
        kernels.pass_a(r0, r1, log_probs, entropys, mask, first, row_set, lo, hi, window, window_ent, end, n_model,
                       n_valid, ent_sum, lp_sum, below, below_sum, below_above, n_window)  # fmt: skip


@cfunc(types.void(types.voidptr), nogil=True, cache=True)
def _pass_a_job(data):  # pragma: no cover - compiled
    """``kernels.pass_a`` over a job's row ranges (see :func:`run_pass_a`). (The mask-kind dispatch is written out
    here and in :func:`_pass_b_job`: a compiled helper taking the rows function as an argument cannot be cached.)"""
    h = carray(_header(data), (_HEADER + 18,))
    b, t = h[3], h[4]
    log_probs, entropys = carray(_f32(h[6]), (b, t)), carray(_f32(h[7]), (b, t))
    kind = h[5]
    if kind == 0:
        _pass_a_rows(h, log_probs, entropys, carray(_u8(h[8]), (b, t)), b)
    elif kind == 1:
        _pass_a_rows(h, log_probs, entropys, carray(_i64(h[8]), (b, t)), b)
    else:
        _pass_a_rows(h, log_probs, entropys, carray(_f32(h[8]), (b, t)), b)


@numba.njit(cache=True, nogil=True)
def _pass_b_rows(h, log_probs, entropys, mask, b):  # pragma: no cover - compiled
    a = _HEADER + 3
    end, n_model, n_valid = carray(_i64(h[a]), (b,)), carray(_i64(h[a + 1]), (b,)), carray(_i64(h[a + 2]), (b,))
    high_thr = carray(_f32(h[a + 3]), (1,))[0]
    row_set, thr = carray(_i64(h[a + 4]), (b,)), carray(_f32(h[a + 5]), (2,))
    weight, allow = carray(_f32(h[a + 6]), (2,)), carray(_i64(h[a + 7]), (b,))
    row_adv, adv = carray(_f32(h[a + 8]), (b,)), carray(_f32(h[a + 9]), (b, h[4]))
    n_high, s_high, s_low = carray(_f64(h[a + 10]), (b,)), carray(_f64(h[a + 11]), (b,)), carray(_f64(h[a + 12]), (b,))
    while True:
        r0, r1 = _ranges(h)
        if r1 <= r0:
            return
        kernels.pass_b(r0, r1, log_probs, entropys, mask, end, n_model, n_valid, high_thr, row_set, thr, weight,
                       allow, row_adv, adv, n_high, s_high, s_low)  # fmt: skip


@cfunc(types.void(types.voidptr), nogil=True, cache=True)
def _pass_b_job(data):  # pragma: no cover - compiled
    """``kernels.pass_b`` (per-row advantages written whole) over a job's row ranges (see :func:`run_pass_b`)."""
    h = carray(_header(data), (_HEADER + 16,))
    b, t = h[3], h[4]
    log_probs, entropys = carray(_f32(h[6]), (b, t)), carray(_f32(h[7]), (b, t))
    kind = h[5]
    if kind == 0:
        _pass_b_rows(h, log_probs, entropys, carray(_u8(h[8]), (b, t)), b)
    elif kind == 1:
        _pass_b_rows(h, log_probs, entropys, carray(_i64(h[8]), (b, t)), b)
    else:
        _pass_b_rows(h, log_probs, entropys, carray(_f32(h[8]), (b, t)), b)


@cfunc(types.void(types.voidptr), nogil=True, cache=True)
def _chosen_sums_job(data):  # pragma: no cover - compiled
    """``kernels.chosen_sums`` over a job's row ranges (see :func:`run_chosen_sums`)."""
    h = carray(_header(data), (_HEADER + 13,))
    b = h[3]  # (h[4]: the widest row's window tokens, which sized the ranges; h[6]: the scratch's row length)
    width = carray(_i64(h[6]), (1,))[0]
    window, window_ent = carray(_f32(h[7]), (b, width)), carray(_f32(h[8]), (b, width))
    n_window, below = carray(_i64(h[9]), (b,)), carray(_i64(h[10]), (b,))
    below_sum, below_above = carray(_f64(h[11]), (b,)), carray(_i64(h[12]), (b,))
    row_set, thr, allow = carray(_i64(h[13]), (b,)), carray(_f32(h[14]), (2,)), carray(_i64(h[15]), (b,))
    n_sel, s_sel, n_above = carray(_i64(h[16]), (b,)), carray(_f64(h[17]), (b,)), carray(_i64(h[18]), (b,))
    while True:
        r0, r1 = _ranges(h)
        if r1 <= r0:
            return
        kernels.chosen_sums(r0, r1, window, window_ent, n_window, below, below_sum, below_above, row_set, thr, allow,
                            n_sel, s_sel, n_above)  # fmt: skip

_runtime: tuple[int, object] | None = None
_runtime_lock = threading.Lock()
_forked = False


def _after_fork_in_child() -> None:
    # GNU OpenMP keeps its thread pool across fork() in name only: a parallel region started in the child of a
    # process that ran one waits for threads that do not exist there. A forked child runs its own threads instead.
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def openmp_parallel():
    """torch's OpenMP runtime's ``GOMP_parallel(fn, data, num_threads, flags)`` as a ctypes function, or None where
    there is none to use: not Linux, torch's ATen parallel backend not OpenMP, no single OpenMP runtime loaded in
    this process that torch's own (under torch's package folder, or the only one mapped) could be, or a process
    forked after this module was imported (GNU OpenMP's pool does not survive a fork). Found once per process."""
    global _runtime
    if _forked:
        return None
    pid = os.getpid()
    with _runtime_lock:
        if _runtime is None or _runtime[0] != pid:
            _runtime = (pid, _find_runtime())
        return _runtime[1]


def _find_runtime():
    import torch

    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps") as f:
            mapped = {line.split(None, 5)[-1].strip() for line in f if "/" in line}
    except OSError:  # not Linux
        return None
    runtimes = sorted(p for p in mapped if os.path.basename(p).startswith(("libgomp", "libiomp5", "libomp")))
    torch_dir = os.path.dirname(os.path.realpath(torch.__file__))
    own = [p for p in runtimes if os.path.realpath(p).startswith(torch_dir + os.sep)]
    chosen = own if own else runtimes
    if len(chosen) != 1:
        return None
    try:
        fn = ctypes.CDLL(chosen[0]).GOMP_parallel  # an already loaded library: the same handle torch uses
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    fn.restype = None
    return fn


def covers(log_probs: np.ndarray, entropys: np.ndarray, mask: np.ndarray | None, adv: np.ndarray | None = None) -> bool:
    """Whether the compiled callbacks take these arrays: float32 log-probs and entropies (and advantages), a mask
    of :data:`MASK_KINDS` (None: a job without one), every ``[B, T]`` array C-contiguous."""
    arrays = (log_probs, entropys) + (() if adv is None else (adv,))
    return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays) and (
        mask is None or (mask.dtype in MASK_KINDS and mask.flags.c_contiguous)
    )


_F32, _F64, _I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)
# each array a job reads: (dtype, shape) with "BT" the batch's [B, T], "B" one entry per row, a number a fixed length
# (None as dtype: the mask, one of MASK_KINDS)
_BT, _B = "BT", "B"
_PASS_A_TYPES = ((_F32, _BT), (_F32, _BT), (None, _BT), (_I64, _B), (_I64, _B), (_F32, 2), (_F32, 2), (_F32, _BT),
                 (_F32, _BT)) + ((_I64, _B),) * 3 + ((_F64, _B), (_F64, _B), (_I64, _B), (_F64, _B), (_I64, _B),
                                                     (_I64, _B))  # fmt: skip
_PASS_B_TYPES = ((_F32, _BT), (_F32, _BT), (None, _BT), (_I64, _B), (_I64, _B), (_I64, _B), (_F32, 1), (_I64, _B),
                 (_F32, 2), (_F32, 2), (_I64, _B), (_F32, _B), (_F32, _BT), (_F64, _B), (_F64, _B),
                 (_F64, _B))  # fmt: skip


def _run(job, types_, arrays: list, shape: tuple[int, int], rows_per: int, threads: int, parallel,
         mask_at: int | None = 2) -> None:  # fmt: skip
    """Run the compiled ``job`` on ``threads`` threads of ``parallel`` over ``arrays`` (their addresses handed to
    it in this order). Every array must be C-contiguous and of the dtype ``types_`` gives at its place (None: the
    mask, one of :data:`MASK_KINDS`, at ``mask_at``; a job without a mask passes None), else ValueError: the
    callback reads raw addresses."""
    b, t = shape
    for a, (want, size) in zip(arrays, types_, strict=True):
        # "W": the window scratch, [B, its own row length]
        dims = {_BT: (b, t), _B: (b,), "W": (b, a.shape[-1])}.get(size, (size,))
        if (
            not a.flags.c_contiguous
            or a.shape != dims
            or (a.dtype != want if want is not None else a.dtype not in MASK_KINDS)
        ):
            raise ValueError(
                f"an OpenMP row pass takes C-contiguous arrays of fixed dtypes and shapes, got {a.dtype} {a.shape} "
                f"for {want or 'a mask'} {dims}"
            )
    counter = np.zeros(1, dtype=np.int64)
    kind = 0 if mask_at is None else MASK_KINDS[arrays[mask_at].dtype]
    header = [counter.ctypes.data, -(-b // rows_per), rows_per, b, t, kind]
    data = np.array(header + [a.ctypes.data for a in arrays], dtype=np.int64)
    parallel(job.address, data.ctypes.data, threads, 0)  # ctypes releases the GIL for the call


def run_pass_a(shape, rows_per: int, threads: int, parallel, log_probs, entropys, mask, first, row_set, lo, hi,
               *out) -> None:  # fmt: skip
    """``kernels.pass_a`` over every row, the ranges of ``rows_per`` rows taken by ``threads`` OpenMP threads of
    ``parallel`` (:func:`openmp_parallel`). Arrays as ``kernels.pass_a`` takes them (see :func:`covers`; ``lo`` and
    ``hi`` float32, the per-row outputs int64 / float64 as the estimator allocates them)."""
    _run(_pass_a_job, _PASS_A_TYPES, [log_probs, entropys, mask, first, row_set, lo, hi, *out], shape, rows_per,
         threads, parallel)  # fmt: skip


def run_pass_b(shape, rows_per: int, threads: int, parallel, log_probs, entropys, mask, end, n_model, n_valid,
               high_thr, row_set, thr, weight, allow, row_adv, adv, n_high, s_high, s_low) -> None:  # fmt: skip
    """``kernels.pass_b`` with per-row advantages over every row, as :func:`run_pass_a` runs pass A."""
    high = np.array([high_thr], dtype=np.float32)
    _run(_pass_b_job, _PASS_B_TYPES, [log_probs, entropys, mask, end, n_model, n_valid, high, row_set, thr, weight,
                                       allow, row_adv, adv, n_high, s_high, s_low], shape, rows_per, threads,
         parallel)  # fmt: skip


_CHOSEN_TYPES = ((_I64, 1), (_F32, "W"), (_F32, "W"), (_I64, _B), (_I64, _B), (_F64, _B), (_I64, _B), (_I64, _B),
                 (_F32, 2), (_I64, _B), (_I64, _B), (_F64, _B), (_I64, _B))  # fmt: skip


def run_chosen_sums(shape, rows_per: int, threads: int, parallel, window, window_ent, n_window, below, below_sum,
                    below_above, row_set, thr, allow, n_sel, s_sel, n_above) -> None:  # fmt: skip
    """``kernels.chosen_sums`` over every row, as :func:`run_pass_a` runs pass A (``shape``: ``(B, widest)``, the
    ranges sized by the window tokens a row holds; ``window``/``window_ent``: the float32 ``[B, T]`` scratch)."""
    width = np.array([window.shape[1]], dtype=np.int64)
    _run(_chosen_sums_job, _CHOSEN_TYPES, [width, window, window_ent, n_window, below, below_sum, below_above, row_set,
                                           thr, allow, n_sel, s_sel, n_above], shape, rows_per, threads, parallel,
         mask_at=None)  # fmt: skip
