"""Compiled (numba) per-row pass over the old log-probs of a batch, for :func:`stare_verl.methods.stare.core.token_masks`.

Imported lazily by :mod:`stare_verl.methods.stare.core` (``import numba`` takes about 0.4 s, which processes that never compute
an advantage should not pay). The kernel is cached on disk (``cache=True``: ``__pycache__`` beside this file, or
numba's user-wide cache when that is read-only), so only the first process on a machine compiles it (~0.4 s).
"""

from __future__ import annotations

import numba
import numpy as np

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
