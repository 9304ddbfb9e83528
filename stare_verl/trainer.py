"""verl V1 trainer modes that feed STARE: ``stare_sync`` and ``stare_colocate_async``.

verl's own ``_compute_advantage`` hands estimators only rewards, mask, uid and config. These modes behave
exactly like verl's ``sync`` and ``colocate_async`` (they read the same ``trainer.v1.<mode>`` sections and
replay buffers), except that with ``algorithm.adv_estimator=stare`` they also fetch the pre-update
policy's ``old_log_probs`` and ``entropy`` and keep STARE's controller state in verl's checkpoints
(``global_step_N/stare_state.json``). For every other estimator they defer to verl unchanged.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import transfer_queue as tq
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from stare_verl.config import parse_stare_config
from stare_verl.controller import StareController
from stare_verl.estimator import ESTIMATOR_NAME, STARE_TRAINER_MODES, StareInputs, StareInputsMissing

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
        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "entropy"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        nested_mask = data["response_mask"]
        data = DataProto(batch=data.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)

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

        data = compute_advantage(
            data,
            adv_estimator=ESTIMATOR_NAME,
            config=StareInputs.from_data(algo, data, controller=self.stare_controller, metrics=metrics),
        )
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


def _refuse_stare_without_inputs(init):
    """Wrap verl's ``PPOTrainer.__init__`` so that ``adv_estimator=stare`` with a trainer that cannot feed it
    (any mode but ``stare_*``) stops at start-up, before workers and rollouts, instead of at the first
    advantage computation. The one patch of verl that STARE needs; the estimator refuses such calls too."""
    if getattr(init, "_stare_guard", False):
        return init

    def __init__(self, config, *args, **kwargs):
        if config.algorithm.get("adv_estimator") == ESTIMATOR_NAME and not isinstance(
            self, StareTrainerMixin
        ):
            raise StareInputsMissing(
                f"algorithm.adv_estimator=stare with trainer.v1.trainer_mode="
                f"{config.trainer.v1.get('trainer_mode')}: this trainer does not pass old log-probs and entropy "
                f"to advantage estimators. Use trainer.v1.trainer_mode={' or '.join(STARE_TRAINER_MODES)}."
            )
        init(self, config, *args, **kwargs)

    __init__._stare_guard = True
    __init__.__wrapped__ = init
    return __init__


PPOTrainer.__init__ = _refuse_stare_without_inputs(PPOTrainer.__init__)


@register_trainer("stare_sync")
class StareTrainerSync(StareTrainerMixin, PPOTrainerSync):
    """verl's ``sync`` trainer that feeds the ``stare`` estimator (``trainer.v1.trainer_mode=stare_sync``)."""

    VERL_MODE = "sync"


@register_trainer("stare_colocate_async")
class StareTrainerColocateAsync(StareTrainerMixin, PPOTrainerColocateAsync):
    """verl's ``colocate_async`` trainer that feeds the ``stare`` estimator."""

    VERL_MODE = "colocate_async"
