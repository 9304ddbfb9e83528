"""The estimator's CPU path without the [B, T] GRPO advantages (issue 49): ``compute_stare_advantage`` hands the
per-response advantages (``group_row_advantage``) to ``stare_reweight_rows``, whose pass B writes the effective
advantages once. It must give what the materialised paths give (``stare_advantages(inplace=False)``: the [B, T] GRPO
advantages through the fused passes; and the step-by-step NumPy path), advantages and every metric, on random
batches, ties, degenerate groups, non-finite inputs, tool-use masks, every mask dtype, bf16 and non-contiguous
inputs, gate on and off."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import stare_verl.methods.stare.fused as fused
from stare_verl.methods.group_baseline import GroupConfig, group_advantage, group_row_advantage
from stare_verl.methods.stare import compute_stare_advantage
from stare_verl.methods.stare.config import parse_stare_config
from stare_verl.methods.stare.controller import StareController
from stare_verl.methods.stare.method import stare_advantages

GROUP = 8


def _batch(b, t, seed, ties=False, degenerate=False, nonfinite=False, tool=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(b, t)
    rewards[torch.arange(b), lengths - 1] = torch.randint(0, 3, (b,), generator=g).float() / 2
    logp = -torch.rand(b, t, generator=g).pow(3) * 6.0
    if ties:  # few distinct values: many candidates tie at the threshold
        logp = -torch.randint(0, 6, (b, t), generator=g).float()
    ent = torch.rand(b, t, generator=g) * 0.3
    uid = np.array([f"q{i // GROUP}" for i in range(b)], dtype=object)
    if degenerate:
        rewards[:GROUP] = 0.0
        rewards[:GROUP, 0] = 0.7  # a group of all-equal rewards (verl leaves a float residue, the baseline 0)
        mask[GROUP] = 0.0  # an all-masked row
        mask[GROUP + 1] = 0.0
        mask[GROUP + 1, 0] = 1.0  # a single-token row
        uid[-1] = "alone"  # a single-sample group: verl's A = r
    if nonfinite:
        r = torch.rand(b, t, generator=g)
        logp[r < 0.01] = float("nan")
        logp[(r > 0.5) & (r < 0.505)] = -float("inf")
        ent[(r > 0.7) & (r < 0.71)] = float("nan")
        ent[(r > 0.8) & (r < 0.802)] = float("inf")
        logp[3] = float("nan")  # a row without a valid token
    if tool:  # tool output inside the responses: mask 0 in the middle
        for i in range(0, b, 2):
            n = int(lengths[i])
            if n > 4:
                mask[i, n // 4 : n // 4 + max(1, n // 5)] = 0.0
        mask[torch.rand(b, t, generator=g) < 0.05] = 0.0
    return rewards, mask, uid, logp, ent


def _algo(variant, **stare):
    return OmegaConf.create({"norm_adv_by_std_in_grpo": True, "stare": {"variant": variant, "top_p_ratio": 0.1,
                                                                        **stare}})  # fmt: skip


def _rows_path(batch, algo, monkeypatch):
    """compute_stare_advantage, asserting that it took the path without the [B, T] GRPO advantages."""
    rewards, mask, uid, logp, ent = batch
    calls = []
    real = fused.fused_reweight_rows
    with monkeypatch.context() as m:
        m.setattr(fused, "fused_reweight_rows", lambda *a: calls.append(1) or real(*a))
        metrics = {}
        adv, ret = compute_stare_advantage(rewards.clone(), mask, uid, algo, old_log_probs=logp, entropys=ent,
                                           metrics=metrics)  # fmt: skip
    assert calls == [1] and adv is ret
    return adv, metrics


def _materialised(batch, algo):
    """stare_advantages without inplace: the [B, T] GRPO advantages (group_advantage), then the fused passes."""
    rewards, mask, uid, logp, ent = batch
    metrics = {}
    _, eff = stare_advantages(rewards.clone(), mask, uid, logp, ent, StareController(parse_stare_config(algo)),
                              metrics)  # fmt: skip
    return eff, metrics


def _step_by_step(batch, algo, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(fused, "supports", lambda *a: False)
        return _materialised(batch, algo)


def _same(new, old):
    (a_new, m_new), (a_old, m_old) = new, old
    assert a_new.dtype == a_old.dtype and a_new.shape == a_old.shape
    np.testing.assert_allclose(a_new.double().numpy(), a_old.double().numpy(), rtol=0, atol=1e-6)
    assert m_new.keys() == m_old.keys()
    for key, v in m_old.items():
        assert (math.isnan(v) and math.isnan(m_new[key])) or m_new[key] == pytest.approx(v, rel=1e-6, abs=1e-6), key


KINDS = {
    "random": {},
    "ties": {"ties": True},
    "degenerate": {"degenerate": True},
    "nonfinite": {"nonfinite": True},
    "tool": {"tool": True},
    "all": {"ties": True, "degenerate": True, "nonfinite": True, "tool": True},
}


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("b", "t"), [(16, 7), (64, 300), (512, 1024)])  # the last: the sampled window
def test_the_rows_path_gives_the_materialised_results(monkeypatch, variant, kind, b, t):
    batch = _batch(b, t, seed=b + t, **KINDS[kind])
    algo = _algo(variant)
    new = _rows_path(batch, algo, monkeypatch)
    assert new[1]["stare/gate_on"] == 1.0 and new[1]["stare/frac_l_plus"] > 0
    _same(new, _materialised(batch, algo))
    _same(new, _step_by_step(batch, algo, monkeypatch))


def _cast(batch, how):
    rewards, mask, uid, logp, ent = batch
    if how in ("bool", "int64", "float64"):
        mask = mask.to(getattr(torch, how))
    elif how == "all_float64":
        rewards, mask, logp, ent = rewards.double(), mask.double(), logp.double(), ent.double()
    elif how == "bf16":
        rewards, logp, ent = rewards.bfloat16(), logp.bfloat16(), ent.bfloat16()
    elif how == "non_contiguous":  # strided views of wider tensors
        wide_mask, wide_lp = torch.zeros(mask.shape[0], 2 * mask.shape[1]), torch.zeros(logp.shape[0], 2 * logp.shape[1])
        wide_mask[:, ::2], wide_lp[:, 1::2] = mask, logp
        mask, logp = wide_mask[:, ::2], wide_lp[:, 1::2]
        assert not mask.is_contiguous() and not logp.is_contiguous()
    return rewards, mask, uid, logp, ent


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("how", ["bool", "int64", "float64", "all_float64", "bf16", "non_contiguous"])
def test_the_rows_path_across_dtypes_and_layouts(monkeypatch, variant, how):
    batch = _cast(_batch(96, 600, 7, ties=True, degenerate=True, nonfinite=True, tool=True), how)
    algo = _algo(variant)
    new = _rows_path(batch, algo, monkeypatch)
    _same(new, _materialised(batch, algo))
    _same(new, _step_by_step(batch, algo, monkeypatch))


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("stare", [{"target_entropy": 0.01}, {"top_p_ratio": 1.0}])  # gate off; every candidate
def test_the_rows_path_with_the_gate_off_and_every_candidate_chosen(monkeypatch, variant, stare):
    batch = _batch(64, 300, 11, degenerate=True, tool=True)
    algo = _algo(variant, **stare)
    new = _rows_path(batch, algo, monkeypatch)
    assert new[1]["stare/gate_on"] == (0.0 if "target_entropy" in stare else 1.0)
    old = _materialised(batch, algo)
    _same(new, old)
    if "target_entropy" in stare:  # nothing reweighted: the GRPO advantages
        rewards, mask, uid, _, _ = batch
        base, _, _ = group_advantage(rewards, mask, uid, GroupConfig())
        assert torch.equal(new[0], base)


def test_non_finite_rewards_and_chunked_scope_take_the_materialised_path(monkeypatch):
    rewards, mask, uid, logp, ent = _batch(64, 300, 3)
    rewards[2, 0] = float("nan")
    calls = []
    real = fused.fused_reweight_rows
    monkeypatch.setattr(fused, "fused_reweight_rows", lambda *a: calls.append(1) or real(*a))
    for batch, algo in (((rewards, mask, uid, logp, ent), _algo("C2")),
                        (_batch(64, 300, 3), _algo("C2", scope="chunk", chunk_size=16))):  # fmt: skip
        metrics = {}
        adv, _ = compute_stare_advantage(batch[0].clone(), batch[1], batch[2], algo, old_log_probs=batch[3],
                                         entropys=batch[4], metrics=metrics)  # fmt: skip
        _same((adv, metrics), _materialised(batch, algo))
    assert calls == []
    assert metrics["entropy_control/nonfinite_rewards"] == 0.0  # the chunked batch's rewards are finite


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("reward_dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32, torch.float64])
def test_row_advantages_times_the_mask_are_the_group_advantages(norm, reward_dtype, mask_dtype):
    rewards, mask, uid, _, _ = _batch(64, 50, 5, degenerate=True, tool=True)
    rewards, mask = rewards.to(reward_dtype), mask.to(mask_dtype)
    cfg = GroupConfig(norm_adv_by_std_in_grpo=norm)
    row, share = group_row_advantage(rewards, mask, uid, cfg)
    base, n_bad, base_share = group_advantage(rewards, mask, uid, cfg)
    assert row.shape == (64,) and n_bad == 0 and share == base_share >= 1 / 9
    full = row[:, None] * mask
    assert full.dtype == base.dtype and torch.equal(full, base)
    assert torch.equal(row[:GROUP], torch.zeros(GROUP, dtype=row.dtype))  # the zero-variance group
    # the single-sample group: verl's A = r (over std 1 + epsilon with GRPO)
    assert float(row[-1]) == pytest.approx(float(rewards[-1].sum()), rel=1e-5) and float(row[-1]) != 0.0


def test_row_advantages_leave_non_finite_rewards_to_group_advantage():
    rewards, mask, uid, _, _ = _batch(16, 7, 0)
    rewards[1, 0] = float("inf")
    assert group_row_advantage(rewards, mask, uid, GroupConfig()) is None


@pytest.mark.parametrize("gate_on", [True, False])
@pytest.mark.parametrize("variant", ["O1", "C2"])
def test_fused_reweight_rows_is_fused_reweight_of_the_broadcast_advantages(variant, gate_on):
    rng = np.random.default_rng(4)
    b, t = 40, 257
    mask = (rng.random((b, t)) < 0.8).astype(np.float32)
    mask[0] = 0.0
    mask[1, 5:] = 0.0
    mask[2, :9] = 0.0  # a row whose first model token is not at 0
    mask[3] = np.where(mask[3] > 0, 0.5, 0.0)  # a float mask of other values: row_adv * mask as torch computes it
    row = np.repeat(np.linspace(-1.5, 1.5, b // GROUP).astype(np.float32), GROUP)
    row[GROUP : 2 * GROUP] = 0.0
    lp = -(rng.random((b, t)) ** 3 * 6).astype(np.float32)
    ent = (rng.random((b, t)) * 0.3).astype(np.float32)
    base = (torch.from_numpy(row)[:, None] * torch.from_numpy(mask)).numpy()

    def decide(_):
        return gate_on, 1.1, 0.9

    want, step_want = fused.fused_reweight(base.copy(), mask, lp, ent, decide, 0.1, variant, inplace=True)
    got, step_got = fused.fused_reweight_rows(row, mask, lp, ent, decide, 0.1, variant)
    assert got.dtype == np.float32 and got.shape == (b, t)
    np.testing.assert_array_equal(got, want if gate_on else base)
    assert (step_got.n_model, step_got.n_valid, step_got.batch_entropy, step_got.sets) == (
        step_want.n_model, step_want.n_valid, step_want.batch_entropy, step_want.sets)  # fmt: skip
    for sums in ("cov_base", "cov_eff"):
        for field in ("n", "lp", "adv", "lp_adv"):
            np.testing.assert_array_equal(getattr(getattr(step_got, sums), field), getattr(getattr(step_want, sums), field))
    if gate_on:
        assert step_got.sets[0].count > 0 and (got != base).any()


def test_fused_reweight_rows_refuses_other_shapes():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="fused_reweight_rows takes"):
        fused.fused_reweight_rows(x, x, x, x, lambda _: (True, 1.1, 0.9), 0.1, "O1")
    with pytest.raises(ValueError, match="fused_reweight takes"):
        fused.fused_reweight(np.zeros(2, np.float32), x, x, x, lambda _: (True, 1.1, 0.9), 0.1, "O1", True)


def _edge(kind):
    rewards, mask, uid, logp, ent = _batch(64, 300, 21, degenerate=kind == "groups_of_one")
    if kind == "all_equal_log_probs":  # every candidate ties at the threshold
        logp = torch.full_like(logp, -1.5)
    elif kind == "groups_of_one":  # verl's singleton convention: A = r
        uid = np.array([f"u{i}" for i in range(len(uid))], dtype=object)
    elif kind == "mask_all_zero":
        mask = torch.zeros_like(mask)
    elif kind == "empty_responses":
        rewards, mask, logp, ent = (x[:, :0] for x in (rewards, mask, logp, ent))
        rewards = rewards.contiguous()
    elif kind == "log_probs_all_nan":
        logp = torch.full_like(logp, float("nan"))
    elif kind == "log_probs_mostly_inf":  # -inf on most tokens, NaN and +inf on some: few valid candidates
        r = torch.rand(logp.shape, generator=torch.Generator().manual_seed(5))
        logp = torch.where(r < 0.9, -float("inf"), logp)
        logp[r > 0.995] = float("nan")
        logp[(r > 0.95) & (r < 0.955)] = float("inf")
    return rewards, mask, uid, logp, ent


EDGES = ["all_equal_log_probs", "groups_of_one", "mask_all_zero", "empty_responses", "log_probs_all_nan",
         "log_probs_mostly_inf"]  # fmt: skip


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("kind", EDGES)
def test_the_rows_path_on_edge_batches(monkeypatch, variant, kind):
    batch = _edge(kind)
    algo = _algo(variant)
    new = _rows_path(batch, algo, monkeypatch)
    gate = {"mask_all_zero": 0.0, "empty_responses": 0.0, "log_probs_all_nan": 0.0}.get(kind, 1.0)
    assert new[1]["stare/gate_on"] == gate
    if kind == "all_equal_log_probs":  # exactly ceil(P * n) of the tied candidates are chosen
        n_plus = new[1]["stare/frac_l_plus"] * new[1]["entropy_control/model_tokens"]
        assert n_plus > 0 and new[1]["stare/surprisal_threshold_plus"] == 1.5
    _same(new, _materialised(batch, algo))
    _same(new, _step_by_step(batch, algo, monkeypatch))


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("kind", ["random", "all"])
def test_row_ranges_on_several_threads_give_the_one_thread_results(monkeypatch, variant, kind):
    batch = _batch(96, 600, 13, **KINDS[kind])
    algo = _algo(variant)
    results = []
    for threads in (1, 2, 4):
        with monkeypatch.context() as m:
            m.setattr(fused, "CHUNK_TOKENS", 1000)  # ranges of one or two rows: many ranges, every thread busy
            m.setattr(fused, "_torch_threads", lambda threads=threads: threads)
            results.append(_rows_path(batch, algo, monkeypatch))
    (a1, m1) = results[0]
    assert m1["stare/frac_l_plus"] > 0
    for a, metrics in results[1:]:
        assert torch.equal(a, a1)
        assert metrics.keys() == m1.keys()
        assert all(metrics[k] == m1[k] or (math.isnan(metrics[k]) and math.isnan(m1[k])) for k in m1)


def _threads(monkeypatch, threads):
    """The fused passes on ``threads`` threads, over ranges of one or two rows (many ranges, every thread busy)."""
    monkeypatch.setattr(fused, "CHUNK_TOKENS", 1000)
    monkeypatch.setattr(fused, "_torch_threads", lambda: threads)


SPLIT_BATCHES = {  # (b, t, batch kind or edge); 512 x 1024: the sampled window
    "random": (96, 600, "random"),
    "all": (96, 600, "all"),
    "random_sampled": (512, 1024, "random"),
    "all_sampled": (512, 1024, "all"),
    **{edge: (None, None, edge) for edge in ("all_equal_log_probs", "groups_of_one", "mask_all_zero",
                                             "empty_responses", "log_probs_all_nan")},
}  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("batch", list(SPLIT_BATCHES))
def test_the_split_passes_give_the_step_by_step_results(monkeypatch, batch, variant, ratio, threads):
    """The chosen tokens' sums come from pass A's sums below the window and the window itself, pass B sums only the
    high-surprisal metrics: advantages and every metric as the step-by-step NumPy path (the reference) gives them, for
    thresholds below and above the high-surprisal bound (P 0.9: the bound lies below the threshold), on 1, 2 and 4
    threads."""
    b, t, kind = SPLIT_BATCHES[batch]
    data = _edge(kind) if b is None else _batch(b, t, seed=b + t + 1, **KINDS[kind])
    algo = _algo(variant, top_p_ratio=ratio)
    with monkeypatch.context() as m:
        _threads(m, threads)
        new = _rows_path(data, algo, monkeypatch)
    metrics = new[1]
    if ratio == 0.9 and b is not None:  # the threshold above the high-surprisal bound: the row's high tokens
        assert 0 <= metrics["stare/surprisal_threshold_plus"] < metrics["entropy_control/batch_entropy"]
    elif ratio == 0.1 and b is not None:  # below it: every chosen token is of high surprisal
        assert metrics["stare/surprisal_threshold_plus"] > metrics["entropy_control/batch_entropy"] > 0
    _same(new, _step_by_step(data, algo, monkeypatch))


def test_the_window_scratch_is_kept_between_calls_and_never_shared():
    with fused._window_scratch((4, 10), np.float32, np.float64) as (w1, e1):
        assert w1.shape == e1.shape == (4, 10) and (w1.dtype, e1.dtype) == (np.float32, np.float64)
        assert e1.ctypes.data % 64 == 0 and not np.shares_memory(w1, e1)
        with fused._window_scratch((4, 10), np.float32, np.float64) as (w2, e2):  # in use: fresh arrays
            assert not np.shares_memory(w2, w1) and not np.shares_memory(e2, e1)
            w2[:] = 1.0
        w1[:] = 2.0
    with fused._window_scratch((2, 5), np.float32, np.float32) as (w3, _):  # smaller: the same memory
        assert np.shares_memory(w3, w1)
    with fused._window_scratch((64, 100), np.float64, np.float64) as (w4, e4):  # larger: grown
        assert w4.shape == (64, 100) and not np.shares_memory(w4, e4)
    with fused._window_scratch((0, 7), np.float32, np.float32) as (w5, e5):
        assert w5.shape == e5.shape == (0, 7)


def test_the_estimator_gives_the_same_results_with_the_scratch_in_use_elsewhere():
    batch = _batch(64, 300, 21, tool=True)
    algo = _algo("C2")
    first = compute_stare_advantage(*batch[:3], algo, old_log_probs=batch[3], entropys=batch[4])[0]
    with fused._window_scratch((64, 300), np.float32, np.float32) as (w, e):
        w[:] = np.nan  # garbage in the kept buffer must not reach a second user
        e[:] = np.nan
        second = compute_stare_advantage(*batch[:3], algo, old_log_probs=batch[3], entropys=batch[4])[0]
    third = compute_stare_advantage(*batch[:3], algo, old_log_probs=batch[3], entropys=batch[4])[0]
    assert torch.equal(first, second) and torch.equal(first, third)


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
@pytest.mark.parametrize("kind", ["random", "ties", "nonfinite", "tool"])
def test_the_passes_on_torchs_openmp_threads_give_the_own_threads_results(monkeypatch, variant, mask_dtype, kind):
    """On Linux with torch's OpenMP runtime the two passes and the chosen tokens' sums run inside its parallel regions
    (stare_verl.methods.stare.omp): the same advantages and metrics, bit for bit, as on the module's own threads."""
    from stare_verl.methods.stare import omp

    if omp.openmp_parallel() is None:
        pytest.skip("no OpenMP runtime of torch's in this process (not Linux, or another parallel backend)")
    rewards, mask, uid, logp, ent = _batch(96, 600, 31, **KINDS[kind])
    batch = (rewards, mask.to(mask_dtype), uid, logp, ent)
    algo = _algo(variant)
    runs = []
    for use in (True, False):
        calls = []
        with monkeypatch.context() as m:
            _threads(m, 2)
            m.setattr(fused, "USE_OPENMP", use)
            for name in ("run_pass_a", "run_pass_b", "run_chosen_sums"):
                real = getattr(omp, name)
                m.setattr(omp, name, lambda *a, real=real, name=name, calls=calls: calls.append(name) or real(*a))
            runs.append(_rows_path(batch, algo, monkeypatch))
        assert calls == (["run_pass_a", "run_pass_b", "run_chosen_sums"] if use else [])
    (a1, m1), (a2, m2) = runs
    assert torch.equal(a1, a2) and m1.keys() == m2.keys()
    assert all(m1[k] == m2[k] or (math.isnan(m1[k]) and math.isnan(m2[k])) for k in m1)
    _same(runs[0], _step_by_step(batch, algo, monkeypatch))


