"""Zero-variance groups (issue 13 item 4): a group whose rewards are all equal, however they are written in
floating point, gets advantage exactly 0 and never enters L+ or L-, for GRPO and Dr.GRPO."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

from stare_verl.methods.group_baseline import group_codes, zero_variance_groups
from stare_verl.methods.stare import compute_stare_advantage
from stare_verl.methods.stare.config import StareConfig
from stare_verl.methods.stare.controller import StareController
from stare_verl.methods.stare.reweight import stare_reweight

T = 6

# Each case: the reward components of each response of one group, placed on the row's last tokens (verl's
# reward manager puts the score on the last token; per-turn or shaped rewards spread it over several). The
# row sums are one reward written several ways.
CASES = {
    "one_value_x8": [[0.7]] * 8,  # equal float32 values: verl's float32 mean still leaves a residue
    "sum_vs_literal": [[0.1 + 0.2], [0.3]] * 4,  # 0.30000000000000004 vs 0.3
    "format_bonus": [[0.1, 1.0], [1.1]] * 4,  # bonus token + correctness vs one reward
    "penalty_small": [[1.0, -0.9], [0.1]] * 4,  # 1.0 - 0.9 in float32 != 0.1f (1 ulp apart)
    "penalty_large": [[5.0, -4.7], [0.3]] * 4,  # 6 ulps apart after float32 cancellation
    "partial_credit": [[1 / 3, 1 / 3, 1 / 3], [1.0]] * 4,
    "scaled": [[2.5, 2.2], [4.7]] * 4,
    "negative": [[-0.5, -0.2], [-0.7]] * 4,
}


def _rows(parts_list, t=T):
    r = torch.zeros(len(parts_list), t)
    for i, parts in enumerate(parts_list):
        for j, p in enumerate(parts):
            r[i, t - len(parts) + j] = p
    return r


def _algo(norm, **stare):
    return OmegaConf.create({"norm_adv_by_std_in_grpo": norm, "stare": stare})


def _inputs(b, seed=0, t=T):
    g = torch.Generator().manual_seed(seed)
    return -torch.rand(b, t, generator=g) * 4, torch.rand(b, t, generator=g) * 0.2


def test_cases_are_real_residues():
    """The cases matter: verl's grpo_vectorized gives most of them a nonzero advantage, and some rows of one
    reward differ in float32 (so exact equality of the rewards would not recognise them)."""
    nonzero = 0
    for parts in CASES.values():
        r = _rows(parts)
        uid = np.array(["g"] * len(parts), dtype=object)
        for norm in (True, False):
            a, _ = compute_grpo_vectorized_outcome_advantage(r, torch.ones_like(r), uid, norm_adv_by_std_in_grpo=norm)
            nonzero += bool((a != 0).any())
    assert nonzero >= 10
    for name in ("penalty_small", "penalty_large"):
        assert len(set(_rows(CASES[name]).sum(-1).tolist())) == 2, name


@pytest.mark.parametrize("norm", [True, False], ids=["grpo", "drgrpo"])
@pytest.mark.parametrize("case", list(CASES))
def test_equal_rewards_give_exactly_zero_and_no_selection(case, norm):
    parts = CASES[case]
    rewards = _rows(parts)
    b = len(parts)
    mask = torch.ones(b, T)
    uid = np.array(["g"] * b, dtype=object)
    logp, ent = _inputs(b)
    metrics = {}
    adv, _ = compute_stare_advantage(
        rewards, mask, uid, _algo(norm, variant="C2", top_p_ratio=1.0, reweight_w=3.0),
        old_log_probs=logp, entropys=ent, metrics=metrics,
    )  # fmt: skip
    assert (adv == 0).all() and not torch.signbit(adv).any()
    assert metrics["stare/gate_on"] == 1.0
    assert metrics["stare/frac_l_plus"] == 0.0 and metrics["stare/frac_l_minus"] == 0.0
    assert metrics["entropy_control/zero_variance_groups"] == 1.0


@pytest.mark.parametrize("norm", [True, False], ids=["grpo", "drgrpo"])
def test_mixed_batch_other_groups_are_verl_bit_for_bit(norm):
    # two zero-variance groups around three groups with real reward differences
    groups = [
        [[0.7]] * 8,
        [[1.0], [0.0], [0.0], [1.0], [0.1, 1.0], [0.0], [0.5], [0.0]],
        [[1.0, -0.9], [0.1]] * 4,
        [[0.3], [0.3], [0.3001], [0.3], [0.3], [0.3], [0.3], [0.3]],  # 1e-4 apart: a real difference
        [[2.0], [1.0], [0.0], [0.5], [1.0], [1.0], [0.25], [1.5]],
    ]
    rewards = _rows([p for grp in groups for p in grp])
    uid = np.array([f"u{i}" for i, grp in enumerate(groups) for _ in grp], dtype=object)
    b = len(uid)
    mask = torch.ones(b, T)
    mask[::3, :2] = 0  # some padding / tool tokens
    logp, ent = _inputs(b, seed=1)
    metrics = {}
    adv, _ = compute_stare_advantage(
        rewards, mask, uid, _algo(norm, reweight_w=1.0, reweight_m=1.0), old_log_probs=logp, entropys=ent,
        metrics=metrics,
    )  # fmt: skip
    ref, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=norm)
    zero = np.isin(uid, ["u0", "u2"])
    assert (adv[zero] == 0).all() and (ref[zero] != 0).any()
    assert torch.equal(adv[~zero], ref[~zero])
    assert (adv[uid == "u3"] != 0).any()
    assert metrics["entropy_control/zero_variance_groups"] == pytest.approx(2 / 5)


def test_zero_variance_group_would_take_the_whole_l_plus_quota():
    """8 responses of one reward (0.7) with rare tokens, and a group with one correct answer: with verl's
    advantage the residue (+0.056) puts the equal-reward group in A > 0 and its high-surprisal tokens take all
    of L+; here L+ is drawn from the correct answer only."""
    t = 10
    rewards = torch.zeros(16, t)
    rewards[:8, -1] = 0.7
    rewards[8, -1] = 1.0
    mask = torch.ones(16, t)
    uid = np.array(["same"] * 8 + ["real"] * 8, dtype=object)
    g = torch.Generator().manual_seed(0)
    logp = torch.empty(16, t)
    logp[:8] = -6.0 - torch.rand(8, t, generator=g)  # surprisal 6-7 nats
    logp[8:] = -1.0 - torch.rand(8, t, generator=g)  # surprisal 1-2 nats
    ent = torch.full((16, t), 0.1)
    cfg = StareConfig(reweight_w=3.0, top_p_ratio=0.1, norm_adv_by_std_in_grpo=True)

    base, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, uid)
    assert (base[:8] > 0).all()  # the residue
    verl_out, _ = stare_reweight(base, mask, logp, ent, StareController(cfg))
    taken = (verl_out != base).nonzero()[:, 0]
    assert len(taken) == 9 and (taken < 8).all()  # ceil(0.1 * 90): all from the equal-reward group

    adv, _ = compute_stare_advantage(rewards, mask, uid, cfg, old_log_probs=logp, entropys=ent)
    assert (adv[:8] == 0).all()
    changed = (adv != base).nonzero()
    assert sorted(set(changed[:, 0].tolist()) - set(range(8))) == [8]
    on_8 = changed[changed[:, 0] == 8][:, 1]
    assert len(on_8) == 1  # ceil(0.1 * 10) tokens of the one positive response
    assert adv[8, on_8].item() == pytest.approx(3.0 * base[8, 0].item())
    assert on_8.item() == int(logp[8].argmin())


def test_tolerance_rule_and_exact_mode():
    scores = np.array([0.3, 0.3 + 2e-7, 0.3, 5.0, 5.0 + 6e-5, 1000.0, 1000.004, 0.0, 1e-9, 7.0, np.nan])
    codes, n = group_codes(np.array(["a", "a", "a", "b", "b", "c", "c", "d", "d", "e", "e"], dtype=object))
    finite = np.isfinite(scores)
    # a: 2e-7 apart (within 1e-5), b: 6e-5 > 1e-5 * 5, c: 4e-6 relative, d: 1e-9 within the absolute floor,
    # e: a singleton once the NaN is dropped (verl's convention kept)
    assert zero_variance_groups(scores, codes, n, finite).tolist() == [True, False, True, True, False]
    assert zero_variance_groups(scores, codes, n, finite, tol=0.0).tolist() == [False, False, False, False, False]
    same = np.array([0.7, 0.7, 0.7], dtype=np.float32)
    assert zero_variance_groups(same, np.zeros(3, np.int64), 1, np.ones(3, bool), tol=0.0).tolist() == [True]
    with pytest.raises(ValueError, match="tol"):
        zero_variance_groups(scores, codes, n, finite, tol=-1.0)


def test_group_codes_any_hashable_first_appearance():
    codes, n = group_codes(np.array(["x", 3, "x", (1, 2), 3], dtype=object))
    assert codes.tolist() == [0, 1, 0, 2, 1] and n == 3


def test_tolerance_is_configurable_and_validated():
    parts = CASES["penalty_small"]
    rewards = _rows(parts)
    uid = np.array(["g"] * len(parts), dtype=object)
    logp, ent = _inputs(len(parts))
    metrics = {}
    adv, _ = compute_stare_advantage(
        rewards, torch.ones_like(rewards), uid, _algo(True, zero_variance_tol=0.0), old_log_probs=logp,
        entropys=ent, metrics=metrics,
    )  # fmt: skip
    # exact mode: two float32 values 1 ulp apart are a (meaningless) difference, and its sign picks L+
    assert metrics["entropy_control/zero_variance_groups"] == 0.0 and (adv != 0).all()
    assert metrics["stare/frac_l_plus"] > 0
    from stare_verl.methods.stare.config import StareConfigError, parse_stare_config

    with pytest.raises(StareConfigError, match="zero_variance_tol"):
        parse_stare_config(_algo(True, zero_variance_tol=-1e-3))


# Issue 31 item 10: the groups are verl's. verl's grpo_vectorized groups uids with
# verl.utils.groupwise.as_torch_index, which is not Python equality; the zero-variance and cut-group corrections
# must act on those same groups, or with W = 1 the estimator stops being GRPO.
_R4 = [1.0, 0.0, 1.0, 0.0]
UID_CASES = {
    # uids, rewards: verl puts some rows of different labels in one group whose rewards differ
    "numeric_strings": (np.array(["1", "01", "1", "01"], dtype=object), _R4),
    "spaced_signed_strings": (np.array(["1", " 1", "+1", "01"], dtype=object), _R4),
    "int_and_str": (np.array([1, "1", 1, "1"], dtype=object), _R4),
    "bool_and_int": (np.array([True, 1, True, 1], dtype=object), _R4),
    "object_floats_truncated": (np.array([1.2, 1.7, 1.2, 1.7], dtype=object), _R4),
    "float_array_near_integer": (np.array([3.0, 3.0 + 1e-7, 3.0, 3.0 + 1e-7]), _R4),
    "numpy_unicode_strings": (np.array(["7", "007", "7", "007"]), _R4),
    # and where verl keeps labels apart, so do we (no merge, no split)
    "uuid_and_int_mixed": (np.array(["a", 1, "a", 1, "b", "b"], dtype=object), [1.0, 0.0, 0.0, 1.0, 0.5, 0.5]),
    "torch_float_tensor": (torch.tensor([1.2, 1.7, 1.2, 1.7]), [1.0, 1.0, 0.0, 0.0]),
}


@pytest.mark.parametrize("norm", [True, False], ids=["grpo", "drgrpo"])
@pytest.mark.parametrize("case", list(UID_CASES))
def test_groups_exactly_as_verl_with_mixed_uid_types(case, norm):
    uid, r = UID_CASES[case]
    rewards = _rows([[x] for x in r])
    mask = torch.ones_like(rewards)
    ref, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=norm)
    logp, ent = _inputs(len(r))
    adv, _ = compute_stare_advantage(
        rewards, mask, uid, _algo(norm, reweight_w=1.0), old_log_probs=logp, entropys=ent
    )
    assert torch.equal(adv, ref), case
    assert (adv[:, -1] != 0).sum() >= 2  # the case has real (nonzero) GRPO advantages to preserve


def test_numeric_string_pair_gets_verls_advantage():
    """The issue's example: uids "1" and "01" are one group in verl (advantages +-0.87), not two zero-variance
    groups."""
    uid = np.array(["1", "01", "1", "01"], dtype=object)
    rewards = _rows([[1.0], [0.0], [1.0], [0.0]])
    logp, ent = _inputs(4)
    adv, _ = compute_stare_advantage(
        rewards, torch.ones_like(rewards), uid, _algo(True, reweight_w=1.0), old_log_probs=logp, entropys=ent,
        metrics=(m := {}),
    )  # fmt: skip
    assert adv[:, -1].tolist() == pytest.approx([0.866, -0.866, 0.866, -0.866], abs=1e-3)
    assert m["entropy_control/zero_variance_groups"] == 0.0


def test_nonfinite_reward_keeps_the_batchs_groups():
    """verl's rule depends on the whole array: ["1", "01", "1", "01", "a"] are three groups, the same uids without
    "a" one. A NaN reward on the only "a" row must not regroup the finite rows: they get verl's full-batch values."""
    uid = np.array(["1", "01", "1", "01", "a"], dtype=object)
    rewards = _rows([[1.0], [0.0], [0.5], [0.2], [float("nan")]])
    ref, _ = compute_grpo_vectorized_outcome_advantage(rewards, torch.ones_like(rewards), uid)
    logp, ent = _inputs(5)
    adv, _ = compute_stare_advantage(
        rewards, torch.ones_like(rewards), uid, _algo(True, reweight_w=1.0), old_log_probs=logp, entropys=ent
    )
    assert torch.equal(adv[:4], ref[:4]) and (adv[4] == 0).all()
    assert adv[0, -1].item() == pytest.approx(0.7071, abs=1e-3) and adv[1, -1].item() == pytest.approx(-0.7071, abs=1e-3)


def test_verl_group_codes_first_appearance_and_merge_warning(caplog):
    import stare_verl.methods.group_baseline as est

    est._WARNED_MERGE = False
    with caplog.at_level("WARNING", logger="stare_verl.methods.group_baseline"):
        codes, n = est.verl_group_codes(np.array(["b", "a", "b", "c"], dtype=object))
        assert codes.tolist() == [0, 1, 0, 2] and n == 3 and not caplog.records
        codes, n = est.verl_group_codes(np.array(["01", "2", "1"], dtype=object))
    assert codes.tolist() == [0, 1, 0] and n == 2
    assert any("3 distinct uid labels into 2 groups" in r.getMessage() for r in caplog.records)
