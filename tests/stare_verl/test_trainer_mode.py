"""The stare_* trainer modes: start-up validation, verl mode semantics, controller state in checkpoints."""

import json
import os

import pytest
from hydra import compose, initialize_config_module
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from stare_verl.methods.adaptive_entropy import AdaptiveEntropy, AdaptiveEntropyConfig
from stare_verl.methods.repo_r import RepoR, RepoRConfig
from stare_verl.methods.stare import Stare
from stare_verl.methods.stare.config import StareConfig, StareConfigError
from stare_verl.trainer import STATE_FILE, StareTrainerColocateAsync, StareTrainerSync

pytestmark = pytest.mark.integration


def _compose(*overrides):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def test_bad_stare_config_stops_at_startup():
    cfg = _compose(
        "algorithm.adv_estimator=stare",
        "+algorithm.stare.reweight_w=-1",
        "trainer.v1.trainer_mode=token_stats_sync",
    )
    with pytest.raises(StareConfigError, match="reweight_w"):
        StareTrainerSync(cfg)


def test_bypass_mode_is_refused_at_startup():
    cfg = _compose("algorithm.adv_estimator=stare", "algorithm.rollout_correction.bypass_mode=true")
    with pytest.raises(ValueError, match="bypass_mode"):
        StareTrainerSync(cfg)


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_verl_trainer_with_stare_stops_at_startup(mode):
    from verl.trainer.ppo.v1 import get_trainer_cls

    from stare_verl.methods import EntropyInputsMissing

    cfg = _compose("algorithm.adv_estimator=stare", f"trainer.v1.trainer_mode={mode}")
    with pytest.raises(EntropyInputsMissing, match="trainer_mode=token_stats_sync"):
        get_trainer_cls(mode)(cfg)


def test_modes_read_as_verl_modes():
    t = object.__new__(StareTrainerSync)
    t.trainer_mode = "token_stats_sync"  # what verl's __init__ assigns
    assert t.trainer_mode == "sync"
    assert object.__new__(StareTrainerColocateAsync).trainer_mode == "colocate_async"


def test_controller_state_saved_and_restored(tmp_path, monkeypatch):
    calls = []

    def fake_save(self):
        calls.append(("save", self.global_steps))

    def fake_load(self):
        self.global_steps = 7
        calls.append(("load", 7))

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", fake_save)
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", fake_load)
    cfg = _compose(f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto")

    cfg_stare = StareConfig(adaptive=True, alpha=0.05, variant="C2")
    trainer = object.__new__(StareTrainerSync)
    trainer.config, trainer.global_steps = cfg, 7
    trainer.entropy_method = Stare(cfg_stare)
    for h in (0.1, 0.1, 0.5):
        trainer.stare_controller.step(h)
    trainer._save_checkpoint()
    path = tmp_path / "global_step_7" / STATE_FILE
    state = json.loads(path.read_text())
    assert state["w"] == pytest.approx(1.15) and state["m"] == pytest.approx(0.85) and state["steps"] == 3

    resumed = object.__new__(StareTrainerSync)
    resumed.config = cfg
    resumed.entropy_method = Stare(cfg_stare)
    resumed._load_checkpoint()
    assert (resumed.stare_controller.w, resumed.stare_controller.m, resumed.stare_controller.steps) == (
        trainer.stare_controller.w,
        trainer.stare_controller.m,
        3,
    )
    assert resumed.stare_controller.step(0.2) == trainer.stare_controller.step(0.2)
    assert calls == [("save", 7), ("load", 7)]
    # a checkpoint without STARE state (e.g. from a GRPO run) resumes with a fresh controller
    os.remove(path)
    fresh = object.__new__(StareTrainerSync)
    fresh.config, fresh.entropy_method = cfg, Stare(cfg_stare)
    fresh._load_checkpoint()
    assert fresh.stare_controller.steps == 0


def test_adaptive_entropy_coefficient_saved_and_restored(tmp_path, monkeypatch):
    """The adaptive entropy coefficient's controller state goes into verl's checkpoint folder and comes back."""
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: None)
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 4))
    cfg = _compose(f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto")
    method_cfg = AdaptiveEntropyConfig(target_entropy=0.2, delta=0.01, coef_max=0.05)
    trainer = object.__new__(StareTrainerSync)
    trainer.config, trainer.global_steps = cfg, 4
    trainer.entropy_method = AdaptiveEntropy(method_cfg)
    trainer.entropy_method.coef, trainer.entropy_method.steps = 0.03, 4
    trainer._save_checkpoint()
    saved = json.loads((tmp_path / "global_step_4" / "adaptive_entropy_state.json").read_text())
    assert saved["coef"] == 0.03 and saved["steps"] == 4
    resumed = object.__new__(StareTrainerSync)
    resumed.config, resumed.entropy_method = cfg, AdaptiveEntropy(method_cfg)
    resumed._load_checkpoint()
    assert (resumed.entropy_method.coef, resumed.entropy_method.steps) == (0.03, 4)


def test_repo_r_zeta_saved_and_restored(tmp_path, monkeypatch):
    """REPO-R's zeta goes into verl's checkpoint folder and comes back (as STARE's controller)."""
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: None)
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 3))
    cfg = _compose(f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto")
    trainer = object.__new__(StareTrainerSync)
    trainer.config, trainer.global_steps = cfg, 3
    trainer.entropy_method = RepoR(RepoRConfig())
    trainer.entropy_method.zeta, trainer.entropy_method.steps = 0.008, 3
    trainer._save_checkpoint()
    saved = json.loads((tmp_path / "global_step_3" / "repo_r_state.json").read_text())
    assert saved["zeta"] == 0.008 and saved["steps"] == 3
    resumed = object.__new__(StareTrainerSync)
    resumed.config, resumed.entropy_method = cfg, RepoR(RepoRConfig())
    resumed._load_checkpoint()
    assert (resumed.entropy_method.zeta, resumed.entropy_method.steps) == (0.008, 3)