def test_the_openmp_passes_take_only_the_arrays_they_were_compiled_for():
    from stare_verl.methods.stare import omp

    lp = np.zeros((4, 8), dtype=np.float32)
    assert omp.covers(lp, lp, np.zeros((4, 8), dtype=np.uint8), lp)
    assert omp.covers(lp, lp, np.zeros((4, 8), dtype=np.int64), lp)
    assert not omp.covers(lp.astype(np.float64), lp, np.zeros((4, 8), dtype=np.float32), lp)  # float64 log-probs
    assert not omp.covers(lp, lp, np.zeros((4, 8), dtype=np.float64), lp)  # a float64 mask
    assert not omp.covers(np.zeros((8, 4), dtype=np.float32).T, lp, np.zeros((4, 8), dtype=np.float32), lp)
    with pytest.raises(ValueError, match="C-contiguous arrays of fixed dtypes and shapes"):  # raw addresses read
        omp.run_pass_a((4, 8), 1, 2, None, lp, lp, np.zeros((4, 8), dtype=np.uint8), np.zeros(4, dtype=np.int32),
                       *([np.zeros(4, dtype=np.int64)] * 14))  # fmt: skip


def test_torchs_openmp_runtime_is_found_on_linux():
    import sys

    from stare_verl.methods.stare import omp

    if not sys.platform.startswith("linux") or "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch runs no OpenMP runtime here")
    assert omp.openmp_parallel() is not None


