"""The entropy-control methods (stare_verl.methods): registry, configs, and each method's math on fixed batches
against its paper's formula."""

import json
import math

import numpy as np
import pytest
import torch

from stare_verl.methods import (
    METHODS,
    MethodConfigError,
    get_method,
    method_for_config,
    parse_method_spec,
    recorded_method,
)
from stare_verl.methods.adaptive_entropy import AdaptiveEntropy, AdaptiveEntropyConfig, next_coefficient
from stare_verl.methods.base import top_share_mask
from stare_verl.methods.entropy_adv import entropy_advantages
from stare_verl.methods.forking import forking_advantages
from stare_verl.methods.metrics import entropy_dynamics
from stare_verl.methods.repo_r import RepoR, RepoRConfig, next_zeta, repo_r_advantages

# a fixed batch: 3 responses x 5 positions; row 2 ends with two tool-output tokens (mask 0) of high entropy
MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
ADV = torch.tensor([1.0, -0.5, 0.0])[:, None] * MASK
ENT = torch.tensor([[0.1, 0.9, 0.3, 0.05, 5.0], [0.6, 0.2, 0.7, 9.0, 9.0], [0.4, 0.8, 0.01, 7.0, 7.0]])
LP = -torch.tensor([[0.2, 1.5, 0.4, 0.1, 3.0], [1.0, 0.3, 0.9, 4.0, 4.0], [0.5, 1.2, 0.02, 2.0, 2.0]])


def test_every_method_is_registered_once_and_unknown_names_list_the_known_ones():
    assert list(METHODS) == ["grpo", "stare", "entropy_bonus", "adaptive_entropy", "clip_cov", "kl_cov", "forking",
                             "entropy_adv", "repo_r"]  # fmt: skip
    with pytest.raises(MethodConfigError, match="known methods: grpo, stare, entropy_bonus"):
        get_method("clipcov")


@pytest.mark.parametrize(
    ("spec", "message"),
    [("forking:rho=0", "rho"), ("forking:rh=0.2", "unknown key; did you mean rho. allowed keys: rho"),
     ("stare:varient=O1", "stare.varient: unknown key; did you mean variant. allowed keys: variant, top_p_ratio"),
     ("stare:zzz=1", "stare.zzz: unknown key; allowed keys: variant"), ("kl_cov:coef=-1", "coef"),
     ("entropy_adv:kappa=0", "kappa"), ("adaptive_entropy:coef_init=1", "coef_init"), ("entropy_bonus:coef=nan", "coef"),
     ("stare:reweight_w=0", "reweight_w"), ("forking:rho", "key=value"), ("repo_r:zeta=0.1", "zeta_max"),
     ("repo_r:zeta_min=0", "zeta_min"), ("repo_r:zeta=inf", "zeta"),
     ("stare:reweight_w=1.5,reweight_w=2", r"^method 'stare:reweight_w=1.5,reweight_w=2': setting reweight_w given "
                                           "twice; give each setting once$"),
     ("stare:reweight_w=1.5, reweight_w =1.5", "setting reweight_w given twice")],
)  # fmt: skip
def test_bad_settings_are_errors_that_name_the_key(spec, message):
    with pytest.raises(MethodConfigError, match=message):
        parse_method_spec(spec)


def test_a_recorded_method_reads_back_or_is_none():
    """What a finished run recorded: a spec with settings reads back as the method; an unknown name, a bad setting
    or no string at all is None (a reader of old runs shows what it can)."""
    method = recorded_method("entropy_bonus:coef=0.01")
    assert (method.name, method.config.coef, method.label) == ("entropy_bonus", 0.01, "entropy_bonus-coef0.01")
    assert recorded_method("stare:").name == "stare"  # no settings after the colon: the defaults
    assert [recorded_method(s) for s in ("clipcov", "stare:nope=1", "entropy_bonus:coef", None, 3)] == [None] * 5


