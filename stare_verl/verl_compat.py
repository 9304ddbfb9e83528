"""The verl version gate, and the one patch of verl that STARE itself (not only the CPU backend) needs.

Every patch of verl internals in this project sits behind :func:`check_verl_version`: the CPU backend's
(``stare_verl.cpu.verl_compat``, imported only with ``VERL_PLATFORM=cpu``) and the trainer guard here,
which is installed on every machine (GPU nodes too), hence outside ``cpu/``.

The trainer guard wraps ``verl.trainer.ppo.v1.trainer_base.PPOTrainer.__init__`` so that
``algorithm.adv_estimator=stare`` with a trainer that cannot feed the estimator (any mode but ``stare_*``)
stops at start-up, before workers and rollouts, instead of at the first advantage computation. It relies on
verl 0.9.1's class layout (every V1 trainer mode subclasses ``PPOTrainer`` and receives the full config).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

PINNED_VERL_VERSION = "0.9.1"


class VerlVersionError(RuntimeError):
    """Raised when the installed verl is not the version these patches were written against."""


def _installed_verl_version() -> str:
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError as e:  # pragma: no cover - verl is a dependency
        raise VerlVersionError("stare_verl needs verl installed (pip install 'verl[verl-core]==0.9.1')") from e


def check_verl_version() -> str:
    """Return the installed verl version; raise :class:`VerlVersionError` unless it is the pinned one."""
    version = _installed_verl_version()
    if version != PINNED_VERL_VERSION:
        raise VerlVersionError(
            f"stare_verl patches verl internals (the stare trainer guard; the CPU backend: platform 'cpu', rollout "
            f"'hf') and supports verl=={PINNED_VERL_VERSION} only; found verl=={version}. Install "
            f"verl[verl-core]=={PINNED_VERL_VERSION}."
        )
    return version


def install_trainer_guard(refuse: Callable[[object, object], None]) -> None:
    """Wrap verl's ``PPOTrainer.__init__`` so that ``refuse(trainer, config)`` runs first (idempotent).

    Args:
        refuse: raises when the trainer cannot run the configured estimator; returns None otherwise.

    Raises:
        VerlVersionError: the installed verl is not :data:`PINNED_VERL_VERSION`.
    """
    check_verl_version()
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    init = PPOTrainer.__init__
    if getattr(init, "_stare_guard", False):
        return

    def __init__(self, config, *args, **kwargs):
        refuse(self, config)
        init(self, config, *args, **kwargs)

    __init__._stare_guard = True
    __init__.__wrapped__ = init
    PPOTrainer.__init__ = __init__


# --------------------------------------------------------------------------------------------------------------
# verl's steps around the advantage in the V1 trainer (trainer_base.PPOTrainer._compute_advantage in 0.9.1),
# reproduced for our trainer modes, which must hand estimators the old log-probs and entropy as well.
ADVANTAGE_INPUT_FIELDS = ("uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "entropy")


def fetch_advantage_inputs(trainer, batch, metrics: dict):
    """What verl's V1 ``_compute_advantage`` does before the estimator, plus the token statistics: read
    :data:`ADVANTAGE_INPUT_FIELDS` from TransferQueue, set ``token_level_scores`` / ``token_level_rewards`` (KL in
    reward when ``algorithm.use_kl_in_reward``) and apply the rollout correction when configured.

    Returns:
        ``(data, nested_mask, out_fields)``: a padded ``DataProto`` (``uid`` in ``non_tensor_batch`` as an object
        array), the nested response mask to write results back with, and the fields besides ``advantages`` /
        ``returns`` that verl writes back (rewards with KL in reward; mask and IS weights after the correction).

    Raises:
        VerlVersionError: the installed verl is not :data:`PINNED_VERL_VERSION`.
    """
    check_verl_version()
    import numpy as np
    import transfer_queue as tq
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(ADVANTAGE_INPUT_FIELDS))
    nested_mask = data["response_mask"]
    data = DataProto(batch=data.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    algo = trainer.config.algorithm
    out_fields: list[str] = []
    if algo.use_kl_in_reward:
        data, kl_metrics = apply_kl_penalty(data, kl_ctrl=trainer.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty)
        metrics.update(kl_metrics)
        out_fields.append("token_level_rewards")
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    rc = algo.get("rollout_correction", None)
    if rc is not None and "rollout_log_probs" in data.batch:
        data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rc)
        metrics.update(is_metrics)
        out_fields.append("response_mask")
        if "rollout_is_weights" in data.batch:
            out_fields.append("rollout_is_weights")
    return data, nested_mask, out_fields


def put_advantages(batch, data, nested_mask, out_fields: list[str]):
    """Write ``advantages``, ``returns`` and ``out_fields`` of ``data`` back into TransferQueue (nested as verl keeps
    them); returns what ``kv_batch_put`` returns (the trainer's next batch handle)."""
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    fields = ["advantages", "returns", *out_fields]
    output = TensorDict({f: response_to_nested(data.batch[f], nested_mask) for f in fields}, batch_size=len(batch))
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)


# --------------------------------------------------------------------------------------------------------------
# per-step settings of the actor's loss (verl freezes the workers' ActorConfig)
STEP_SETTINGS = ("entropy_coeff",)
"""Keys of ``KVBatchMeta.extra_info`` that :func:`ppo_loss_with_step_settings` reads, each replacing the
``ActorConfig`` field of that name for one update."""


def ppo_loss_with_step_settings(config, model_output, data, dp_group=None):
    """verl's ``ppo_loss`` (``verl.workers.utils.losses``) with the :data:`STEP_SETTINGS` found in the micro-batch's
    non-tensor data (set per step by the trainer in the update's ``extra_info``) in place of the config's values;
    without them it is verl's loss unchanged."""
    import copy

    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    values = {k: tu.get_non_tensor_data(data=data, key=k, default=None) for k in STEP_SETTINGS}
    values = {k: v for k, v in values.items() if v is not None}
    if values:
        config = copy.copy(config)  # ActorConfig forbids assignment; this copy lives for one micro-batch
        for key, value in values.items():
            object.__setattr__(config, key, float(value))
    return ppo_loss(config, model_output, data, dp_group)


def install_step_settings_loss(trainer) -> None:
    """Make the actor workers' loss :func:`ppo_loss_with_step_settings` (verl's ``set_loss_fn`` of the actor worker
    group), with the ActorConfig built from the trainer's config the way the workers build theirs.

    Raises:
        VerlVersionError: the installed verl is not :data:`PINNED_VERL_VERSION`.
        ValueError: distillation is enabled (its loss is not ``ppo_loss``).
    """
    check_verl_version()
    import functools

    from verl.utils.config import omega_conf_to_dataclass

    if trainer.config.get("distillation", None) and trainer.config.distillation.get("enabled", False):
        raise ValueError("per-step loss settings (adaptive entropy coefficient) do not support distillation")
    actor_config = omega_conf_to_dataclass(trainer.config.actor_rollout_ref.actor)
    trainer.actor_rollout_wg.set_loss_fn(functools.partial(ppo_loss_with_step_settings, actor_config))
