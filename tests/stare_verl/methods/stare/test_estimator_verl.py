"""The `stare` estimator through verl: registry, plugin loading, GRPO equivalence, DataProto path, config."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.core_algos import (
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    get_adv_estimator_fn,
)
from verl.trainer.ppo.ray_trainer import compute_advantage

from stare_verl.methods import EntropyInputsMissing
from stare_verl.methods.stare import compute_stare_advantage
from stare_verl.methods.stare.config import StareConfigError, parse_stare_config
from stare_verl.methods.stare.controller import StareController

pytestmark = pytest.mark.integration


def _data(b=16, t=24, group=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(b, t)
    scores = torch.randint(0, 2, (b,), generator=g).float()
    rewards[torch.arange(b), lengths - 1] = scores
    logp = -torch.rand(b, t, generator=g) * 4
    ent = torch.rand(b, t, generator=g) * 0.2
    uid = np.array([f"p{i // group}" for i in range(b)], dtype=object)
    return rewards, mask, uid, logp, ent


def _algo(**stare):
    return OmegaConf.create({"adv_estimator": "stare", "norm_adv_by_std_in_grpo": True, "stare": stare})


def test_plugin_registers_in_fresh_interpreter():
    code = (
        "import json, verl\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls, PPOTrainer\n"
        "fn = get_adv_estimator_fn('stare')\n"
        "print(json.dumps([fn.__module__, get_trainer_cls('token_stats_sync').__name__,"
        " get_trainer_cls('token_stats_colocate_async').__name__, PPOTrainer.__init__._stare_guard,"
        " get_trainer_cls('stare_sync') is get_trainer_cls('token_stats_sync'),"
        " get_trainer_cls('stare_colocate_async') is get_trainer_cls('token_stats_colocate_async')]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [
        "stare_verl.methods.stare.method",
        "StareTrainerSync",
        "StareTrainerColocateAsync",
        True,
        True,
        True,
    ]


@pytest.mark.parametrize("first", ["stare_verl.methods.stare", "stare_verl.trainer", "stare_verl.methods.stare.reweight"])
def test_any_import_order_registers_everything(first):
    code = (
        f"import {first}\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
        "get_adv_estimator_fn('stare'); get_trainer_cls('stare_sync')\n"
        "assert 'stare_tool_agent' in _agent_loop_registry\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.parametrize(
    "stare", [{"reweight_w": 1.0, "reweight_m": 1.0, "variant": "C2"}, {"target_entropy": 0.0}]
)
def test_omega_one_is_verl_grpo_exactly(stare):
    rewards, mask, uid, logp, ent = _data()
    adv, ret = compute_stare_advantage(rewards, mask, uid, _algo(**stare), old_log_probs=logp, entropys=ent)
    ref_vec, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, uid)
    assert torch.equal(adv, ref_vec) and torch.equal(ret, ref_vec)
    ref_loop, _ = compute_grpo_outcome_advantage(rewards, mask, uid)
    torch.testing.assert_close(adv, ref_loop, rtol=1e-6, atol=1e-6)
    assert (adv[mask == 0] == 0).all()


def test_reweighting_changes_exactly_top_tokens():
    rewards, mask, uid, logp, ent = _data()
    metrics = {}
    adv, _ = compute_stare_advantage(
        rewards, mask, uid, _algo(), old_log_probs=logp, entropys=ent, metrics=metrics
    )
    base, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, uid)
    n_pos = int(((base > 0) & (mask > 0)).sum())
    changed = adv != base
    assert int(changed.sum()) == -(-n_pos // 10)
    torch.testing.assert_close(adv[changed], base[changed] * 1.1)
    assert metrics["stare/gate_on"] == 1.0 and metrics["stare/w"] == pytest.approx(1.1)


def test_verl_compute_advantage_refuses_without_inputs():
    """verl's own path (compute_advantage -> registry) cannot feed STARE: a loud error, never silent GRPO."""
    rewards, mask, uid, logp, ent = _data()
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask, "old_log_probs": logp, "entropy": ent},
        non_tensors={"uid": uid},
    )
    with pytest.raises(EntropyInputsMissing, match="trainer_mode=token_stats_sync"):
        compute_advantage(data, adv_estimator="stare", config=_algo())
    assert get_adv_estimator_fn("stare") is compute_stare_advantage