def test_launch_overrides_set_the_methods_verl_keys():
    assert parse_method_spec("entropy_bonus:coef=0.01").launch_overrides()[0] == "++actor_rollout_ref.actor.entropy_coeff=0.01"
    clip = parse_method_spec("clip_cov").launch_overrides()
    assert "++actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov" in clip
    assert "++actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.0002" in clip
    kl = parse_method_spec("kl_cov:ratio=0.02").launch_overrides()
    assert "++actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.02" in kl and "++actor_rollout_ref.actor.policy_loss.ppo_kl_coef=1.0" in kl
    # the twin's pins come last for every method that runs as the GRPO-ds twin
    for name in ("grpo", "entropy_bonus", "clip_cov", "kl_cov"):
        assert parse_method_spec(name).launch_overrides()[-3:] == [
            "++algorithm.stare.reweight_w=1.0", "++algorithm.stare.reweight_m=1.0", "++algorithm.stare.adaptive=false"]
    # STARE passes on only what was given (the recipe holds the family's calibration)
    assert parse_method_spec("stare:reweight_w=3").launch_overrides() == ["++algorithm.stare.reweight_w=3.0"]
    assert parse_method_spec("forking").launch_overrides() == ["++algorithm.adv_estimator=forking", "++algorithm.forking.rho=0.2"]


def test_the_adv_estimator_selects_the_method():
    assert method_for_config({"adv_estimator": "grpo"}) is None
    m = method_for_config({"adv_estimator": "forking", "forking": {"rho": 0.5}})
    assert m.name == "forking" and m.config.rho == 0.5
    assert method_for_config({"adv_estimator": "stare", "stare": {"target_entropy": 0.11}}).target_entropy() == 0.11
    with pytest.raises(MethodConfigError, match="algorithm.entropy_adv.alpha"):
        method_for_config({"adv_estimator": "entropy_adv", "entropy_adv": {"alpha": -1}})


def test_top_share_mask_takes_exactly_ceil_share_n_of_the_valid_tokens():
    valid = MASK.bool()
    top = top_share_mask(ENT, valid, 0.2)  # 10 model tokens -> 2: the 0.9 and 0.8 (tool tokens never count)
    assert top.sum() == 2 and top[0, 1] and top[2, 1]
    assert top_share_mask(ENT, valid, 1.0).equal(valid)
    assert top_share_mask(ENT, torch.zeros_like(valid), 0.5).sum() == 0
    assert top_share_mask(ENT, valid, 0.01).sum() == 1  # at least one


def test_forking_keeps_the_advantage_of_the_top_rho_entropy_model_tokens_only():
    out, selected = forking_advantages(ADV, MASK, ENT, rho=0.3)  # ceil(0.3 * 10) = 3: 0.9, 0.8, 0.7
    expected = torch.zeros_like(ADV)
    expected[0, 1] = 1.0
    expected[1, 2] = -0.5
    expected[2, 1] = 0.0  # selected, but its response has A = 0
    assert out.equal(expected) and selected.sum() == 3 and not selected[:, 4].any()
    assert ADV[0, 0] == 1.0  # the input is not changed


def test_entropy_advantage_is_a_plus_min_alpha_h_abs_a_over_kappa():
    out = entropy_advantages(ADV, MASK, ENT, alpha=0.4, kappa=2.0)
    # row 0 (A = 1): A + min(0.4 H, 0.5); row 1 (A = -0.5): A + min(0.4 H, 0.25); row 2 (A = 0): unchanged
    exp0 = [1 + min(0.4 * h, 0.5) for h in (0.1, 0.9, 0.3, 0.05)]
    exp1 = [-0.5 + min(0.4 * h, 0.25) for h in (0.6, 0.2, 0.7)]
    np.testing.assert_allclose(out[0, :4].numpy(), exp0, rtol=1e-6)
    np.testing.assert_allclose(out[1, :3].numpy(), exp1, rtol=1e-6)
    assert out[2].abs().sum() == 0 and out[0, 4] == 0 and out[1, 3:].abs().sum() == 0  # never on mask 0
    assert (out[1, :3] <= 0).all()  # the clip never turns a negative advantage positive
    nan_ent = ENT.clone()
    nan_ent[0, 0] = float("nan")
    assert entropy_advantages(ADV, MASK, nan_ent, 0.4, 2.0)[0, 0] == 1.0  # no entropy: no bonus