def test_after_a_fork_the_passes_run_on_the_modules_own_threads(monkeypatch):
    """GNU OpenMP's pool does not survive fork(): in a forked child (the at-fork hook's flag) the runtime is not
    used, and the estimator gives the same results on its own threads. (torch's own parallel operations hang in
    such a child, so the child here is simulated.)"""
    from stare_verl.methods.stare import omp

    if omp.openmp_parallel() is None:
        pytest.skip("no OpenMP runtime of torch's in this process")
    batch = _batch(96, 600, 7)
    with monkeypatch.context() as m:
        _threads(m, 2)
        before = _rows_path(batch, _algo("C2"), monkeypatch)
        m.setattr(omp, "_forked", False)
        omp._after_fork_in_child()
        assert omp._forked and omp.openmp_parallel() is None
        m.setattr(omp, "run_pass_a", lambda *a: pytest.fail("the OpenMP runtime used after a fork"))
        after = _rows_path(batch, _algo("C2"), monkeypatch)
    assert not omp._forked and omp.openmp_parallel() is not None
    assert torch.equal(before[0], after[0])


def test_the_openmp_passes_refuse_arrays_of_another_shape():
    from stare_verl.methods.stare import omp

    b, t = 4, 8
    f32 = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    i64 = lambda *s: np.zeros(s, dtype=np.int64)  # noqa: E731
    good = [f32(b, t), f32(b, t), np.zeros((b, t), dtype=np.uint8), i64(b), i64(b), f32(2), f32(2), f32(b, t),
            f32(b, t), i64(b), i64(b), i64(b), np.zeros(b), np.zeros(b), i64(b), np.zeros(b), i64(b), i64(b)]  # fmt: skip
    for at, bad in ((3, i64(b - 1)), (0, f32(b, t + 1)), (5, f32(3)), (2, np.zeros((b, t - 1), dtype=np.uint8))):
        arrays = list(good)
        arrays[at] = bad
        with pytest.raises(ValueError, match="fixed dtypes and shapes"):
            omp.run_pass_a((b, t), 1, 2, None, *arrays)