def test_whole_batch_equals_batch_built_from_parts():
    rewards, mask, uid, logp, ent = _data(b=16)
    tensors = {"token_level_rewards": rewards, "response_mask": mask, "old_log_probs": logp, "entropy": ent}
    whole = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})
    rebuilt = DataProto.concat([whole.slice(0, 8), whole.slice(8, 16)])
    a, b = (
        compute_stare_advantage(
            d.batch["token_level_rewards"], d.batch["response_mask"], d.non_tensor_batch["uid"], _algo(),
            old_log_probs=d.batch["old_log_probs"], entropys=d.batch["entropy"],
        )[0]
        for d in (whole, rebuilt)
    )  # fmt: skip
    assert torch.equal(a, b)


def test_group_of_one_and_batch_of_one():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    mask = torch.ones(1, 3)
    logp = torch.tensor([[-0.5, -3.0, -1.0]])
    adv, _ = compute_stare_advantage(
        rewards,
        mask,
        np.array(["a"], dtype=object),
        _algo(top_p_ratio=0.3),
        old_log_probs=logp,
        entropys=torch.zeros(1, 3),
    )
    # singleton group: mean 0, std 1 (verl's convention) -> A = 1; ceil(0.3*3) = 1 token: the surprisal-3.0 one
    assert adv[0].tolist() == pytest.approx([1.0, 1.1, 1.0])


def test_controller_state_persists_across_calls():
    rewards, mask, uid, logp, ent = _data()
    ctrl = StareController(parse_stare_config(_algo(adaptive=True, alpha=0.05)))
    for _ in range(3):
        compute_stare_advantage(
            rewards, mask, uid, _algo(), old_log_probs=logp, entropys=ent, controller=ctrl
        )
    assert ctrl.w == pytest.approx(1.25) and ctrl.steps == 3


@pytest.mark.parametrize(
    "stare,key",
    [
        ({"top_p_ratio": 0.0}, "top_p_ratio"),
        ({"top_p_ratio": 1.5}, "top_p_ratio"),
        ({"reweight_w": 0.0}, "reweight_w"),
        ({"reweight_m": 1.2}, "reweight_m"),
        ({"reweight_m": 0.0}, "reweight_m"),
        ({"variant": "O2"}, "variant"),
        ({"top_p_raito": 0.1}, "top_p_raito"),
        ({"scope": "chunk"}, "chunk_size"),
        ({"epsilon": 0.0}, "epsilon"),
        # non-finite values are refused, not run with (inf passes every bound, NaN would silently fail them)
        ({"reweight_w": float("inf")}, "reweight_w"),
        ({"alpha": float("inf")}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"target_entropy": float("inf")}, "target_entropy"),
        ({"w_max": float("inf")}, "w_max"),
        ({"epsilon": float("nan")}, "epsilon"),
    ],
)
def test_bad_config_names_key(stare, key):
    with pytest.raises(StareConfigError, match=key) as err:
        parse_stare_config(_algo(**stare))
    if key == "top_p_raito":
        assert "allowed keys" in str(err.value) and "top_p_ratio" in str(err.value)


@pytest.mark.parametrize("raw, expected", [(False, False), ("false", False), ("no", False), (0, False),
                                           ("true", True), (True, True)])
def test_verl_norm_flag_is_parsed_not_truth_tested(raw, expected):
    # bool("false") is True: verl's algorithm.norm_adv_by_std_in_grpo given as a string must not flip
    algo = OmegaConf.create({"adv_estimator": "stare", "norm_adv_by_std_in_grpo": raw, "stare": {}})
    assert parse_stare_config(algo).norm_adv_by_std_in_grpo is expected


def test_verl_norm_flag_that_is_no_boolean_is_refused():
    algo = OmegaConf.create({"adv_estimator": "stare", "norm_adv_by_std_in_grpo": "maybe", "stare": {}})
    with pytest.raises(StareConfigError, match="norm_adv_by_std_in_grpo"):
        parse_stare_config(algo)


