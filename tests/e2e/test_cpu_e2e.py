"""verl's real V1 trainer (``python -m verl.trainer.main_ppo``) on CPU with the ``hf`` rollout.

Runs of a tiny local Qwen2 on the toy "letter a" task (rewards vary within groups):

- STARE: the session's shared run (``stare_probe_run``, ``tests/support/stare_probe.py``, which the loss-probe tests
  read too): ``adv_estimator=stare`` in the STARE sync trainer mode, 2 ranks sharing one rollout replica
  (tensor_model_parallel_size=2, so rank 1 only drains the weight stream), validation before training and at step
  3; its first three steps are STARE's;
- ``no_sync``: verl's ``sync`` mode and GRPO with weight sync disabled (negative control), rollouts
  through our ``stare_tool_agent`` loop (envs.tool_use.agent_loop) and its code tool config;
- ``async_tool``: ``colocate_async`` with verl's ``tool_agent`` loop, 2 ranks with one replica each
  (two servers behind verl's load balancer), and a tiny model fine-tuned to call a (noop) tool, so
  trajectories hold a real tool round trip.

Each run writes verl's ``file`` logger JSONL, which the assertions parse; every process a run
started (found by an environment tag) must be gone afterwards.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.cpu import (
    REPO,
    RUN_TAG_ENV,
    build_tiny_model,
    build_tool_calling_model,
    build_toy_dataset,
    cpu_env,
    launch_main_ppo,
    main_ppo_cmd,
    read_metrics,
)

RUN_TIMEOUT_S = 2400  # a launch took 4-5 min at load 12-15, and 12.6 min beside two busy loops (0.7 idle)

RUNS = {
    "no_sync": [
        "trainer.total_training_steps=3",
        "+actor_rollout_ref.rollout.engine_kwargs.hf.sync_weights=false",
        # our agent loop and code tool (a random model answers without calling it)
        "actor_rollout_ref.rollout.agent.default_agent_loop=stare_tool_agent",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={REPO / 'recipes' / 'tool_use' / 'tool_config.yaml'}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
    ],
    "async_tool": [
        "trainer.total_training_steps=2",
        "trainer.n_gpus_per_node=2",
        "ray_kwargs.ray_init.num_gpus=2",
        "trainer.v1.trainer_mode=colocate_async",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={REPO / 'recipes' / 'cpu' / 'noop_tool.yaml'}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "data.max_response_length=96",
    ],
}
# runs whose policy is the tiny model fine-tuned to call the noop tool
TOOL_CALLING = {"async_tool"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu_e2e")
    model = build_tiny_model(root / "model")
    tool_model = build_tool_calling_model(root / "tool_model", model)
    train, val = build_toy_dataset(root / "data")
    return root, {"random": model, "tool": tool_model}, train, val


_results: dict[str, dict] = {}


def run_main_ppo(name: str, assets, stare_probe_run=None) -> dict:
    """Run main_ppo once per name (cached for the module); return metrics by step and leftovers. ``"stare"`` is the
    session's shared STARE run (``stare_probe_run``)."""
    if name == "stare":
        res = stare_probe_run
    else:
        if name not in _results:
            _results[name] = _run(name, assets)
        res = _results[name]
    if res["error"]:
        pytest.fail(res["error"])
    return res


def _run(name: str, assets) -> dict:
    root, models, train, val = assets
    model = models["tool" if name in TOOL_CALLING else "random"]
    metrics_path = root / f"{name}.jsonl"
    tag = f"{name}-{uuid.uuid4().hex}"
    cmd = main_ppo_cmd(
        "tiny_grpo",
        [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            "trainer.logger=[console,file]",
            f"trainer.experiment_name={name}",
            f"trainer.default_local_dir={root / 'ckpt' / name}",
            *RUNS[name],
        ],
    )
    env = cpu_env(
        {"VERL_FILE_LOGGER_PATH": str(metrics_path), RUN_TAG_ENV: tag}
    )
    run = launch_main_ppo(cmd, env, root, root / f"{name}.log", RUN_TIMEOUT_S, ran=metrics_path.exists)
    error = run.failure(name)  # remembered, so the other tests of this run fail fast instead of rerunning it
    by_step = {} if error else {rec["step"]: rec["data"] for rec in read_metrics(metrics_path)}
    return {"metrics": by_step, "leaked": run.leaked, "still_alive": run.still_alive, "wall": run.wall,
            "error": error}  # fmt: skip


