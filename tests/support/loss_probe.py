"""Test-only verl extension: records what reaches the actor's policy loss, and what the driver started from.

Loaded in every process of a ``main_ppo`` run (driver and Ray workers) through
``VERL_USE_EXTERNAL_MODULES=tests.support.loss_probe`` (with the repository root on ``PYTHONPATH``); writes into
``$STARE_PROBE_DIR``:

- ``loss-<pid>-<n>.pt`` from the policy loss ``stare_probe`` (``actor.policy_loss.loss_mode=stare_probe``):
  verl's vanilla clipped loss, unchanged, plus a dump of the ``advantages``, ``response_mask`` and
  ``old_log_prob`` it was called with, i.e. what the actor's update actually consumes;
- ``driver-<n>.pt`` from the trainer mode ``stare_probe_sync``: ``stare_sync`` that, before each advantage
  computation, reads the step's inputs from verl's TransferQueue (rewards, uid, mask, old log-probs,
  entropy) and sets the method of that step from ``$STARE_PROBE_PLAN`` (a JSON list, one per step, of
  ``algorithm.stare`` dicts, or of another method's config with its name under ``"method"``), so one launch
  exercises several methods; the workers' loss takes per-step settings (``ppo_loss_with_step_settings``) and
  the loss-side dump records the ``entropy_coeff`` the loss ran with.

The advantage itself is never read here on the driver side: the test rebuilds the expected one from the
rewards and compares it with what the loss received.
"""

from __future__ import annotations

import itertools
import json
import os

import torch  # noqa: E402
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss  # noqa: E402

import stare_verl.plugin  # noqa: F401  (CPU backend and STARE first: verl/__init__ loads this module before plugins)
from stare_verl.methods.stare.config import StareConfig  # noqa: E402

DIR_ENV, PLAN_ENV = "STARE_PROBE_DIR", "STARE_PROBE_PLAN"
LOSS_NAME, TRAINER_MODE = "stare_probe", "stare_probe_sync"
_calls = itertools.count()


def _save(prefix: str, payload: dict) -> None:
    folder = os.environ[DIR_ENV]
    path = os.path.join(folder, f"{prefix}-{os.getpid()}-{next(_calls)}.pt")
    torch.save(payload, path + ".tmp")
    os.replace(path + ".tmp", path)


@register_policy_loss(LOSS_NAME)
def probe_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                      rollout_is_weights=None):  # fmt: skip
    """verl's vanilla policy loss; records its inputs."""
    _save(
        "loss",
        {
            "advantages": advantages.detach().cpu().clone(),
            "response_mask": response_mask.detach().cpu().clone(),
            "old_log_prob": old_log_prob.detach().cpu().clone(),
            "entropy_coeff": float(config.entropy_coeff),
        },
    )
    return compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


def _register_trainer() -> None:
    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import register_trainer

    from stare_verl.methods import METHODS
    from stare_verl.methods.stare import Stare
    from stare_verl.trainer import StareTrainerSync
    from stare_verl.verl_compat import install_step_settings_loss

    @register_trainer(TRAINER_MODE)
    class StareProbeTrainer(StareTrainerSync):
        def _setup(self):  # the plan switches methods per step: per-step loss settings from the start
            super()._setup()
            install_step_settings_loss(self)

        def _compute_advantage(self, batch, metrics):
            plan = json.loads(os.environ[PLAN_ENV])
            i = getattr(self, "_probe_step", 0)
            self._probe_step = i + 1
            stare = plan[min(i, len(plan) - 1)]
            spec = dict(stare)
            cls = METHODS[spec.pop("method", "stare")]
            cfg = StareConfig(norm_adv_by_std_in_grpo=True, **spec) if cls is Stare else cls.Config(**spec)
            self.entropy_method = cls(cfg)
            fields = ["uid", "response_mask", "rm_scores", "old_log_probs", "entropy"]
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
            padded = data.to_padded_tensor()
            uid = padded.pop("uid")  # what verl's _compute_advantage does
            uid = uid.tolist() if hasattr(uid, "tolist") else list(uid)
            _save(
                "driver",
                {
                    "step": i,
                    "stare": stare,
                    "uid": [str(u) for u in uid],
                    **{k: padded[k].detach().cpu().clone() for k in fields if k != "uid"},
                },
            )
            return super()._compute_advantage(batch, metrics)


_register_trainer()
