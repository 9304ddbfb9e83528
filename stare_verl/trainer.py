"""verl V1 trainer modes that feed entropy-control methods the token statistics: ``token_stats_sync`` and
``token_stats_colocate_async`` (:data:`stare_verl.methods.TOKEN_STATS_MODES`).

verl's own ``_compute_advantage`` hands estimators only rewards, mask, uid and config. These modes behave
exactly like verl's ``sync`` and ``colocate_async`` (they read the same ``trainer.v1.<mode>`` sections and
replay buffers), except that when ``algorithm.adv_estimator`` names one of our methods
(:data:`stare_verl.methods.ESTIMATORS`: STARE, the forking-token rule, the entropy advantage, the adaptive entropy
coefficient, REPO-R) they also fetch the pre-update policy's ``old_log_probs`` and ``entropy``, let the method compute the
advantages, log the shared ``entropy_control/*`` metrics (:func:`stare_verl.methods.metrics.entropy_dynamics`),
pass the method's per-step settings to the actor update, and keep its controller state in verl's checkpoints
(``global_step_N/<method.state_file>``, e.g. ``stare_state.json``). For every other estimator they defer to verl
unchanged. Their older names ``stare_sync`` / ``stare_colocate_async`` (from when STARE was the only method) are
registered too, for older recipes (:data:`stare_verl.methods.TRAINER_MODE_ALIASES`). Whether a config can run is
one rule, :func:`stare_verl.methods.check_runnable`, checked by these modes at start-up and by the guard on verl's
other trainers.

Registered by :func:`register` (called from ``stare_verl.plugin``). verl is imported only inside functions:
the two trainer classes subclass verl's, so they are built on first use (:func:`trainer_classes`, also reached
as the module attributes ``StareTrainerSync`` / ``StareTrainerColocateAsync``), and importing this module
first never runs verl's plugin loader half-way through it. verl's own steps around the estimator (TransferQueue
reads and writes, KL in reward, rollout correction) are reproduced in ``stare_verl.verl_compat``, behind its
version gate.
"""

from __future__ import annotations

import functools
import json
import logging
import os

import numpy as np

from stare_verl.methods import (
    TOKEN_STATS_MODES,
    TRAINER_MODE_ALIASES,
    EntropyControl,
    check_runnable,
)
from stare_verl.methods.metrics import entropy_dynamics

logger = logging.getLogger(__name__)

STATE_FILE = "stare_state.json"
"""STARE's controller state file in a ``global_step_N`` folder (each method names its own: ``state_file``)."""


class StareTrainerMixin:
    """Adds an entropy-control method's inputs, metrics, per-step actor settings and checkpointed state to a verl
    V1 trainer.

    Subclasses set ``VERL_MODE`` to the verl mode they reproduce; verl's trainer code branches on
    ``self.trainer_mode`` ("sync" vs the async modes), so it reads as that mode.
    """

    VERL_MODE: str = "sync"

    @property
    def trainer_mode(self) -> str:  # verl assigns config.trainer.v1.trainer_mode; we report the base mode
        return self.VERL_MODE

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        pass

    def __init__(self, config):
        # Validated at start-up: a bad algorithm.<method> stops the run before any worker starts.
        self.entropy_method: EntropyControl | None = check_runnable(config, feeds=True)
        super().__init__(config)

    @property
    def stare_controller(self):
        """STARE's controller when the method is STARE (None otherwise)."""
        return getattr(self.entropy_method, "controller", None)

    def _setup(self):
        super()._setup()
        if self.entropy_method is not None and self.entropy_method.actor_extra():
            from stare_verl.verl_compat import install_step_settings_loss

            install_step_settings_loss(self)

    # --- advantage ---------------------------------------------------------------------------------
    def _compute_advantage(self, batch, metrics: dict):
        if self.entropy_method is None:
            return super()._compute_advantage(batch, metrics)
        from stare_verl.verl_compat import fetch_advantage_inputs, put_advantages

        data, nested_mask, out_fields = fetch_advantage_inputs(self, batch, metrics)
        mask, lp, ent = data.batch["response_mask"], data.batch["old_log_probs"], data.batch["entropy"]
        base, eff = self.entropy_method.advantage(
            data.batch["token_level_rewards"], mask, data.non_tensor_batch["uid"], self.config.algorithm, lp, ent,
            metrics,
        )
        metrics.update(entropy_dynamics(base, eff, mask, lp, ent, computed=metrics))
        target = self.entropy_method.target_entropy()
        if target is not None:
            metrics["entropy_control/target_entropy"] = target
        data.batch["advantages"], data.batch["returns"] = eff, eff
        metrics.update(reward_extra_means(batch))
        return put_advantages(batch, data, nested_mask, out_fields)

    def _update_actor(self, batch, metrics: dict):
        if self.entropy_method is not None:
            batch.extra_info.update(self.entropy_method.actor_extra())
        return super()._update_actor(batch, metrics)

    # --- checkpoints -------------------------------------------------------------------------------
    def _save_checkpoint(self):
        if self.entropy_method is not None and self.entropy_method.state_file:
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            os.makedirs(folder, exist_ok=True)
            save_method_state(self.entropy_method, folder)
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.entropy_method is not None and self.entropy_method.state_file and self.global_steps > 0:
            trainer_cfg = self.config.trainer
            if trainer_cfg.resume_mode == "resume_path":
                folder = trainer_cfg.resume_from_path
            else:
                folder = os.path.join(trainer_cfg.default_local_dir, f"global_step_{self.global_steps}")
            load_method_state(self.entropy_method, os.path.abspath(folder))
        return result