@pytest.mark.parametrize("scope", ["batch", "chunk"])
@pytest.mark.parametrize("path", ["fused", "step_by_step"])
@pytest.mark.parametrize("layout", ["mask", "log_probs", "all"])
def test_column_major_inputs_give_the_row_major_results(monkeypatch, scope, path, layout):
    """A column-major mask (verl's product with it keeps that layout, so the [B, T] GRPO advantages are column-major
    too) or column-major log-probs must not change a thing: the step-by-step path's in-place writes once went
    through a flattened copy and were lost (the reweighting silently dropped)."""
    rewards, mask, uid, logp, ent = _batch(64, 96, 41, ties=True)
    algo = _algo("C2", scope=scope, chunk_size=16, target_entropy=100.0)
    col = lambda x: x.t().contiguous().t()  # noqa: E731  the same values, column-major
    cols = {"mask": (mask,), "log_probs": (logp,), "all": (mask, logp, ent, rewards)}[layout]
    swapped = [col(x) if any(x is c for c in cols) else x for x in (rewards, mask, uid, logp, ent)]
    with monkeypatch.context() as m:
        if path == "step_by_step":
            m.setattr(fused, "supports", lambda *a: False)
        got = compute_stare_advantage(swapped[0], swapped[1], swapped[2], algo, old_log_probs=swapped[3],
                                      entropys=swapped[4], metrics=(mg := {}))  # fmt: skip
        want = compute_stare_advantage(rewards, mask, uid, algo, old_log_probs=logp, entropys=ent, metrics=(mw := {}))
    assert mw["stare/gate_on"] == 1.0 and mw["stare/frac_l_plus"] > 0
    assert torch.equal(got[0], want[0])
    assert mg == pytest.approx(mw, rel=1e-6, abs=1e-9)  # (sums over a column-major array run in another order)


def test_selection_with_ties_on_column_major_log_probs_takes_exactly_k():
    from stare_verl.methods.stare.core import select_top_surprisal

    rng = np.random.default_rng(3)
    lp = -rng.integers(0, 4, (40, 30)).astype(np.float32)  # many ties
    cand = rng.random((40, 30)) < 0.8
    want, thr = select_top_surprisal(lp, cand, 0.3)
    got, thr_f = select_top_surprisal(np.asfortranarray(lp), np.asfortranarray(cand), 0.3)
    assert thr == thr_f and np.array_equal(got, want)
    assert want.sum() == math.ceil(0.3 * cand.sum())


def test_the_top_share_mask_of_a_transposed_mask():
    from stare_verl.methods.base import top_share_mask

    g = torch.Generator().manual_seed(0)
    values = torch.rand(12, 20, generator=g)
    valid = torch.rand(12, 20, generator=g) < 0.7
    want = top_share_mask(values, valid, 0.2)
    got = top_share_mask(values.t().contiguous().t(), valid.t().contiguous().t(), 0.2)
    assert torch.equal(got, want) and int(want.sum()) == math.ceil(0.2 * int(valid.sum()))
