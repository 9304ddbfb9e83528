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


def _pass_a(lp, ent, mask, row_set, lo, hi):
    """kernels.pass_a over every row: (n_model, n_valid, ent_sum, lp_sum, below, below_sum, below_above, n_window)."""
    from stare_verl.methods.stare import kernels

    b, t = lp.shape
    window, window_ent = np.empty_like(lp), np.empty_like(ent)
    ints = [np.empty(b, dtype=np.int64) for _ in range(3)]
    out = [np.empty(b), np.empty(b), np.empty(b, dtype=np.int64), np.empty(b), np.empty(b, dtype=np.int64)]
    out.append(np.empty(b, dtype=np.int64))
    kernels.pass_a(0, b, lp, ent, mask, kernels.first_model(mask), row_set, lo, hi, window, window_ent, *ints, *out)
    _, n_model, n_valid = ints
    ent_sum, lp_sum, below, below_sum, below_above, n_window = out
    return n_model, n_valid, ent_sum, lp_sum, below, below_sum, below_above, n_window, window


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pass_a_block_sums_are_float64_sums_of_long_rows(dtype):
    # rows of 16384 tokens (16 blocks): the blocks' sums in the inputs' dtype, added in float64, stay within 1e-7 of
    # the float64 sums (measured 3e-8 at worst for float32)
    rng = np.random.default_rng(1)
    b, t = 8, 16384
    lp = (-(rng.random((b, t)) ** 3) * 20).astype(dtype)
    ent = (rng.random((b, t)) * 8).astype(dtype)
    mask = (rng.random((b, t)) < 0.9).astype(np.float32)
    mask[:, 12000:] = 0.0  # padding after the last model token
    row_set = np.array([0, -1, 1, 0, -1, 1, 0, 0])
    lo, hi = np.array([-4.0, -9.0], dtype=dtype), np.array([-3.5, -8.0], dtype=dtype)
    n_model, n_valid, ent_sum, lp_sum, below, below_sum, below_above, n_window, window = _pass_a(
        lp, ent, mask, row_set, lo, hi
    )
    m = mask > 0
    np.testing.assert_array_equal(n_model, m.sum(1))
    np.testing.assert_array_equal(n_valid, m.sum(1))
    np.testing.assert_allclose(ent_sum, np.where(m, ent, 0).sum(1, dtype=np.float64), rtol=1e-7)
    np.testing.assert_allclose(lp_sum, np.where(m, lp, 0).sum(1, dtype=np.float64), rtol=1e-7)
    for i, s in enumerate(row_set):
        if s < 0:
            continue
        low = m[i] & (lp[i] < lo[s])
        assert below[i] == low.sum() and below_above[i] == (low & (-lp[i] > ent[i])).sum()
        assert below_sum[i] == pytest.approx(lp[i][low].sum(dtype=np.float64), rel=1e-7)
        inside = m[i] & (lp[i] >= lo[s]) & (lp[i] <= hi[s])
        assert n_window[i] == inside.sum() > 0
        np.testing.assert_array_equal(window[i, : n_window[i]], lp[i][inside])  # in row order


def test_pass_a_sums_a_row_again_in_float64_when_its_block_sums_overflow():
    # float32 values whose float32 block sum overflows to inf but whose float64 sum is finite
    b, t = 2, 2048
    lp = np.full((b, t), -1.0, dtype=np.float32)
    lp[0, :4] = -3e38
    ent = np.ones((b, t), dtype=np.float32)
    mask = np.ones((b, t), dtype=np.float32)
    lo, hi = np.array([-2.0, -2.0], dtype=np.float32), np.array([-0.5, -0.5], dtype=np.float32)
    n_model, n_valid, ent_sum, lp_sum, below, below_sum, *_ = _pass_a(lp, ent, mask, np.array([0, 0]), lo, hi)
    assert n_valid.tolist() == [t, t]
    assert lp_sum[0] == pytest.approx(4 * -3e38 - (t - 4), rel=1e-7) and np.isfinite(lp_sum[0])
    assert below.tolist() == [4, 0] and below_sum[0] == pytest.approx(4 * -3e38, rel=1e-7)
    assert lp_sum[1] == -t and ent_sum.tolist() == [t, t]


@pytest.mark.parametrize("t", [7, 16, 100, 1000])
@pytest.mark.parametrize("stride", [1, 3, 64])
def test_the_sample_reads_the_documented_positions(t, stride):
    from stare_verl.methods.stare import kernels

    rng = np.random.default_rng(t + stride)
    b = 37
    lp = (-rng.random((b, t)) * 5).astype(np.float32)
    lp[rng.random((b, t)) < 0.05] = np.nan
    lp[rng.random((b, t)) < 0.02] = -np.inf
    mask = (rng.random((b, t)) < 0.8).astype(np.int64)
    row_set = rng.integers(-1, 2, b)
    samples, counts = kernels.sample_candidates(lp, mask, row_set, 2, stride)
    # the reference: flat positions p0 + q * BLOCK * stride + r, r < BLOCK, in order
    size, step = b * t, kernels.SAMPLE_BLOCK * stride
    p0 = step // 2 if size > step else 0
    pos = np.array([p for q in range(p0, size, step) for p in range(q, min(q + kernels.SAMPLE_BLOCK, size))])
    r, c = pos // t, pos % t
    for s in (0, 1):
        keep = (row_set[r] == s) & (mask[r, c] > 0) & np.isfinite(lp[r, c])
        assert counts[s] == keep.sum()
        np.testing.assert_array_equal(samples[s, : counts[s]], lp[r, c][keep])