def test_adaptive_coefficient_steps_toward_the_target_and_applies_only_below_it():
    cfg = AdaptiveEntropyConfig(target_entropy=0.2, delta=1e-3, coef_init=0.0, coef_min=0.0, coef_max=2.5e-3)
    coef, trace = cfg.coef_init, []
    for h in (0.1, 0.1, 0.1, 0.1, 0.3, 0.2, float("nan"), None):
        coef, applied = next_coefficient(coef, h, cfg)
        trace.append((round(coef, 6), round(applied, 6)))
    assert trace == [(0.001, 0.001), (0.002, 0.002), (0.0025, 0.0025), (0.0025, 0.0025), (0.0015, 0.0),
                     (0.0015, 0.0), (0.0015, 0.0), (0.0015, 0.0)]  # fmt: skip
    m = AdaptiveEntropy(cfg)
    metrics = {}
    assert m.reshape(ADV, MASK, LP, ENT, metrics).equal(ADV)  # the advantage is GRPO's
    h = float(ENT[MASK.bool()].double().mean())
    assert h > 0.2 and metrics["adaptive_entropy/applied_coef"] == 0.0 and m.actor_extra() == {"entropy_coeff": 0.0}
    state = m.state_dict()
    other = AdaptiveEntropy(cfg)
    other.load_state_dict(state)
    assert (other.coef, other.steps) == (m.coef, 1)
    with pytest.raises(ValueError, match="corrupt"):
        other.load_state_dict({**state, "coef": "x"})
    with pytest.raises(ValueError, match="corrupt"):
        other.load_state_dict({**state, "coef": -1.0})