REWARD_EXTRA_SKIPPED = ("score",)
"""Reward extra-info keys left out of the per-step means: verl logs the score itself (``critic/score/mean``)."""


_NUMBER = (bool, int, float, np.bool_, np.integer, np.floating)


def reward_extra_metric(key: str) -> str:
    """The per-step metric name of the reward's extra-info value ``key``: ``reward/<key>/mean`` (e.g.
    ``reward/acc/mean``, the training accuracy; ``reward/num_tool_calls/mean`` for a tool-use reward)."""
    return f"reward/{key}/mean"


def reward_extra_means_of(infos) -> dict[str, float]:
    """Per-step means of the reward function's numeric extra values, as ``reward/<key>/mean``
    (:func:`reward_extra_metric`).

    Args:
        infos: one mapping per trajectory (its ``reward_extra_info``); anything else counts as empty.

    Returns:
        for every key with at least one bool / int / float value (numpy scalars included; bools count 0 / 1),
        the mean over the trajectories that have a number there; string values (``pred``, ``verify_method``)
        and :data:`REWARD_EXTRA_SKIPPED` are left out, non-finite values too. Pure: never raises for odd values.
    """
    values: dict[str, list[float]] = {}
    for info in infos:
        if not isinstance(info, dict):
            continue
        for key, value in info.items():
            if key in REWARD_EXTRA_SKIPPED or not isinstance(value, _NUMBER):
                continue
            if np.isfinite(float(value)):
                values.setdefault(key, []).append(float(value))
    return {reward_extra_metric(k): float(np.mean(v)) for k, v in values.items()}


def reward_extra_means(batch) -> dict[str, float]:
    """:func:`reward_extra_means_of` of a step's trajectories: the reward function's numeric extra values (verl's
    agent loop keeps them in each trajectory's ``extra_fields["reward_extra_info"]``), e.g. ``acc`` and
    ``has_answer`` of ``envs.reward.compute_score`` (``reward/acc/mean``, the training accuracy) and the tool-use
    reward's per-episode tool statistics (``reward/num_tool_calls/mean``, ``reward/num_tool_errors/mean``, ...).
    verl logs only the reward's ``score`` at training time (``critic/score/mean``), which differs from the
    accuracy once a penalty (e.g. DAPO's overlong shaping) is added. A metric never stops training, so any
    failure to read them is logged and returns {}."""
    try:
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        infos = []
        for item in list(data["extra_fields"]):
            fields = getattr(item, "data", item)
            infos.append(fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {})
        return reward_extra_means_of(infos)
    except Exception as err:  # noqa: BLE001 - a metric must never stop a training run
        logger.warning("could not read the reward's extra values for metrics: %r", err)
        return {}


