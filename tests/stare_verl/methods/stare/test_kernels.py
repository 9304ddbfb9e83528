"""The compiled per-row pass of the covariance metrics against a NumPy reference (stare_verl.methods.stare.kernels)."""

import numpy as np
import pytest

from stare_verl.methods.stare.kernels import log_prob_row_stats


def _reference(lp, mask, threshold):
    thr = lp.dtype.type(threshold)
    high = mask & (lp < thr)
    return (
        high.sum(axis=1).astype(np.float64),
        np.where(high, lp, 0).sum(axis=1, dtype=np.float64),
        np.where(mask, lp, 0).sum(axis=1, dtype=np.float64),
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(7, 129), (1, 1), (3, 0), (0, 5)])
def test_matches_numpy(dtype, shape):
    rng = np.random.default_rng(0)
    lp = (-rng.random(shape) ** 3 * 6).astype(dtype)
    mask = rng.random(shape) < 0.7
    got = log_prob_row_stats(lp, mask, -0.4)
    ref = _reference(lp.astype(np.float64) if dtype == np.float16 else lp, mask, -0.4)
    np.testing.assert_array_equal(got[0], ref[0])  # counts are exact
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-5, atol=1e-4)


def test_threshold_is_strict_and_compared_in_the_log_probs_dtype():
    thr = -0.1  # float32(-0.1) != -0.1: a token holding float32(-0.1) is not below the float32 threshold
    lp = np.array([[np.float32(thr), -0.2, -0.05, -3.0]], dtype=np.float32)
    n_hi, s_hi, s_all = log_prob_row_stats(lp, np.ones_like(lp, dtype=bool), thr)
    assert n_hi[0] == 2.0
    assert s_hi[0] == pytest.approx(-3.2, rel=1e-6)
    assert s_all[0] == pytest.approx(float(lp.sum(dtype=np.float64)), rel=1e-6)


def test_masked_tokens_never_count_and_non_finite_values_reach_the_row_total():
    lp = np.array([[-5.0, -6.0, -0.01], [-5.0, np.nan, -1.0], [np.inf, -2.0, -2.0]], dtype=np.float32)
    mask = np.array([[False, True, True], [True, False, True], [False, True, True]])
    n_hi, s_hi, s_all = log_prob_row_stats(lp, mask, -0.5)
    assert n_hi[0] == 1.0 and s_hi[0] == -6.0 and s_all[0] == pytest.approx(-6.01)
    # a NaN/inf anywhere in a row, masked or not, makes the row total non-finite: the finiteness check
    assert not np.isfinite(s_all[1]) and not np.isfinite(s_all[2])


def test_non_contiguous_inputs():
    rng = np.random.default_rng(1)
    lp = -rng.random((6, 40)).astype(np.float32)
    mask = rng.random((6, 40)) < 0.5
    got = log_prob_row_stats(lp[::2, ::3], mask[::2, ::3], -0.3)
    ref = _reference(np.ascontiguousarray(lp[::2, ::3]), np.ascontiguousarray(mask[::2, ::3]), -0.3)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-6)


@pytest.mark.parametrize(
    "lp, mask, match",
    [
        (np.zeros((2, 3), np.float32), np.ones((2, 4), bool), "one \\[B, T\\] shape"),
        (np.zeros(3, np.float32), np.ones(3, bool), "one \\[B, T\\] shape"),
        (np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32), "mask must be bool"),
        (np.zeros((2, 3), np.complex64), np.ones((2, 3), bool), "real numbers"),
        (np.zeros((2, 3), object), np.ones((2, 3), bool), "real numbers"),
        ([[0.0, 1.0]], np.ones((1, 2), bool), "NumPy arrays"),
    ],
)
def test_bad_input_is_a_clear_error(lp, mask, match):
    with pytest.raises(ValueError, match=match):
        log_prob_row_stats(lp, mask, 0.0)


@pytest.mark.parametrize("threshold", [None, "0.1", True, [0.1]])
def test_a_threshold_that_is_no_real_number_is_a_clear_error(threshold):
    with pytest.raises(ValueError, match="threshold must be a real number"):
        log_prob_row_stats(np.zeros((1, 2), np.float32), np.ones((1, 2), bool), threshold)
