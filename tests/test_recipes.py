"""Every recipe composes on verl's ppo_trainer and passes verl's own config validation on CPU."""

import glob
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.utils.config import omega_conf_to_dataclass, validate_config
from verl.utils.import_utils import load_extern_object
from verl.workers.config import RolloutConfig

from stare_verl.config import parse_stare_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = sorted(
    os.path.basename(p)[:-5] for p in glob.glob(os.path.join(ROOT, "recipes", "*.yaml"))
)


def _compose(name, resolve=True):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "recipes"), version_base=None):
        cfg = compose(config_name=name)
    if resolve:
        OmegaConf.resolve(cfg)
    return cfg


def test_every_family_has_stare_and_grpo_versions():
    stare = {r[: -len("_stare")] for r in RECIPES if r.endswith("_stare")}
    grpo = {r[: -len("_grpo")] for r in RECIPES if r.endswith("_grpo")}
    assert stare == grpo
    assert {s.split("_")[0] for s in stare} == {"shortcot", "longcot", "tooluse"}
    assert len(stare) == 5


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_and_validates(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = _compose(name)
    validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
    # sections verl turns into dataclasses at launch
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout, dataclass_type=RolloutConfig)
    algo = OmegaConf.to_container(cfg.algorithm)
    stare = parse_stare_config(cfg.algorithm)  # our keys, validated like at start-up
    algo.pop("stare")
    omega_conf_to_dataclass(OmegaConf.create(algo))  # verl's AlgoConfig accepts the rest
    assert cfg.algorithm.adv_estimator in ADV_ESTIMATOR_REGISTRY
    assert get_trainer_cls(cfg.trainer.v1.trainer_mode).__name__ == "StareTrainerSync"
    assert cfg.actor_rollout_ref.rollout.name == "sglang"
    fn = cfg.reward.custom_reward_function
    assert callable(load_extern_object(fn.path, fn.name))
    if name.endswith("_grpo"):
        assert (stare.reweight_w, stare.reweight_m) == (1.0, 1.0)
        twin = _compose(name[: -len("_grpo")] + "_stare", resolve=False)
        raw = _compose(name, resolve=False)
        for key in ("algorithm.stare.reweight_w", "algorithm.stare.reweight_m", "trainer.experiment_name"):
            OmegaConf.update(raw, key, OmegaConf.select(twin, key))
        assert raw == twin  # identical but for reweighting
    else:
        assert stare.reweight_w > 1.0
    if name.startswith("tooluse"):
        mt = cfg.actor_rollout_ref.rollout.multi_turn
        assert mt.enable and os.path.exists(mt.tool_config_path)
