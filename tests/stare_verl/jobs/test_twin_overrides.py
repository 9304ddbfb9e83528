"""The GRPO-ds twin stays GRPO-ds whatever overrides a comparison passes to both methods (train.method_overrides)."""

import pytest

from stare_verl.jobs.recipes import compose_recipe
from stare_verl.jobs.train import method_overrides
from stare_verl.methods import parse_method_spec

PLACEHOLDERS = ["actor_rollout_ref.model.path=x", "data.train_files=x", "data.val_files=x",
                "trainer.default_local_dir=x"]  # fmt: skip
STARE_DOSE = ["algorithm.stare.reweight_w=3.0", "algorithm.stare.reweight_m=0.5", "algorithm.stare.top_p_ratio=0.02",
              "algorithm.stare.target_entropy=0.09"]  # fmt: skip


def test_stare_runs_take_the_overrides_as_given():
    assert method_overrides(parse_method_spec("stare"), STARE_DOSE) == STARE_DOSE


@pytest.mark.parametrize("family", ["shortcot", "tooluse"])
def test_the_twin_keeps_w_m_one_and_no_schedule(family, capsys):
    stare_overrides = method_overrides(parse_method_spec("stare"), STARE_DOSE)
    stare = compose_recipe(f"cpu/{family}_tiny_stare", PLACEHOLDERS + stare_overrides)
    assert (stare.algorithm.stare.reweight_w, stare.algorithm.stare.reweight_m) == (3.0, 0.5)
    for extra in ([], ["++algorithm.stare.adaptive=true", "algorithm.stare.reweight_w=1.2"]):
        twin_overrides = method_overrides(parse_method_spec("grpo"), STARE_DOSE + extra)
        twin = compose_recipe(f"cpu/{family}_tiny_grpo", PLACEHOLDERS + twin_overrides)
        st = twin.algorithm.stare
        assert (st.reweight_w, st.reweight_m, st.adaptive) == (1.0, 1.0, False)
        # the other keys follow the overrides: both methods log the same stare/* metrics against the same target
        assert (st.top_p_ratio, st.target_entropy) == (0.02, 0.09)
    assert "the GRPO-ds twin keeps W = M = 1; ignored for it: algorithm.stare.reweight_w=3.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spec", "override", "own"),
    [
        ("stare:reweight_w=2", "algorithm.stare.reweight_w=3", "algorithm.stare.reweight_w=2.0"),
        ("stare:reweight_w=2", "++algorithm.stare.reweight_w=3", "algorithm.stare.reweight_w=2.0"),
        ("entropy_bonus", "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.entropy_coeff=0.001"),
        ("kl_cov", "~actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov"),
        ("stare", "algorithm.adv_estimator=grpo", "algorithm.adv_estimator=stare"),
        ("grpo", "algorithm.adv_estimator=grpo", "algorithm.adv_estimator=stare"),
        ("repo_r:zeta_max=0.5", "algorithm.repo_r.zeta_max=0.05", "algorithm.repo_r.zeta_max=0.5"),
    ],
)  # fmt: skip
def test_an_override_the_method_would_replace_is_named(spec, override, own):
    """Members of one kind: an override silently beaten by the method's own setting (given after its name, its
    default, or the estimator that selects it) is refused, naming both."""
    assert parse_method_spec(spec).replaced_overrides([override, "actor_rollout_ref.actor.optim.lr=1e-5"]) == [
        (override, own)
    ]


@pytest.mark.parametrize(
    ("spec", "overrides"),
    [
        ("stare:reweight_w=2", ["algorithm.stare.reweight_w=2.0"]),  # the same value, written otherwise
        ("stare", ["algorithm.stare.reweight_w=3", "algorithm.adv_estimator=stare"]),  # STARE's recipe keys are the user's
        ("grpo", STARE_DOSE),  # the twin drops STARE's keys on purpose (with a note)
        ("entropy_bonus:coef=0.01", ["actor_rollout_ref.actor.entropy_coeff=1e-2"]),
        ("forking", ["actor_rollout_ref.actor.clip_ratio_high=0.2"]),
    ],
)  # fmt: skip
def test_overrides_the_method_keeps_are_not_refused(spec, overrides):
    assert parse_method_spec(spec).replaced_overrides(overrides) == []


def test_train_and_compare_refuse_a_replaced_override_before_anything_runs(tmp_path, capsys):
    from stare_verl.jobs.compare import main as compare_main
    from stare_verl.jobs.train.options import TrainOptions, bad_option

    opts = TrainOptions.parse({"method": "stare:reweight_w=2", "overrides": ["algorithm.stare.reweight_w=3"]})
    problem = bad_option(opts)
    assert problem is not None and "algorithm.stare.reweight_w=2.0" in problem and "reweight_w=3" in problem
    # compare checks every method's runs, not only the first method's
    rc = compare_main(["--methods", "grpo", "entropy_bonus", "--seeds", "0", "--out", str(tmp_path / "c"),
                       "--dry-run", "actor_rollout_ref.actor.entropy_coeff=0.01"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "entropy_bonus sets actor_rollout_ref.actor.entropy_coeff=0.001" in err
    assert not (tmp_path / "c").exists()
