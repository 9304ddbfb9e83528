"""The faster estimator (one pass over the rewards, selection from a sampled bound) gives the results of the
implementation it replaced, kept here (``_old_*``, not in the product) as the reference: random batches, ties at
the threshold, degenerate groups (all-equal rewards, all-masked rows, single-token rows), non-finite rewards, O1 and
C2, whole-batch and chunked scope, and batches large enough that the sampled path runs."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import stare_verl.methods.group_baseline as group_baseline
import stare_verl.methods.stare.core as core
import stare_verl.methods.stare.method as stare_method
from stare_verl.methods.stare import compute_stare_advantage


# --- the replaced implementation ----------------------------------------------------------------------------------
def _old_select_top_surprisal(log_probs, candidates, ratio):
    values = log_probs[candidates]
    n = values.size
    k = core.top_count(ratio, n)
    if k == 0:
        return np.zeros_like(candidates), None
    if k >= n:
        return candidates.copy(), -float(values.max())
    values.partition(k - 1)
    thr = values[k - 1]
    if not np.any(values[k:] == thr):
        with np.errstate(invalid="ignore"):
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
    if tied.size > need:
        ties.reshape(-1)[tied[need:]] = False
    selected |= ties
    return selected, -float(thr)


def _old_group_advantage(token_level_rewards, response_mask, index, cfg):
    from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

    scores = token_level_rewards.sum(dim=-1)
    bad = ~torch.isfinite(scores)
    n_bad = int(bad.sum())
    kw = {"epsilon": cfg.epsilon, "norm_adv_by_std_in_grpo": cfg.norm_adv_by_std_in_grpo is not False}
    codes, n_groups = group_baseline.verl_group_codes(index)
    if n_bad == 0:
        adv, _ = compute_grpo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, **kw)
    else:
        adv = torch.zeros_like(token_level_rewards)
        keep = (~bad).nonzero(as_tuple=True)[0]
        if keep.numel():
            idx = codes[keep.cpu().numpy()]
            sub, _ = compute_grpo_vectorized_outcome_advantage(token_level_rewards[keep], response_mask[keep], idx, **kw)
            adv[keep] = sub.to(adv.dtype)
    scores_np = scores.detach().double().cpu().numpy()
    if n_bad:
        finite = ~bad.cpu().numpy()
        left = np.bincount(codes[finite], minlength=n_groups)
        cut = (np.bincount(codes, minlength=n_groups) > 1) & (left == 1)
        cut_rows = cut[codes] & finite
        if cut_rows.any():
            adv[torch.from_numpy(cut_rows).to(adv.device)] = 0.0
    zero_var = group_baseline.zero_variance_groups(scores_np, codes, n_groups, ~bad.cpu().numpy(), cfg.zero_variance_tol)
    rows = zero_var[codes]
    if rows.any():
        adv[torch.from_numpy(rows).to(adv.device)] = 0.0
    return adv, n_bad, float(np.count_nonzero(zero_var)) / max(n_groups, 1)


def _old_run(monkeypatch, *args, **kwargs):
    with monkeypatch.context() as m:
        m.setattr(core, "select_top_surprisal", _old_select_top_surprisal)
        m.setattr(stare_method, "group_advantage", _old_group_advantage)
        m.setattr(stare_method, "group_row_advantage", lambda *a: None)  # the [B, T] GRPO advantages, as before
        return _run(*args, **kwargs)


# --- batches ------------------------------------------------------------------------------------------------------
def _batch(b, t, seed, group=8, ties=False, degenerate=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(b, t)
    rewards[torch.arange(b), lengths - 1] = torch.randint(0, 3, (b,), generator=g).float() / 2
    logp = -torch.rand(b, t, generator=g).pow(3) * 6.0
    if ties:  # few distinct values: many candidates tie at the threshold
        logp = -torch.randint(0, 6, (b, t), generator=g).float()
    ent = torch.rand(b, t, generator=g) * 0.3
    if degenerate:
        rewards[:group] = 0.0
        rewards[:group, 0] = 0.7  # a group of all-equal rewards (verl leaves a float residue)
        mask[group] = 0.0  # an all-masked row
        rewards[group] = 0.0
        mask[group + 1] = 0.0
        mask[group + 1, 0] = 1.0  # a single-token row
        rewards[group + 2, 0] = float("nan")  # a non-finite reward
        logp[group + 3, :3] = float("nan")  # non-finite log-probs (left out of the selection)
    uid = np.array([f"q{i // group}" for i in range(b)], dtype=object)
    return rewards, mask, uid, logp, ent


def _run(batch, variant, scope="batch"):
    rewards, mask, uid, logp, ent = batch
    algo = OmegaConf.create({"norm_adv_by_std_in_grpo": True,
                             "stare": {"variant": variant, "scope": scope, "chunk_size": 16, "top_p_ratio": 0.1}})  # fmt: skip
    metrics = {}
    adv, _ = compute_stare_advantage(rewards.clone(), mask, uid, algo, old_log_probs=logp, entropys=ent, metrics=metrics)
    return adv, metrics


def _same(new, old):
    (a_new, m_new), (a_old, m_old) = new, old
    np.testing.assert_allclose(a_new.numpy(), a_old.numpy(), rtol=0, atol=1e-6)
    assert m_new.keys() == m_old.keys()
    for key, v in m_old.items():
        assert (math.isnan(v) and math.isnan(m_new[key])) or m_new[key] == pytest.approx(v, rel=1e-6, abs=1e-6), key


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize(
    ("b", "t", "ties", "degenerate", "scope"),
    [(16, 7, False, False, "batch"), (64, 300, True, True, "batch"), (64, 300, False, True, "chunk"),
     (96, 4096, False, True, "batch"), (96, 4096, True, False, "batch"), (64, 4096, True, True, "chunk")],
)  # fmt: skip
@pytest.mark.parametrize("sampled_min", [core.SAMPLED_SELECTION_MIN, 2048])
def test_the_estimator_gives_the_replaced_implementations_results(monkeypatch, variant, b, t, ties, degenerate, scope,
                                                                  sampled_min):  # fmt: skip
    monkeypatch.setattr(core, "SAMPLED_SELECTION_MIN", sampled_min)  # 2048: the sampled path in every large case
    for seed in range(2):
        batch = _batch(b, t, seed, ties=ties, degenerate=degenerate)
        new = _run(batch, variant, scope)
        assert new[1]["stare/gate_on"] == 1.0
        _same(new, _old_run(monkeypatch, batch, variant, scope))


def test_the_sampled_path_runs_and_matches_a_full_partition(monkeypatch):
    rng = np.random.default_rng(0)
    lp = -(rng.random((64, 4096)) ** 3 * 6).astype(np.float32)
    cand = rng.random((64, 4096)) < 0.7
    n = int(cand.sum())
    assert n >= core.SAMPLED_SELECTION_MIN
    for k in (1, 7, n // 10, n // 2, n - 1):
        thr, at_most = core._kth_smallest_candidate(lp, cand, n, k)
        ref = np.sort(lp[cand])
        assert thr == ref[k - 1] and at_most == int(np.count_nonzero(ref <= thr))
    # a sample that misrepresents the batch (the strided positions hold the smallest values, so fewer than k lie at
    # or below its bound): the full partition
    stride = lp.size // core.SAMPLE_SIZE
    flat = lp.reshape(-1).copy()
    flat[stride // 2 :: stride] = -100.0
    skewed = flat.reshape(lp.shape)
    cand = np.ones_like(cand)
    n = cand.size
    k = n // 10
    below_bound = []
    real_kth = core._kth_of
    monkeypatch.setattr(core, "_kth_of", lambda values, k: below_bound.append(values.size) or real_kth(values, k))
    thr, at_most = core._kth_smallest_candidate(skewed, cand, n, k)
    assert below_bound == [n]  # every candidate was partitioned
    assert thr == np.sort(skewed.reshape(-1))[k - 1] and at_most == k


# --- the fused CPU path (two compiled passes) against the step-by-step NumPy path it replaced for whole-batch scope --
def _step_by_step_run(monkeypatch, batch, variant, scope="batch"):
    import stare_verl.methods.stare.fused as fused

    with monkeypatch.context() as m:
        m.setattr(fused, "supports", lambda *a: False)
        return _run(batch, variant, scope)


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize(
    ("b", "t", "ties", "degenerate"),
    [(16, 7, False, False), (64, 300, True, True), (96, 4096, False, True), (96, 4096, True, False),
     (512, 1024, False, False)],
)  # fmt: skip
def test_the_fused_path_gives_the_step_by_step_results(monkeypatch, variant, b, t, ties, degenerate):
    for seed in range(2):
        batch = _batch(b, t, seed, ties=ties, degenerate=degenerate)
        new = _run(batch, variant)
        assert new[1]["stare/gate_on"] == 1.0 and new[1]["stare/frac_l_plus"] > 0
        _same(new, _step_by_step_run(monkeypatch, batch, variant))


@pytest.mark.parametrize("variant", ["O1", "C2"])
def test_a_window_that_misses_the_threshold_falls_back_to_every_candidate(monkeypatch, variant):
    import stare_verl.methods.stare.fused as fused

    batch = _batch(512, 1024, 3)
    ref = _step_by_step_run(monkeypatch, batch, variant)
    for lo, hi in ((-0.01, 0.0), (-100.0, -99.0)):  # above, below the threshold: the k-th smallest lies outside

        def skewed(log_probs, *args, lo=lo, hi=hi):
            return np.full(2, lo, dtype=log_probs.dtype), np.full(2, hi, dtype=log_probs.dtype)

        calls = []

        def counted(*args, calls=calls, real=fused._pass_a):
            calls.append(1)
            return real(*args)

        monkeypatch.setattr(fused, "_windows", skewed)
        monkeypatch.setattr(fused, "_pass_a", counted)
        _same(_run(batch, variant), ref)
        assert len(calls) == 2  # the second pass A, with every candidate in the window
        monkeypatch.undo()


@pytest.mark.parametrize("variant", ["O1", "C2"])
def test_the_block_sample_gives_a_narrow_window_that_holds_the_threshold(monkeypatch, variant):
    """The sample reads blocks of adjacent positions: on a batch of independent surprisals (the bench's) its window
    holds the k-th smallest at the first pass A and holds a few percent of the candidates, not all of them."""
    import stare_verl.methods.stare.fused as fused

    for seed in range(3):
        batch = _batch(256, 2048, seed)
        windows, calls = [], []
        real_windows, real_pass_a = fused._windows, fused._pass_a

        def recorded(log_probs, mask, row_set, n_sets, ratio, out=windows, real_windows=real_windows):
            lo, hi = real_windows(log_probs, mask, row_set, n_sets, ratio)
            cand = (mask > 0) & (row_set[:, None] >= 0)  # every set's candidates (the bounds are per set)
            for s in range(n_sets):
                in_set = (mask > 0) & (row_set[:, None] == s)
                out.append(np.count_nonzero(in_set & (log_probs >= lo[s]) & (log_probs <= hi[s])) / in_set.sum())
            assert cand.any()
            return lo, hi

        def counted(*args, calls=calls, real_pass_a=real_pass_a):
            calls.append(1)
            return real_pass_a(*args)

        with monkeypatch.context() as m:
            m.setattr(fused, "_windows", recorded)
            m.setattr(fused, "_pass_a", counted)
            new = _run(batch, variant)
        assert len(calls) == 1  # the window held the k-th smallest: no second pass A
        assert len(windows) == (2 if variant == "C2" else 1)
        assert all(0.0 < share < 0.06 for share in windows), windows  # +-5 standard errors of 0.1 at ~8k draws
        _same(new, _step_by_step_run(monkeypatch, batch, variant))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64])
def test_the_fused_path_across_dtypes(monkeypatch, dtype, mask_dtype):
    rewards, mask, uid, logp, ent = _batch(64, 300, 5, ties=True, degenerate=True)
    batch = (rewards.to(dtype), mask.to(mask_dtype), uid, logp.to(dtype), ent.to(dtype))
    new = _run(batch, "C2")
    assert new[0].dtype == dtype
    _same(new, _step_by_step_run(monkeypatch, batch, "C2"))