def test_config_defaults_and_fallback():
    cfg = parse_stare_config(OmegaConf.create({"norm_adv_by_std_in_grpo": False}))
    assert (cfg.variant, cfg.top_p_ratio, cfg.reweight_w, cfg.reweight_m, cfg.target_entropy) == (
        "O1",
        0.1,
        1.1,
        0.9,
        0.3,
    )
    assert (cfg.adaptive, cfg.alpha, cfg.w_max, cfg.m_min, cfg.scope) == (False, 0.01, 1.5, 0.5, "batch")
    assert cfg.norm_adv_by_std_in_grpo is False


def test_nonfinite_rewards_get_zero_advantage_and_leave_their_group_stats():
    rewards, mask, uid, logp, ent = _data(b=16, group=4, seed=3)
    lengths = mask.sum(-1).long()
    rows = torch.arange(16)
    rewards[rows, lengths - 1] = torch.tensor([1.0, 0.0, 1.0, 0.0] * 4)
    bad_rewards = rewards.clone()
    bad_rewards[1, lengths[1] - 1] = float("nan")
    bad_rewards[6, 0] = float("inf")
    bad_rewards[8:12, 0] = float("nan")  # a whole group broken
    metrics = {}
    adv, _ = compute_stare_advantage(
        bad_rewards, mask, uid, _algo(reweight_w=1.0, reweight_m=1.0), old_log_probs=logp, entropys=ent,
        metrics=metrics,
    )
    assert torch.isfinite(adv).all() and metrics["entropy_control/nonfinite_rewards"] == 6.0
    assert (adv[[1, 6, 8, 9, 10, 11]] == 0).all()
    # the finite responses of a group with a broken one: GRPO over the finite ones only
    keep = [0, 2, 3]
    ref, _ = compute_grpo_vectorized_outcome_advantage(rewards[keep], mask[keep], uid[keep])
    torch.testing.assert_close(adv[keep], ref)
    # untouched groups: exactly what they get without the broken rows
    full, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, uid)
    torch.testing.assert_close(adv[12:], full[12:])
    metrics = {}
    compute_stare_advantage(rewards, mask, uid, _algo(), old_log_probs=logp, entropys=ent, metrics=metrics)
    assert metrics["entropy_control/nonfinite_rewards"] == 0.0


def test_a_group_cut_to_one_finite_reward_gets_no_advantage():
    """Non-finite rewards leave one finite response in its group: no baseline is left, so advantage 0 (verl's
    singleton convention A = r would hand it its raw reward); groups of one from the start keep verl's value."""
    rewards, mask, uid, logp, ent = _data(b=8, group=2, seed=5)
    lengths = mask.sum(-1).long()
    rows = torch.arange(8)
    rewards[rows, lengths - 1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    rewards[0, 0] = float("nan")  # group 0: only response 1 (reward 0) is left
    rewards[3, 0] = float("-inf")  # group 1: only response 2 (reward 0) is left
    rewards[5, 0] = float("nan")  # group 2: only response 4 (reward 1) is left
    metrics = {}
    adv, _ = compute_stare_advantage(
        rewards, mask, uid, _algo(reweight_w=1.0, reweight_m=1.0), old_log_probs=logp, entropys=ent,
        metrics=metrics,
    )
    assert (adv[:6] == 0).all() and metrics["entropy_control/nonfinite_rewards"] == 3.0
    # group 3 is untouched (two equal rewards: zero variance, 0 as well); a real singleton group keeps A = r
    single_uid = np.array(["a", "b"], dtype=object)
    r2 = torch.zeros(2, mask.shape[1])
    r2[0, 0], r2[1, 0] = 1.0, 0.0
    adv2, _ = compute_stare_advantage(
        r2, mask[:2], single_uid, _algo(reweight_w=1.0, reweight_m=1.0), old_log_probs=logp[:2], entropys=ent[:2]
    )
    ref, _ = compute_grpo_vectorized_outcome_advantage(r2, mask[:2], single_uid)
    torch.testing.assert_close(adv2, ref)
    assert adv2[0][mask[0] > 0].min() > 0.5
