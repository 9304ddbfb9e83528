"""verl V1 trainer modes that feed STARE: ``stare_sync`` and ``stare_colocate_async``.

verl's own ``_compute_advantage`` hands estimators only rewards, mask, uid and config. These modes behave
exactly like verl's ``sync`` and ``colocate_async`` (they read the same ``trainer.v1.<mode>`` sections and
replay buffers), except that with ``algorithm.adv_estimator=stare`` they also fetch the pre-update
policy's ``old_log_probs`` and ``entropy``, call the estimator with them, and keep STARE's controller state in
verl's checkpoints (``global_step_N/stare_state.json``). For every other estimator they defer to verl
unchanged.

Registered by :func:`register` (called from ``stare_verl.plugin``). verl is imported only inside functions:
the two trainer classes subclass verl's, so they are built on first use (:func:`trainer_classes`, also reached
as the module attributes ``StareTrainerSync`` / ``StareTrainerColocateAsync``), and importing this module
first never runs verl's plugin loader half-way through it.

Why the estimator is called directly rather than through ``verl.trainer.ppo.ray_trainer.compute_advantage``:
in verl 0.9.1 that function, for a registered estimator (any name but ``gae``/``grpo``), only fills a missing
``response_mask``, passes ``token_level_rewards``, ``response_mask``, ``config`` and, when present, ``uid`` as
``index`` and ``reward_baselines`` (extras only for ``gdpo`` and the optimal-token baselines), and stores the
returned pair as ``advantages`` / ``returns``; the V1 trainer's ``compute_advantage_for_multi_trajectories``
hands every estimator but ``grpo`` to it unchanged. Nothing else happens there, so the direct call below is
the same computation without smuggling tensors through ``config``.
"""

from __future__ import annotations

import functools
import json
import logging
import os

import numpy as np

from stare_verl.config import parse_stare_config
from stare_verl.controller import StareController
from stare_verl.estimator import (
    ESTIMATOR_NAME,
    STARE_TRAINER_MODES,
    StareInputsMissing,
    compute_stare_advantage,
)

logger = logging.getLogger(__name__)

STATE_FILE = "stare_state.json"


