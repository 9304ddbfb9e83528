"""The group baseline's per-response statistics in one compiled loop over ``[B]`` (the per-response GRPO advantages
of :func:`stare_verl.methods.group_baseline.group_row_advantage`).

The same arithmetic as verl's ``grpo_vectorized`` (``verl.utils.groupwise.group_mean_std``: float32 group counts,
sums and centred squares accumulated in row order, as ``index_add_`` on CPU does; Bessel-corrected variance; mean 0
and std 1 for a group of one; then ``(r - mean) / (std + epsilon)`` in the rewards' dtype, or ``r - mean`` for
Dr.GRPO) and :func:`stare_verl.methods.group_baseline.zero_variance_groups` (exact zeros for groups whose rewards are
all equal up to ``tol``), without the dozen small torch and NumPy calls they take per step (about 0.5 ms a step on
the CPU, measured in ``docs/results/estimator-speed.md``). ``tests/stare_verl/methods/test_group_kernels.py``
checks the result bit for bit against verl's function (its square root is torch's, as in verl).

Imported lazily by :mod:`stare_verl.methods.group_baseline` (``import numba`` takes about 0.4 s).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def group_moments(scores, codes, n_groups, tol):  # pragma: no cover - compiled
    """verl's group statistics before the square root, and the zero-variance groups.

    Args:
        scores: ``[B]`` float32 or float64 outcome rewards (the token-level rewards' row sums), all finite.
        codes: ``[B]`` int64 group codes in ``0..n_groups-1``.
        n_groups: the number of groups.
        tol: float64 zero-variance tolerance (:func:`~stare_verl.methods.group_baseline.zero_variance_groups`).

    Returns:
        ``(count, mean, var, zero)``: ``[n_groups]`` float32 counts, means (0 for a group of one, verl's
        convention) and Bessel-corrected variances (before verl's clamp at 0 and its square root, which
        :func:`group_row_advantage` leaves to torch: torch's float32 ``sqrt`` on the CPU is not always the correctly
        rounded one), and bool zero-variance flags.
    """
    f32 = np.float32
    count = np.zeros(n_groups, dtype=np.float32)
    s1 = np.zeros(n_groups, dtype=np.float32)
    hi = np.full(n_groups, -np.inf)
    lo = np.full(n_groups, np.inf)
    b = scores.shape[0]
    for i in range(b):  # verl's float32 index_add_: in row order
        c = codes[i]
        count[c] += f32(1.0)
        s1[c] += f32(scores[i])
        r = np.float64(scores[i])
        hi[c] = max(hi[c], r)
        lo[c] = min(lo[c], r)
    mean = np.empty(n_groups, dtype=np.float32)
    for g in range(n_groups):
        mean[g] = s1[g] / max(count[g], f32(1.0))
    var_num = np.zeros(n_groups, dtype=np.float32)
    for i in range(b):
        c = codes[i]
        d = f32(scores[i]) - mean[c]
        var_num[c] += d * d
    var = np.empty(n_groups, dtype=np.float32)
    zero = np.zeros(n_groups, dtype=np.bool_)
    for g in range(n_groups):
        var[g] = var_num[g] / max(count[g] - f32(1.0), f32(1.0))
        if count[g] <= f32(1.0):  # a group of one: mean 0 (and std 1), so A = r
            mean[g] = f32(0.0)
        else:
            scale = max(1.0, max(abs(hi[g]), abs(lo[g])))
            zero[g] = hi[g] - lo[g] <= tol * scale
    return count, mean, var, zero


@numba.njit(cache=True, nogil=True)
def group_row_advantages(scores, codes, count, mean, std, zero, epsilon, norm_by_std, out):  # pragma: no cover
    """Each response's advantage from its group's statistics (:func:`group_moments`, ``std`` the float32 square root
    of the clamped variance): ``(r - mean) / (std + epsilon)`` (GRPO, std 1 for a group of one) or ``r - mean``
    (Dr.GRPO), computed in ``out``'s dtype (the rewards' promoted with float32, as verl's), 0 in a zero-variance
    group. ``epsilon``: float32 (verl adds it to the float32 std)."""
    dtype = out.dtype.type
    for i in range(scores.shape[0]):
        c = codes[i]
        if zero[c]:
            out[i] = dtype(0.0)
        elif norm_by_std:
            sd = std[c] if count[c] > np.float32(1.0) else np.float32(1.0)
            out[i] = (dtype(scores[i]) - dtype(mean[c])) / dtype(sd + epsilon)
        else:
            out[i] = dtype(scores[i]) - dtype(mean[c])
