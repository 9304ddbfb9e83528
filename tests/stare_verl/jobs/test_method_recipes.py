"""Every entropy-control method composes onto every family's CPU recipe and validates as a launch would, and the
actor config the workers build from it carries the method's verl keys."""

import pytest
from verl.utils.config import omega_conf_to_dataclass

from stare_verl.jobs.recipes import compose_recipe, validate_recipe
from stare_verl.jobs.train import method_overrides
from stare_verl.methods import METHODS, parse_method_spec

pytestmark = pytest.mark.integration

PLACEHOLDERS = ["actor_rollout_ref.model.path=x", "data.train_files=x", "data.val_files=x",
                "trainer.default_local_dir=x"]  # fmt: skip


@pytest.mark.parametrize("family", ["shortcot", "longcot", "tooluse"])
def test_every_method_validates_on_every_cpu_recipe(family):
    for name in METHODS:
        method = parse_method_spec(name)
        cfg = compose_recipe(f"cpu/{family}_tiny_{method.recipe}", PLACEHOLDERS + method_overrides(method, []))
        parsed = validate_recipe(cfg)
        assert parsed is not None, name  # every method runs through our trainer mode (shared metrics)
        if method.estimator:
            assert cfg.algorithm.adv_estimator == method.estimator
        else:  # the twin: GRPO-ds exactly
            assert (cfg.algorithm.stare.reweight_w, cfg.algorithm.stare.reweight_m) == (1.0, 1.0)


def test_the_workers_actor_config_carries_the_methods_keys():
    def actor(spec):
        method = parse_method_spec(spec)
        cfg = compose_recipe(f"cpu/shortcot_tiny_{method.recipe}", PLACEHOLDERS + method_overrides(method, []))
        return cfg, omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # as verl's actor worker builds it

    _, a = actor("entropy_bonus:coef=0.003")
    assert a.entropy_coeff == 0.003
    _, a = actor("clip_cov:ratio=0.01,lb=0.5,ub=4,clip_ratio=1")
    pl = a.policy_loss
    assert (pl.loss_mode, pl.clip_cov_ratio, pl.clip_cov_lb, pl.clip_cov_ub) == ("clip_cov", 0.01, 0.5, 4.0)
    assert (a.clip_ratio_low, a.clip_ratio_high) == (1.0, 1.0)
    _, a = actor("kl_cov")
    assert (a.policy_loss.loss_mode, a.policy_loss.kl_cov_ratio, a.policy_loss.ppo_kl_coef) == ("kl_cov", 2e-3, 1.0)
    _, a = actor("grpo")
    assert (a.policy_loss.loss_mode, a.entropy_coeff, a.clip_ratio_low, a.clip_ratio_high) == ("vanilla", 0.0, 0.2, 0.28)
    cfg, a = actor("adaptive_entropy")
    assert a.calculate_entropy and a.entropy_coeff == 0.0
    # the adaptive coefficient aims at the family's calibrated target unless told otherwise
    assert cfg.algorithm.adaptive_entropy.target_entropy == cfg.algorithm.stare.target_entropy == 0.11
    cfg, _ = actor("repo_r")
    assert cfg.algorithm.adv_estimator == "repo_r" and cfg.algorithm.repo_r.target_entropy == 0.11
    assert (cfg.algorithm.repo_r.zeta, cfg.algorithm.repo_r.zeta_min, cfg.algorithm.repo_r.zeta_max) == (1e-3, 1e-4, 0.05)
