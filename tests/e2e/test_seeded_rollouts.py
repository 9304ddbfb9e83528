"""A seeded run's rollouts do not depend on how its requests are routed (verl's real V1 trainer on the CPU).

Two one-step runs of the tiny GRPO recipe with the same ``rollout.seed``: one rank, one ``hf`` replica and one
agent-loop worker, against two ranks, two replicas (verl's load balancer picks one per request by in-flight
counts, i.e. by timing) and two agent-loop workers. Step 1 samples from the initial weights in both, so with the
per-row seeds (``stare_verl.cpu.rollout_seeds``) every trajectory is the same; verl's rollout dump
(``trainer.rollout_data_dir``) of step 1 is compared, trajectory by trajectory (prompt and session): the decoded
response texts and the rewards."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.support.cpu import (
    RUN_TAG_ENV,
    build_tiny_model,
    build_toy_dataset,
    cpu_env,
    launch_main_ppo,
    main_ppo_cmd,
)

RUN_TIMEOUT_S = 2400

ROUTINGS = {
    "one_replica": ["actor_rollout_ref.rollout.agent.num_workers=1"],
    "two_replicas": [
        "trainer.n_gpus_per_node=2",
        "ray_kwargs.ray_init.num_gpus=2",
        "actor_rollout_ref.rollout.agent.num_workers=2",
    ],
}


def _step1_rollouts(root, model, train, val, name) -> dict[tuple[str, int], str]:
    """Run one step; return the step-1 responses by (prompt text, session index)."""
    dump = root / f"{name}_rollouts"
    tag = f"{name}-{uuid.uuid4().hex}"
    cmd = main_ppo_cmd(
        "tiny_grpo",
        [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"trainer.experiment_name=seeds_{name}",
            f"trainer.default_local_dir={root / 'ckpt' / name}",
            f"trainer.rollout_data_dir={dump}",
            "trainer.total_training_steps=1",
            "actor_rollout_ref.rollout.seed=1234",
            *ROUTINGS[name],
        ],
    )
    env = cpu_env({RUN_TAG_ENV: tag})
    run = launch_main_ppo(cmd, env, root, root / f"{name}.log", RUN_TIMEOUT_S, ran=(dump / "1.jsonl").exists)
    error = run.failure(name)
    if error:
        pytest.fail(error)
    out = {}
    for line in (dump / "1.jsonl").read_text().splitlines():
        rec = json.loads(line)
        _, session, _ = rec["uid"].rsplit("_", 2)  # {prompt uid}_{session}_{output index}
        key = (rec["input"], int(session))
        assert key not in out, key
        out[key] = (rec["output"], rec["score"])
    return out


def test_step1_rollouts_equal_with_one_or_two_replicas(tmp_path):
    model = build_tiny_model(tmp_path / "model")
    train, val = build_toy_dataset(tmp_path / "data")
    one = _step1_rollouts(tmp_path, model, train, val, "one_replica")
    two = _step1_rollouts(tmp_path, model, train, val, "two_replicas")
    assert len(one) == 16  # 4 prompts x rollout.n 4
    assert two == one
    # the sessions of a prompt drew different responses
    assert len({text for text, _ in one.values()}) > 4
