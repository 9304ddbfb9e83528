"""verl's vLLM rollout on the CPU (``make test-vllm``, in ``.venv-vllm``; skipped where vLLM's CPU build is not
installed, as in ``make test``'s virtualenv).

- STARE in the ``stare_sync`` trainer mode for 3 steps through vLLM, rollouts driven by our ``stare_tool_agent``
  loop with the sandboxed code tool: every step logs STARE's metrics, the rollout's log-probs match the actor's
  after each weight sync (the sync reaches the engine: vLLM starts from dummy weights, ``load_format: dummy``), and
  nothing is left behind (processes, ``/dev/shm`` segments);
- the negative control: the same run with every sync dropped inside vLLM (``STARE_VLLM_SYNC_WEIGHTS=0``) has
  rollout log-probs far from the actor's, above the bound the synced run must stay under;
- greedy generation of vLLM equals transformers' on the same weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from stare_verl.cpu.vllm_engine import SYNC_WEIGHTS_ENV, engine_env, rollout_overrides
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
from tests.support.leftovers import _shm
from tests.support.vllm import VLLM_TESTS as pytestmark  # noqa: F401

RUN_TIMEOUT_S = 1500
# Bounds of the rollout-vs-actor agreement after a sync (verl's debug metrics over the response tokens):
# mean |p_rollout - p_actor|, rollout_corr/kl, the Pearson correlation of the two probabilities. Measured with the
# sync: 7e-10, |kl| 2e-8, corr 1.0; without it (dummy weights in vLLM): 6.4e-4 to 6.6e-4, kl 0.009 to 0.028,
# corr -0.08 to 0.07. Each bound is between the two with a margin on both sides.
SYNCED_MAX_DIFF = 1e-5
SYNCED_MAX_KL = 1e-4
SYNCED_MIN_CORR = 0.999
STARE_KEYS = ("entropy_control/model_tokens", "entropy_control/batch_entropy", "stare/gate_on", "stare/nonfinite_tokens")


def _launch(root, steps: int, extra_env: dict[str, str] | None = None) -> dict:
    """``main_ppo`` with the tiny GRPO recipe in ``stare_sync`` mode, our tool agent loop and vLLM on the CPU, for
    ``steps`` steps, on a random hidden-128 model; vLLM starts from dummy weights (verl's ``load_format: dummy``)."""
    model = build_tiny_model(root / "model", hidden=128)  # head dim 32: vLLM's CPU attention needs >= 32
    train, val = build_toy_dataset(root / "data")
    metrics_path = root / "metrics.jsonl"
    cmd = main_ppo_cmd("tiny_grpo", [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
        f"trainer.default_local_dir={root / 'ckpt'}", "trainer.logger=[console,file]",
        "trainer.experiment_name=vllm_rollout", f"trainer.total_training_steps={steps}",
        "algorithm.adv_estimator=stare", "trainer.v1.trainer_mode=stare_sync",
        "+algorithm.stare.target_entropy=10.0",  # above the random model's entropy: the gate is on
        "actor_rollout_ref.rollout.agent.default_agent_loop=stare_tool_agent",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={REPO / 'recipes' / 'tool_use' / 'tool_config.yaml'}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        *rollout_overrides(),
    ])  # fmt: skip
    env = cpu_env({RUN_TAG_ENV: f"vllm-{uuid.uuid4().hex}", "VERL_FILE_LOGGER_PATH": str(metrics_path),
                   **engine_env(root / "cache", environ={}), **(extra_env or {})})  # fmt: skip
    shm_before = set(_shm())
    run = launch_main_ppo(cmd, env, root, root / "main_ppo.log", RUN_TIMEOUT_S, attempts=1)
    by_step = {} if run.rc != 0 else {r["step"]: r["data"] for r in read_metrics(metrics_path)}
    print(f"vLLM main_ppo ({steps} steps{', ' + str(extra_env) if extra_env else ''}): rc {run.rc}, {run.wall:.0f} s, "
          f"shm removed after the run: {run.shm_removed}; rollout_probs_diff_mean "
          f"{[by_step[s].get('training/rollout_probs_diff_mean') for s in sorted(by_step)]}")
    return {"run": run, "metrics": by_step, "shm_left": set(_shm()) - shm_before, "model": model}


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("vllm_rollout"), steps=3)