def test_stare_sync_two_ranks_end_to_end(assets, stare_probe_run):
    res = run_main_ppo("stare", assets, stare_probe_run)
    m = res["metrics"]
    assert {1, 2, 3} <= set(m), f"steps logged: {sorted(m)}"
    for step in (1, 2, 3):
        s = m[step]
        assert s["training/global_step"] == step
        assert 0.0 < s["actor/entropy"] < 20.0
        # rewards vary within groups -> non-zero advantages
        assert s["critic/score/max"] > s["critic/score/min"]
        assert s["critic/advantages/max"] > 0.1 and s["critic/advantages/min"] < -0.1
        # STARE ran on every step with the pre-update policy's entropy and log-probs
        assert s["entropy_control/model_tokens"] > 0
        assert abs(s["entropy_control/batch_entropy"] - s["actor/entropy"]) < 1e-3
        assert s["stare/nonfinite_tokens"] == 0
        for key in (
            "timing_s/gen",
            "timing_s/old_log_prob",
            "timing_s/adv",
            "timing_s/update_actor",
            "timing_s/update_weights",
            "timing_s/step",
        ):
            assert s[key] > 0, key
    # the policy changed: entropy moved between steps
    assert len({round(m[s]["actor/entropy"], 6) for s in (1, 2, 3)}) > 1
    # validation before training (step 0) and at the last step
    assert any(k.startswith("val-core/toy_letter_a/") for k in m[0])
    assert any(k.startswith("val-core/toy_letter_a/") for k in m[3])


def test_rollout_log_probs_match_actor_over_steps(assets, stare_probe_run):
    m = run_main_ppo("stare", assets, stare_probe_run)["metrics"]
    diffs = [m[s]["training/rollout_probs_diff_mean"] for s in (1, 2, 3)]
    assert all(d < 1e-4 for d in diffs), diffs


def test_without_weight_sync_log_prob_diff_rises(assets, stare_probe_run):
    synced = run_main_ppo("stare", assets, stare_probe_run)["metrics"]
    m = run_main_ppo("no_sync", assets)["metrics"]
    # step 1 runs on the initial weights, which both sides share
    assert m[1]["training/rollout_probs_diff_mean"] < 1e-4
    for step in (2, 3):
        d = m[step]["training/rollout_probs_diff_mean"]
        assert d > 1e-4, (step, d)
        assert d > 100 * synced[step]["training/rollout_probs_diff_mean"]


def test_colocate_async_with_tool_agent_calling_a_tool(assets):
    m = run_main_ppo("async_tool", assets)["metrics"]
    assert {1, 2} <= set(m)
    for step in (1, 2):
        assert m[step]["response_length/mean"] > 0
        # user, assistant (tool call), tool, assistant: the tool round trip happened
        assert m[step]["num_turns/max"] >= 4
        assert 0.0 < m[step]["actor/entropy"] < 20.0
    # Step 1 is generated by the synced initial weights. Tool tokens carry no rollout log-prob: had
    # they been counted as model tokens (response_mask 1) the diff would be far above this bound.
    assert m[1]["training/rollout_probs_diff_mean"] < 1e-4


def test_our_agent_loop_on_hf_backend(assets):
    """envs' stare_tool_agent loop (with the code_interpreter tool config) drives the hf server."""
    m = run_main_ppo("no_sync", assets)["metrics"]
    assert {1, 2, 3} <= set(m)
    for step in (1, 2, 3):
        assert m[step]["response_length/mean"] > 0
        assert m[step]["num_turns/min"] >= 2


@pytest.mark.parametrize("name", ["stare", *RUNS])
def test_no_ray_process_leaks(assets, stare_probe_run, name):
    res = run_main_ppo(name, assets, stare_probe_run)
    assert res["leaked"] == [], f"{name}: processes left after main_ppo exited: {res['leaked']}"
    assert res["still_alive"] == []
