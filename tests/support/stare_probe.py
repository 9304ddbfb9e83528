"""The one ``main_ppo`` launch that several end-to-end files read (the session fixture ``stare_probe_run`` of
``tests/e2e/conftest.py``): STARE in the sync trainer mode with the loss probe.

Each launch of verl's trainer on the 2-core machine pays about a minute of start-up (Ray, six actors importing torch
and verl) for a few seconds of training, so the checks that can read the same run share it:

- ``test_loss_receives_weights.py``: what the actor's policy loss receives, step by step (``tests/support/loss_probe.py``);
- ``test_cpu_e2e.py``: STARE in the sync trainer mode on 2 ranks sharing one rollout replica (tensor parallel 2, so
  rank 1 only drains the weight stream), validation before training and at step 3, rollout log-probs equal to the
  actor's while the weights are synced, no process left behind.

The run: the tiny local Qwen2 on the toy "letter a" task (rewards vary within groups), batch of 16 split over the two
ranks, each seeing its half in micro-batches of 4, gate forced on (target entropy 100 nats), P = 0.25, one method setting per step
(:data:`PLAN`): three STARE steps (O1 W 3; C2 W 3 M 0.5; W = M = 1, the GRPO-ds twin), then forking tokens, the
entropy advantage and the adaptive entropy coefficient. The trainer mode is ``stare_probe_sync``, the STARE sync
mode (``stare_verl.trainer.StareTrainerSync``) with a dump of each step's inputs and the per-step method switch.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import torch

from tests.support.cpu import (
    REPO,
    RUN_TAG_ENV,
    build_tiny_model,
    build_toy_dataset,
    cpu_env,
    launch_main_ppo,
    main_ppo_cmd,
    read_metrics,
)

P = 0.25
TARGET = 100.0
PLAN = [
    {"variant": "O1", "reweight_w": 3.0},
    {"variant": "C2", "reweight_w": 3.0, "reweight_m": 0.5},
    {"variant": "O1", "reweight_w": 1.0, "reweight_m": 1.0},
]
for _p in PLAN:
    _p.update(top_p_ratio=P, target_entropy=TARGET)
N_STARE = 3
# the other methods that change what the actor receives, one step each after STARE's
RHO, ALPHA, KAPPA, COEF0, DELTA = 0.25, 0.4, 2.0, 0.05, 0.01
PLAN += [
    {"method": "forking", "rho": RHO},
    {"method": "entropy_adv", "alpha": ALPHA, "kappa": KAPPA},
    {
        "method": "adaptive_entropy",
        "target_entropy": TARGET,
        "delta": DELTA,
        "coef_init": COEF0,
        "coef_max": 0.1,
    },
]
RUN_TIMEOUT_S = 2400  # start-up alone took 7 min at load 36; the whole launch 12.3 min beside two busy loops


def launch_stare_probe(root: Path) -> dict:
    """Launch main_ppo once with the loss probe, in the folder ``root``; return ``driver`` (the per-step input dumps, by step),
    ``losses`` (every policy-loss call's inputs), ``metrics`` (verl's file-logger records by step: 0 is the
    validation before training), ``leaked`` / ``still_alive`` (processes left after exit), ``wall`` and ``error``
    (None, or the failure with the log's tail: the tests reading the run fail with it instead of relaunching)."""
    model = build_tiny_model(root / "model")
    train, val = build_toy_dataset(root / "data")
    probe = root / "probe"
    probe.mkdir()
    metrics_path = root / "metrics.jsonl"
    tag = f"stare-probe-{uuid.uuid4().hex}"
    cmd = main_ppo_cmd(
        "tiny_grpo",
        [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"trainer.default_local_dir={root / 'ckpt'}",
            "trainer.logger=[console,file]",
            "trainer.experiment_name=stare_probe",
            "algorithm.adv_estimator=stare",
            "trainer.v1.trainer_mode=stare_probe_sync",
            "actor_rollout_ref.actor.policy_loss.loss_mode=stare_probe",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.calculate_entropy=true",  # the adaptive step's bonus needs the entropy
            "trainer.n_gpus_per_node=2",
            "ray_kwargs.ray_init.num_gpus=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            f"trainer.total_training_steps={len(PLAN)}",
            "trainer.val_before_train=true",
            "trainer.test_freq=3",
            f"+algorithm.stare.target_entropy={TARGET}",
        ],
    )
    env = cpu_env(
        {
            RUN_TAG_ENV: tag,
            "VERL_FILE_LOGGER_PATH": str(metrics_path),
            "VERL_USE_EXTERNAL_MODULES": "tests.support.loss_probe",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "STARE_PROBE_DIR": str(probe),
            "STARE_PROBE_PLAN": json.dumps(PLAN),
        }
    )
    # relaunched only after Ray's own start-up timeout, while the probe has dumped nothing (nothing of ours ran)
    launch = launch_main_ppo(
        cmd, env, root, root / "main_ppo.log", RUN_TIMEOUT_S, ran=lambda: any(probe.iterdir())
    )
    error = launch.failure("STARE with the loss probe")
    driver = sorted(
        (torch.load(p, weights_only=False) for p in probe.glob("driver-*.pt")), key=lambda d: d["step"]
    )
    losses = [torch.load(p, weights_only=False) for p in sorted(probe.glob("loss-*.pt"))]
    metrics = {} if error else {rec["step"]: rec["data"] for rec in read_metrics(metrics_path)}
    print(f"main_ppo with the loss probe: {launch.wall:.0f}s ({launch.attempts} launch(es)), {len(driver)} steps, "
          f"{len(losses)} loss calls")  # fmt: skip
    return {"driver": driver, "losses": losses, "metrics": metrics, "leaked": launch.leaked,
            "still_alive": launch.still_alive, "wall": launch.wall, "error": error}  # fmt: skip