@pytest.fixture(scope="module")
def vllm_run_without_sync(tmp_path_factory):
    """The same run for 2 steps, with every weight sync received and dropped by vLLM (``STARE_VLLM_SYNC_WEIGHTS=0``,
    ``stare_verl.cpu.vllm_engine.drop_weight_sync``): the engine keeps its dummy weights."""
    return _launch(tmp_path_factory.mktemp("vllm_rollout_no_sync"), steps=2, extra_env={SYNC_WEIGHTS_ENV: "0"})


def test_stare_sync_with_the_tool_agent_loop_through_vllm(vllm_run):
    run, m = vllm_run["run"], vllm_run["metrics"]
    assert run.rc == 0, run.failure("vLLM rollout")
    assert {1, 2, 3} <= set(m), sorted(m)
    for step in (1, 2, 3):
        s = m[step]
        for key in STARE_KEYS:
            assert key in s, (step, key)
        assert s["entropy_control/model_tokens"] > 0 and s["stare/nonfinite_tokens"] == 0
        assert abs(s["entropy_control/batch_entropy"] - s["actor/entropy"]) < 1e-3  # the pre-update policy's entropy
        assert s["timing_s/update_weights"] > 0


def test_weights_reach_the_engine_after_each_sync(vllm_run):
    """vLLM loads dummy weights; only the sync gives it the actor's: the log-probs it reports then equal the
    actor's recomputation at round-off, step after step, while the policy changes."""
    m = vllm_run["metrics"]
    assert {1, 2, 3} <= set(m)
    diffs = [m[s]["training/rollout_probs_diff_mean"] for s in (1, 2, 3)]
    assert all(d < SYNCED_MAX_DIFF for d in diffs), diffs
    assert all(abs(m[s]["rollout_corr/kl"]) < SYNCED_MAX_KL for s in (1, 2, 3))
    assert all(m[s]["training/rollout_actor_probs_pearson_corr"] > SYNCED_MIN_CORR for s in (1, 2, 3))
    assert len({round(m[s]["actor/entropy"], 6) for s in (1, 2, 3)}) > 1  # the policy changed


def test_without_the_sync_rollout_log_probs_are_far_from_the_actors(vllm_run, vllm_run_without_sync):
    """The negative control of the test above: the same run with every sync dropped inside vLLM (the engine keeps
    its dummy weights) gives rollout log-probs far from the actor's, far above the bound the synced run stays
    under, so that test fails when the sync does not reach the engine."""
    run, m = vllm_run_without_sync["run"], vllm_run_without_sync["metrics"]
    assert run.rc == 0, run.failure("vLLM rollout without sync")
    assert "dropped a weight bucket" in run.log_path.read_text(errors="replace")  # the switch is what ran
    synced = vllm_run["metrics"]
    for step in (1, 2):
        d, kl = m[step]["training/rollout_probs_diff_mean"], m[step]["rollout_corr/kl"]
        corr = m[step]["training/rollout_actor_probs_pearson_corr"]
        # every bound of the synced test is broken, with a margin
        assert d > 10 * SYNCED_MAX_DIFF and abs(kl) > SYNCED_MAX_KL and corr < 0.5, (step, d, kl, corr)
        assert d > 1000 * synced[step]["training/rollout_probs_diff_mean"], (step, d, synced[step])
        assert m[step]["timing_s/update_weights"] > 0  # the sender still ran its side


@pytest.mark.parametrize("which", ["vllm_run", "vllm_run_without_sync"])
def test_nothing_is_left_behind(which, request):
    res = request.getfixturevalue(which)
    run = res["run"]
    assert run.leaked == [] and run.still_alive == []
    assert res["shm_left"] == set(), res["shm_left"]


GREEDY = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm import LLM, SamplingParams
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
prompts = [[tok.convert_tokens_to_ids(t) for t in tok.tokenize(p)] for p in
           ["a b c", "the letter a", "aaa", "b a b a", "hello", "x y z", "a", "c c c c"]]
hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
ref = []
with torch.no_grad():
    for ids in prompts:
        out = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                          pad_token_id=tok.pad_token_id)
        ref.append(out[0, len(ids):].tolist())
if __name__ == "__main__":
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], sp)]
    print("RESULT " + json.dumps({"hf": ref, "vllm": [list(g) for g in got]}))
"""


def test_greedy_generation_equals_transformers(vllm_run, tmp_path):
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    env = {**os.environ, **engine_env(tmp_path / "cache", environ={}), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(script), vllm_run["model"]], capture_output=True, text=True,
                         timeout=600, env=env)  # fmt: skip
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, out.stderr[-3000:]
    res = json.loads(line[len("RESULT "):])
    assert res["vllm"] == res["hf"]