def test_repo_r_rescales_by_surprisal_by_hand():
    adv = ADV.clone()
    adv[0, 4] = 7.0  # a tool-output token (mask 0) with an advantage: never touched
    out, clamped = repo_r_advantages(adv, MASK, LP, zeta=0.5)
    # row 0 (A = 1): 1 - 0.5 log pi; row 1 (A = -0.5): -0.5 * (1 + 0.5 log pi); row 2 (A = 0): 0
    np.testing.assert_allclose(out[0].numpy(), [1.1, 1.75, 1.2, 1.05, 7.0], rtol=1e-6)
    np.testing.assert_allclose(out[1].numpy(), [-0.25, -0.425, -0.275, 0.0, 0.0], rtol=1e-6)
    assert out[2].abs().sum() == 0 and not clamped.any() and adv[0, 0] == 1.0  # the input is not changed
    # zeta 2: row 1's factors 1 + 2 log pi = -1, 0.4, -0.8 -> clamped at 0 (never a reward), 2 tokens clamped
    out, clamped = repo_r_advantages(adv, MASK, LP, zeta=2.0)
    np.testing.assert_allclose(out[1].numpy(), [0.0, -0.2, 0.0, 0.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(out[0].numpy(), [1.4, 4.0, 1.8, 1.2, 7.0], rtol=1e-6)
    assert clamped.nonzero().tolist() == [[1, 0], [1, 2]]
    # A > 0 is clamped at >= 0 too (a log-prob above 0 can only come from numerical error); NaN log-prob: unchanged
    lp = LP.clone()
    lp[0, 0], lp[0, 1] = 1.0, float("nan")
    out, clamped = repo_r_advantages(adv, MASK, lp, zeta=2.0)
    assert out[0, 0] == 0.0 and clamped[0, 0] and out[0, 1] == 1.0
    assert repo_r_advantages(adv, MASK, LP, zeta=0.0)[0].equal(adv)  # zeta 0: GRPO
    with pytest.raises(ValueError, match="one"):
        repo_r_advantages(adv, MASK, LP[:, :4], 0.1)
    with pytest.raises(ValueError, match="zeta"):
        repo_r_advantages(adv, MASK, LP, -0.1)


def test_repo_r_controller_doubles_below_the_target_halves_above_within_bounds():
    cfg = RepoRConfig()  # zeta 1e-3, target 0.3, [1e-4, 0.05]
    assert (cfg.zeta, cfg.target_entropy, cfg.zeta_min, cfg.zeta_max) == (1e-3, 0.3, 1e-4, 0.05)
    zeta, trace = cfg.zeta, []
    for h in (0.2, 0.2, 0.3, 0.4, float("nan"), None, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1):
        zeta = next_zeta(zeta, h, cfg)
        trace.append(zeta)
    assert trace == pytest.approx([2e-3, 4e-3, 4e-3, 2e-3, 2e-3, 2e-3, 4e-3, 8e-3, 0.016, 0.032, 0.05, 0.05, 0.05])
    zeta = 2e-4
    for expected in (1e-4, 1e-4):  # halved to the lower bound, held there
        zeta = next_zeta(zeta, 0.9, cfg)
        assert zeta == pytest.approx(expected)
    assert next_zeta(0.01, 0.1, RepoRConfig(zeta=0.01, adaptive=False)) == 0.01


def test_repo_r_method_reads_the_entropy_of_model_tokens_only_and_keeps_zeta_across_a_resume():
    m = RepoR(RepoRConfig(zeta=0.01, target_entropy=0.5))
    metrics = {}
    out = m.reshape(ADV, MASK, LP, ENT, metrics)
    # the model tokens' mean entropy is 0.406 < 0.5 (the tool tokens' 5-9 nats would put it far above): doubled
    assert metrics["repo_r/entropy"] == pytest.approx(4.06 / 10) and m.zeta == metrics["repo_r/zeta"] == 0.02
    assert out[0, 1] == pytest.approx(1 + 0.02 * 1.5) and out[1, 0] == pytest.approx(-0.5 * (1 - 0.02))
    assert metrics["repo_r/clamped_frac"] == 0.0 and metrics["repo_r/target_entropy"] == 0.5
    assert metrics["repo_r/mean_weight_pos"] == pytest.approx(1 + 0.02 * (0.2 + 1.5 + 0.4 + 0.1) / 4)
    assert metrics["repo_r/mean_weight_neg"] == pytest.approx(1 - 0.02 * (1.0 + 0.3 + 0.9) / 3)
    state = json.loads(json.dumps(m.state_dict()))
    resumed = RepoR(RepoRConfig(zeta=0.01, target_entropy=0.5))
    resumed.load_state_dict(state)
    assert (resumed.zeta, resumed.steps) == (0.02, 1)
    resumed.reshape(ADV, MASK, LP, ENT, {})
    m.reshape(ADV, MASK, LP, ENT, {})
    assert resumed.zeta == m.zeta == 0.04
    narrower = RepoR(RepoRConfig(zeta=0.01, zeta_max=0.015))
    narrower.load_state_dict(state)
    assert narrower.zeta == 0.015  # clipped into this run's bounds
    fixed = RepoR(RepoRConfig(zeta=0.003, adaptive=False))
    fixed.load_state_dict(state)
    assert (fixed.zeta, fixed.steps) == (0.003, 1)  # without the controller zeta is configuration
    for bad in ({**state, "zeta": "x"}, {**state, "zeta": 0.0}, {**state, "steps": -1}, {"version": 9}):
        with pytest.raises(ValueError, match="REPO-R state"):
            resumed.load_state_dict(bad)
    none = {}
    RepoR(RepoRConfig()).reshape(ADV, torch.zeros_like(MASK), LP, ENT, none)
    assert none["repo_r/zeta"] == 1e-3 and math.isnan(none["repo_r/entropy"])  # no model token: no move


def test_repo_r_launch_follows_the_stare_target_unless_given():
    out = parse_method_spec("repo_r").launch_overrides()
    assert out[0] == "++algorithm.adv_estimator=repo_r"
    assert "++algorithm.repo_r.target_entropy=${algorithm.stare.target_entropy}" in out
    assert "++algorithm.repo_r.target_entropy=0.2" in parse_method_spec("repo_r:target_entropy=0.2").launch_overrides()


def test_entropy_dynamics_metrics_by_hand():
    eff = entropy_advantages(ADV, MASK, ENT, 0.4, 2.0)
    m = entropy_dynamics(ADV, eff, MASK, LP, ENT)
    valid = MASK.bool()
    lp, a0, a1, h = (t[valid].double() for t in (LP, ADV, eff, ENT))
    assert m["entropy_control/model_tokens"] == 10
    assert m["entropy_control/batch_entropy"] == pytest.approx(float(h.mean()))
    assert m["entropy_control/forking_entropy"] == pytest.approx((0.9 + 0.8) / 2)  # top ceil(0.2 * 10) = 2
    assert m["entropy_control/forking_threshold"] == pytest.approx(0.8)
    assert m["entropy_control/cov_logp_adv"] == pytest.approx(float(((lp - lp.mean()) * (a0 - a0.mean())).mean()))
    assert m["entropy_control/cov_logp_adv_eff"] == pytest.approx(float(((lp - lp.mean()) * (a1 - a1.mean())).mean()))
    assert m["entropy_control/adv_changed_frac"] == pytest.approx(7 / 10)  # the A = 0 row is unchanged
    none = entropy_dynamics(ADV, ADV, torch.zeros_like(MASK), LP, ENT)
    assert none["entropy_control/model_tokens"] == 0 and math.isnan(none["entropy_control/batch_entropy"])
    with pytest.raises(ValueError, match="one"):
        entropy_dynamics(ADV, ADV[:, :4], MASK, LP, ENT)


@pytest.mark.parametrize("name", ["forking", "entropy_adv", "adaptive_entropy", "repo_r"])
def test_registered_estimators_refuse_a_trainer_without_token_statistics(name):
    import verl  # noqa: F401  (loads the plugin)
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from stare_verl.methods import EntropyInputsMissing

    fn = get_adv_estimator_fn(name)
    rewards = torch.zeros_like(MASK)
    rewards[0, 3] = 1.0
    with pytest.raises(EntropyInputsMissing, match="token_stats_sync"):
        fn(token_level_rewards=rewards, response_mask=MASK, index=np.array(["a", "a", "b"]), config={"adv_estimator": name})
    adv, ret = fn(token_level_rewards=rewards, response_mask=MASK, index=np.array(["a", "a", "b"]),
                  config={"adv_estimator": name}, old_log_probs=LP, entropys=ENT)  # fmt: skip
    assert adv.shape == MASK.shape and (adv[MASK == 0] == 0).all() and ret is adv


# ------------------------------------------------------------------------ one reading of the boolean config keys

# two groups of 3 responses; outcome rewards on the last model token of each row
_R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
_UID = np.array(["a", "a", "a", "b", "b", "b"])
_M6 = torch.ones(6, 3)
_LP6, _ENT6 = -torch.rand(6, 3), torch.rand(6, 3)


def _group_adv(norm: bool) -> torch.Tensor:
    """Per-response GRPO (norm) or Dr.GRPO advantage of _R, by hand (torch.std: unbiased, as verl)."""
    out = torch.empty(6)
    for g in (slice(0, 3), slice(3, 6)):
        r = _R[g]
        out[g] = (r - r.mean()) / ((r.std() + 1e-6) if norm else 1.0)
    return out


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize(("raw", "norm"), [(0, False), ("false", False), ("False", False), (" no ", False),
                                           ("off", False), (False, False), (np.bool_(False), False), (1, True),
                                           ("true", True), ("yes", True), (True, True), ("absent", True)])  # fmt: skip
def test_every_method_reads_norm_adv_by_std_in_grpo_alike(name, raw, norm):
    """``algorithm.norm_adv_by_std_in_grpo=0`` (or "false") is Dr.GRPO for every method's baseline, as for STARE and
    verl (the group baseline of forking, entropy_adv and adaptive_entropy once read it as std-normalised)."""
    from stare_verl.methods import group_config_of

    cls = METHODS[name]
    algo = {"adv_estimator": cls.estimator or "stare", "stare": {}}
    if raw != "absent":
        algo["norm_adv_by_std_in_grpo"] = raw
    assert group_config_of(algo).norm_adv_by_std_in_grpo is norm
    method = cls.from_algorithm(algo)
    rewards = torch.zeros(6, 3)
    rewards[:, -1] = _R
    base, _ = method.advantage(rewards, _M6, _UID, algo, _LP6, _ENT6, {})
    torch.testing.assert_close(base[:, 0], _group_adv(norm), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["stare", "grpo", "forking", "entropy_adv", "adaptive_entropy"])
@pytest.mark.parametrize("raw", ["maybe", 2, -1, 0.5, None, [], "", "truee"])
def test_a_norm_flag_that_is_no_boolean_is_a_config_error_naming_the_key(name, raw):
    from stare_verl.methods import MethodConfigError, group_config_of

    algo = {"adv_estimator": METHODS[name].estimator or "stare", "norm_adv_by_std_in_grpo": raw, "stare": {}}
    with pytest.raises(MethodConfigError, match=r"algorithm\.norm_adv_by_std_in_grpo must be a boolean") as err:
        group_config_of(algo)
    assert repr(raw) in str(err.value)


@pytest.mark.parametrize(("raw", "expected"), [("false", False), ("0", False), (0, False), ("TRUE", True), (1, True),
                                               ("maybe", None), (2, None), (None, None)])  # fmt: skip
def test_stare_boolean_keys_take_the_same_reading(raw, expected):
    """``algorithm.stare.adaptive`` and ``algorithm.stare.norm_adv_by_std_in_grpo`` (null there: follow the
    algorithm's key) read as ``config_bool`` reads them; a method setting (``stare:adaptive=false``) too."""
    from stare_verl.methods.stare.config import StareConfig, StareConfigError, parse_stare_config

    kw = {"reweight_w": 1.2, "reweight_m": 0.9}
    if expected is None:
        with pytest.raises(StareConfigError, match=r"algorithm\.stare\.adaptive: .*must be a boolean"):
            parse_stare_config({"stare": {"adaptive": raw, **kw}})
    else:
        assert parse_stare_config({"stare": {"adaptive": raw, **kw}}).adaptive is expected
        assert parse_stare_config({"norm_adv_by_std_in_grpo": True, "stare": {"norm_adv_by_std_in_grpo": raw}}
                                  ).norm_adv_by_std_in_grpo is expected  # fmt: skip
        assert parse_method_spec(f"stare:adaptive={raw}").config.adaptive is expected
    assert parse_stare_config({"norm_adv_by_std_in_grpo": "false", "stare": {"norm_adv_by_std_in_grpo": None}}
                              ).norm_adv_by_std_in_grpo is False  # fmt: skip
    assert StareConfig().norm_adv_by_std_in_grpo is None


@pytest.mark.parametrize(("raw", "expected"), [(None, False), ("false", False), (0, False), ("true", True), (1, True)])
def test_bypass_mode_is_read_by_the_same_reader(raw, expected):
    from stare_verl.methods.settings import ConfigBoolError, read_bool

    rc = {} if raw is None else {"bypass_mode": raw}
    assert read_bool(rc, "bypass_mode", False, "algorithm.rollout_correction") is expected
    assert read_bool(None, "bypass_mode", False, "algorithm.rollout_correction") is False
    with pytest.raises(ConfigBoolError, match=r"algorithm\.rollout_correction\.bypass_mode must be a boolean"):
        read_bool({"bypass_mode": "maybe"}, "bypass_mode", False, "algorithm.rollout_correction")


@pytest.mark.parametrize(("estimator", "raw", "ok"), [
    ("forking", "maybe", False), ("forking", 2, False), ("stare", "maybe", False), ("entropy_adv", None, False),
    ("forking", 0, True), ("forking", "false", True), ("stare", 0, True),
    ("grpo", "'false'", False),  # verl's own estimator reads a string by truthiness: refused
])  # fmt: skip
def test_stare_verl_check_reads_the_key_with_the_same_reader(estimator, raw, ok, capsys):
    from stare_verl.jobs.cli import main

    value = "null" if raw is None else raw
    rc = main(["check", "cpu/shortcot_tiny_grpo", f"algorithm.adv_estimator={estimator}",
               f"algorithm.norm_adv_by_std_in_grpo={value}"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == (0 if ok else 2), err
    if not ok:
        assert "algorithm.norm_adv_by_std_in_grpo" in err
    else:  # 0 and "false": Dr.GRPO for forking as for STARE
        assert out.startswith("ok: ") and "baseline Dr.GRPO" in out


@pytest.mark.parametrize(("raw", "ok"), [(0, True), (1, True), ("false", True), ("'false'", False), ("'0'", False)])
def test_check_of_verls_own_grpo_accepts_0_and_1_and_refuses_strings(raw, ok, capsys):
    from stare_verl.jobs.cli import main

    # 0 and 1 read by Python truthiness mean false and true, as verl's estimator reads them; a string does not
    rc = main(["check", "cpu/tiny_grpo", f"algorithm.norm_adv_by_std_in_grpo={raw}"])
    out, err = capsys.readouterr()
    assert rc == (0 if ok else 2), err
    if ok:
        assert out.startswith("ok: ")
    else:
        assert "a non-empty string is true" in err and "algorithm.norm_adv_by_std_in_grpo" in err


def _run_config(mode, use_v1=True, bypass=False, estimator="stare"):
    return {"algorithm": {"adv_estimator": estimator, "stare": {}, "rollout_correction": {"bypass_mode": bypass}},
            "trainer": {"use_v1": use_v1, "v1": {"trainer_mode": mode}}}  # fmt: skip


@pytest.mark.parametrize("mode", ["token_stats_sync", "token_stats_colocate_async", "stare_sync", "stare_colocate_async"])
def test_check_runnable_accepts_the_token_stats_modes_and_their_old_names(mode):
    from stare_verl.methods import check_runnable

    assert check_runnable(_run_config(mode)).name == "stare"
    assert check_runnable(_run_config(mode, estimator="forking")).name == "forking"
    assert check_runnable(_run_config("sync", estimator="gae")) is None  # verl's own estimator: nothing checked


@pytest.mark.parametrize(("mode", "use_v1"), [("sync", True), ("colocate_async", True), ("token_stats_sync", False)])
def test_check_runnable_refuses_a_trainer_that_cannot_feed_the_method(mode, use_v1):
    from stare_verl.methods import EntropyInputsMissing, check_runnable

    with pytest.raises(EntropyInputsMissing, match=f"trainer_mode={mode}: .*token_stats_sync or token_stats_colocate"):
        check_runnable(_run_config(mode, use_v1=use_v1))
    assert check_runnable(_run_config(mode, use_v1=use_v1), feeds=True).name == "stare"
    with pytest.raises(ValueError, match="bypass_mode=true"):
        check_runnable(_run_config("token_stats_sync", bypass="true"))


def test_metric_prefixes_and_old_names_come_from_the_methods():
    from stare_verl.methods import metric_names, metric_prefixes

    assert metric_prefixes() == ("entropy_control/", "stare/", "adaptive_entropy/", "forking/", "entropy_adv/",
                                 "repo_r/")  # fmt: skip
    assert metric_names("batch_entropy") == ("entropy_control/batch_entropy", "stare/batch_entropy")


def test_entropy_dynamics_splits_the_covariance_and_skips_what_the_method_computed():
    """The quadrant split of Cov(log pi, A) at the batch entropy, by hand on the fixed batch (10 model tokens);
    quantities already in the step's metrics (STARE's) are neither recomputed nor returned."""
    eff = ADV.clone()
    eff[0, 1] = 2.0
    m = entropy_dynamics(ADV, eff, MASK, LP, ENT)
    valid = MASK.bool()
    lp, a, ent = LP[valid].double(), ADV[valid].double(), ENT[valid].double()
    h = float(ent.mean())
    d = (lp - lp.mean()) * (a - a.mean()) / lp.numel()
    high = -lp > h
    assert m["entropy_control/batch_entropy"] == pytest.approx(h)
    assert m["entropy_control/cov_quadrant/pos_high"] == pytest.approx(float(d[(a > 0) & high].sum()))
    assert m["entropy_control/cov_quadrant/neg_low"] == pytest.approx(float(d[(a < 0) & ~high].sum()))
    assert m["entropy_control/cov_quadrant/zero_adv"] == pytest.approx(float(d[a == 0].sum()))
    parts = [m[f"entropy_control/cov_quadrant_eff/{q}"] for q in ("pos_high", "pos_low", "neg_high", "neg_low",
                                                                  "zero_adv")]  # fmt: skip
    assert sum(parts) == pytest.approx(m["entropy_control/cov_logp_adv_eff"], rel=1e-12)
    assert m["entropy_control/cov_logp_adv_eff"] != m["entropy_control/cov_logp_adv"]
    known = {"entropy_control/batch_entropy": 0.5, "entropy_control/cov_logp_adv": 7.0}
    again = entropy_dynamics(ADV, eff, MASK, LP, ENT, computed=known)
    assert not set(known) & set(again) and "entropy_control/cov_quadrant/pos_high" not in again
    assert again["entropy_control/cov_logp_adv_eff"] == m["entropy_control/cov_logp_adv_eff"]