def save_method_state(method: EntropyControl, folder: str) -> str:
    """Write the method's controller state as JSON into a ``global_step_N`` folder (atomically), as
    ``method.state_file``; returns the path."""
    path = os.path.join(folder, method.state_file)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(method.state_dict(), f)
    os.replace(tmp, path)
    return path


def load_method_state(method: EntropyControl, folder: str) -> bool:
    """Restore the method's controller from ``folder/<method.state_file>``; False (with a warning) when there is
    none.

    Raises:
        ValueError: the file exists but is not a valid state of this method.
    """
    path = os.path.join(folder, method.state_file)
    if not os.path.exists(path):
        logger.warning("no %s in %s: the %s controller starts fresh (its configured values)", method.state_file,
                       folder, method.name)  # fmt: skip
        return False
    with open(path) as f:
        method.load_state_dict(json.load(f))
    logger.info("restored the %s controller state from %s: %s", method.name, path, method.state_dict())
    return True


def save_controller_state(controller, folder: str) -> str:
    """STARE's controller state into ``folder/stare_state.json`` (:func:`save_method_state` of a STARE method)."""
    from stare_verl.methods.stare import Stare

    method = Stare(controller.config)
    method.controller = controller
    return save_method_state(method, folder)


def load_controller_state(controller, folder: str) -> bool:
    """Restore STARE's ``controller`` from ``folder/stare_state.json`` (see :func:`load_method_state`)."""
    from stare_verl.methods.stare import Stare

    method = Stare(controller.config)
    method.controller = controller
    return load_method_state(method, folder)


def refuse_stare_without_inputs(trainer, config) -> None:
    """The trainer guard (installed on verl's ``PPOTrainer.__init__`` by :func:`register`, through
    ``stare_verl.verl_compat``): an ``algorithm.adv_estimator`` of ours (a method that needs token statistics)
    with a trainer that cannot feed it stops at start-up. Our own modes check :func:`check_runnable` in their
    ``__init__``; for verl's, whatever ``trainer_mode`` says, the trainer class decides. The estimators refuse
    such calls too.

    Raises:
        EntropyInputsMissing: the estimator is one of ours and ``trainer`` is not one of our trainer modes.
    """
    if not isinstance(trainer, StareTrainerMixin):
        check_runnable(config, feeds=False)


@functools.cache
def trainer_classes() -> dict[str, type]:
    """The token-statistics trainer modes by name: verl's ``sync`` and ``colocate_async`` trainers with
    :class:`StareTrainerMixin` (built once, on first use: their bases are verl classes)."""
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    class StareTrainerSync(StareTrainerMixin, PPOTrainerSync):
        """verl's ``sync`` trainer that feeds our methods' estimators (``trainer.v1.trainer_mode=token_stats_sync``)."""

        VERL_MODE = "sync"

    class StareTrainerColocateAsync(StareTrainerMixin, PPOTrainerColocateAsync):
        """verl's ``colocate_async`` trainer that feeds our methods' estimators."""

        VERL_MODE = "colocate_async"

    by_base = {"sync": StareTrainerSync, "colocate_async": StareTrainerColocateAsync}
    classes = {mode: by_base[base] for mode, base in TOKEN_STATS_MODES.items()}
    for cls in classes.values():  # pickled by reference through this module's __getattr__
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return classes


_CLASS_NAMES = {"StareTrainerSync": "token_stats_sync", "StareTrainerColocateAsync": "token_stats_colocate_async"}


def __getattr__(name: str):
    if name in _CLASS_NAMES:
        return trainer_classes()[_CLASS_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Register the token-statistics trainer modes in verl's trainer registry, under their names and their older
    aliases, and install the trainer guard (idempotent).

    Raises:
        stare_verl.verl_compat.VerlVersionError: the installed verl is not the pinned version.
    """
    from verl.trainer.ppo.v1.trainer_base import register_trainer

    from stare_verl.verl_compat import install_trainer_guard

    classes = trainer_classes()
    for mode, cls in classes.items():
        register_trainer(mode)(cls)
    for old, mode in TRAINER_MODE_ALIASES.items():
        register_trainer(old)(classes[mode])
    install_trainer_guard(refuse_stare_without_inputs)