class StareTrainerMixin:
    """Adds STARE's inputs, metrics and checkpointed state to a verl V1 trainer.

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
        self.stare_controller = None
        algo = config.algorithm
        if algo.adv_estimator == ESTIMATOR_NAME:
            # Validate at start-up: a bad algorithm.stare stops the run before any worker starts.
            self.stare_controller = StareController(parse_stare_config(algo))
            rc = algo.get("rollout_correction", None)
            if rc is not None and rc.get("bypass_mode", False):
                raise ValueError(
                    "algorithm.adv_estimator=stare needs the actor's entropy, which verl does not compute with "
                    "algorithm.rollout_correction.bypass_mode=true; set it to false"
                )
        super().__init__(config)

    # --- advantage ---------------------------------------------------------------------------------
    def _compute_advantage(self, batch, metrics: dict):
        if self.stare_controller is None:
            return super()._compute_advantage(batch, metrics)
        import transfer_queue as tq
        from tensordict import TensorDict
        from verl.protocol import DataProto
        from verl.trainer.ppo.ray_trainer import apply_kl_penalty
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
        from verl.workers.utils.padding import response_to_nested

        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "entropy"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        nested_mask = data["response_mask"]
        data = DataProto(batch=data.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        uid = np.array(data.batch.pop("uid").tolist(), dtype=object)
        data.non_tensor_batch["uid"] = uid

        algo = self.config.algorithm
        if algo.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(
                data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty
            )
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]

        rc = algo.get("rollout_correction", None)
        rollout_correction = rc is not None and "rollout_log_probs" in data.batch
        if rollout_correction:
            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rc)
            metrics.update(is_metrics)

        advantages, returns = compute_stare_advantage(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=data.batch["response_mask"],
            index=uid,
            config=algo,
            old_log_probs=data.batch["old_log_probs"],
            entropys=data.batch["entropy"],
            controller=self.stare_controller,
            metrics=metrics,
        )
        data.batch["advantages"], data.batch["returns"] = advantages, returns
        metrics.update(reward_extra_means(batch))

        out_fields = ["advantages", "returns"]
        if algo.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = TensorDict(
            {f: response_to_nested(data.batch[f], nested_mask) for f in out_fields}, batch_size=len(batch)
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    # --- checkpoints -------------------------------------------------------------------------------
    def _save_checkpoint(self):
        if self.stare_controller is not None:
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            os.makedirs(folder, exist_ok=True)
            save_controller_state(self.stare_controller, folder)
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.stare_controller is not None and self.global_steps > 0:
            trainer_cfg = self.config.trainer
            if trainer_cfg.resume_mode == "resume_path":
                folder = trainer_cfg.resume_from_path
            else:
                folder = os.path.join(trainer_cfg.default_local_dir, f"global_step_{self.global_steps}")
            load_controller_state(self.stare_controller, os.path.abspath(folder))
        return result


REWARD_EXTRA_METRICS = {"acc": "reward/acc/mean", "has_answer": "reward/has_answer/mean"}


def reward_extra_means(batch) -> dict[str, float]:
    """Per-step means of the reward function's ``acc`` and ``has_answer`` (``envs.reward.compute_score``
    returns both; verl's agent loop keeps them in each trajectory's ``extra_fields["reward_extra_info"]``), as
    ``reward/acc/mean`` (the training accuracy) and ``reward/has_answer/mean``. verl logs only the reward's
    ``score`` at training time (``critic/score/mean``), which differs from the accuracy once a penalty (e.g.
    DAPO's overlong shaping) is added. Keys a reward function does not return are left out; a metric never
    stops training, so any failure to read them is logged and returns {}."""
    try:
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        values: dict[str, list[float]] = {k: [] for k in REWARD_EXTRA_METRICS}
        for item in list(data["extra_fields"]):
            fields = getattr(item, "data", item)
            info = fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {}
            for key in REWARD_EXTRA_METRICS:
                if isinstance(info.get(key), bool | int | float | np.bool_ | np.number):
                    values[key].append(float(info[key]))
        return {REWARD_EXTRA_METRICS[k]: float(np.mean(v)) for k, v in values.items() if v}
    except Exception as err:  # noqa: BLE001 - a metric must never stop a training run
        logger.warning("could not read the reward's acc/has_answer for metrics: %r", err)
        return {}


def save_controller_state(controller: StareController, folder: str) -> str:
    """Write the controller state as JSON into a ``global_step_N`` folder (atomically); returns the path."""
    path = os.path.join(folder, STATE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(controller.state_dict(), f)
    os.replace(tmp, path)
    return path


def load_controller_state(controller: StareController, folder: str) -> bool:
    """Restore the controller from ``folder/stare_state.json``; False (with a warning) when there is none.

    Raises:
        ValueError: the file exists but is not a valid controller state.
    """
    path = os.path.join(folder, STATE_FILE)
    if not os.path.exists(path):
        logger.warning(
            "no %s in %s: STARE controller starts fresh (W, M at their configured values)", STATE_FILE, folder
        )
        return False
    with open(path) as f:
        controller.load_state_dict(json.load(f))
    logger.info("restored STARE controller state from %s: W=%.4f M=%.4f", path, controller.w, controller.m)
    return True


def refuse_stare_without_inputs(trainer, config) -> None:
    """The trainer guard (installed on verl's ``PPOTrainer.__init__`` by :func:`register`, through
    ``stare_verl.verl_compat``): ``adv_estimator=stare`` with a trainer that cannot feed it (any mode but
    ``stare_*``) stops at start-up. The estimator refuses such calls too.

    Raises:
        StareInputsMissing: the estimator is ``stare`` and ``trainer`` is not a STARE trainer mode.
    """
    if config.algorithm.get("adv_estimator") == ESTIMATOR_NAME and not isinstance(trainer, StareTrainerMixin):
        raise StareInputsMissing(
            f"algorithm.adv_estimator=stare with trainer.v1.trainer_mode="
            f"{config.trainer.v1.get('trainer_mode')}: this trainer does not pass old log-probs and entropy "
            f"to advantage estimators. Use trainer.v1.trainer_mode={' or '.join(STARE_TRAINER_MODES)}."
        )


@functools.cache
def trainer_classes() -> dict[str, type]:
    """The STARE trainer modes by name: verl's ``sync`` and ``colocate_async`` trainers with
    :class:`StareTrainerMixin` (built once, on first use: their bases are verl classes)."""
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    class StareTrainerSync(StareTrainerMixin, PPOTrainerSync):
        """verl's ``sync`` trainer that feeds the ``stare`` estimator (``trainer.v1.trainer_mode=stare_sync``)."""

        VERL_MODE = "sync"

    class StareTrainerColocateAsync(StareTrainerMixin, PPOTrainerColocateAsync):
        """verl's ``colocate_async`` trainer that feeds the ``stare`` estimator."""

        VERL_MODE = "colocate_async"

    classes = {"stare_sync": StareTrainerSync, "stare_colocate_async": StareTrainerColocateAsync}
    for cls in classes.values():  # pickled by reference through this module's __getattr__
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return classes


_CLASS_NAMES = {"StareTrainerSync": "stare_sync", "StareTrainerColocateAsync": "stare_colocate_async"}


def __getattr__(name: str):
    if name in _CLASS_NAMES:
        return trainer_classes()[_CLASS_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Register the ``stare_*`` trainer modes in verl's trainer registry and install the trainer guard
    (idempotent).

    Raises:
        stare_verl.verl_compat.VerlVersionError: the installed verl is not the pinned version.
    """
    from verl.trainer.ppo.v1.trainer_base import register_trainer

    from stare_verl.verl_compat import install_trainer_guard

    for mode, cls in trainer_classes().items():
        register_trainer(mode)(cls)
    install_trainer_guard(refuse_stare_without_inputs)
