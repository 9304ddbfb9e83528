"""Whole tool-use episodes through verl's real agent-loop worker, our loop, the real code_interpreter tool
(sandboxed), verl's reward loop worker (naive manager) with envs.tool_use.task.compute_score, and the STARE
estimator. The model is a scripted LLM server (envs.simulators); the tokenizer is built locally.

One batch of scripted episodes runs once per module (concurrently, as in training); each test checks
its episode's row. Cases: a correct tool-assisted answer, a wrong one, tool output that prints the
answer, a think-wrapped call, a missing-brace call, a tool timeout, a max-turn stop, a call cut by the
length limit, and a word split unusually into ids.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf
from transformers import AutoTokenizer

import envs.tool_use.agent_loop  # noqa: F401  (registers stare_tool_agent)
from envs.datasets import make_row, write_parquet
from envs.simulators import (
    ScriptedEpisode,
    ScriptedLLMServer,
    ScriptedTurn,
    build_tiny_model_dir,
    tool_call_text,
)
from envs.tool_use.task import to_tool_use_row
from tests.support.agent_loop import REPO, RewardHandle, compose_multi_turn_config

pytestmark = pytest.mark.integration

PROMPT_LEN, RESPONSE_LEN, MAX_TURNS, MAX_MODEL_LEN = 1024, 320, 3, 1000
TOOL_TIMEOUT_S = 1.5


def _call(code: str) -> str:
    return tool_call_text(code)


# question, ground truth, scripted turns (built lazily: the split-word case needs the tokenizer)
CASES: dict[str, tuple[str, str]] = {
    "correct": ("What is 12 * 7?", "84"),
    "wrong": ("What is 12 * 8?", "96"),
    "credit": ("What is 6 * 7?", "42"),
    "think": ("What is 1 + 1?", "2"),
    "brace": ("What is 3 + 4?", "7"),
    "timeout": ("What is 5 + 5?", "10"),
    "maxturn": ("What is 9 * 9?", "81"),
    "length": ("What is 2 ** 10?", "1024"),
    "split": ("What is 10 + 11?", "21"),
    "window": (
        ("What is 3 * 3? " + "Think about it carefully. " * 30).strip(),
        "9",
    ),  # a prompt near the window
}
GROUP = {
    "correct": 0,
    "wrong": 0,
    "credit": 0,
    "brace": 0,
    "think": 1,
    "timeout": 1,
    "maxturn": 1,
    "length": 1,
    "split": 1,
    "window": 1,
}


def _script(tok) -> dict[str, list]:
    he, llo = tok.encode("he", add_special_tokens=False), tok.encode("llo", add_special_tokens=False)
    assert tok.encode("hello", add_special_tokens=False) != he + llo  # an unusual split of "hello"
    long_code = "print(" + "1+" * 200 + "1)"
    return {
        "correct": ["Let me compute. " + _call("print(12 * 7)"), "The answer is \\boxed{84}."],
        "wrong": ["Let me compute. " + _call("print(12 + 8)"), "The answer is \\boxed{20}."],
        "credit": ["Let me check. " + _call("print(r'\\boxed{42}')"), "I am not sure."],
        "think": [
            '<think>maybe <tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}}</tool_call>'
            '</think><tool_call>{"name": "code_interpreter", "arguments": {"code": "print(2)"}}</tool_call>',
            "\\boxed{2}",
        ],
        "brace": [
            '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(3 + 4)"}</tool_call>',
            _call("print(3 + 4)"),
            "So \\boxed{7}.",
        ],
        "timeout": [_call("while True: pass"), "Too slow. 5 + 5 = \\boxed{10}."],
        "maxturn": [_call("print(9)"), _call("print(9 * 9)"), _call("print(81)")],
        "length": [_call("print(2 ** 10)"), ScriptedTurn(text="Check: " + _call(long_code), eos=False)],
        "window": [_call("print(3 * 3)"), ScriptedTurn(text="Check: " + _call(long_code), eos=False)],
        "split": [
            ScriptedTurn(ids=he + llo + tok.encode(" " + _call("print(10 + 11)"), add_special_tokens=False)),
            "\\boxed{21}",
        ],
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Run every case once as one batch; return a namespace with the output and the recorders."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    tmp = tmp_path_factory.mktemp("agent_loop")
    model_path = build_tiny_model_dir(tmp / "model")
    tool_cfg = yaml.safe_load((REPO / "recipes" / "tool_use" / "tool_config.yaml").read_text())
    tool_cfg["tools"][0]["config"]["sandbox"]["limits"]["timeout_s"] = TOOL_TIMEOUT_S
    tool_cfg["tools"][0]["config"]["sandbox"]["limits"]["cpu_s"] = 5
    tool_cfg_path = tmp / "tool_config.yaml"
    tool_cfg_path.write_text(yaml.safe_dump(tool_cfg))
    cfg = compose_multi_turn_config(
        model_path,
        str(tool_cfg_path),
        prompt_length=PROMPT_LEN,
        response_length=RESPONSE_LEN,
        max_model_len=MAX_MODEL_LEN,
        max_assistant_turns=MAX_TURNS,
        overrides=[
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=500",
        ],
    )

    names = list(CASES)
    rows = [
        to_tool_use_row(make_row(q, a, f"test/{name}", i, "test", family="tool_use"))
        for i, (name, (q, a)) in enumerate(CASES.items())
    ]
    parquet = write_parquet(rows, tmp / "episodes.parquet")
    tok = AutoTokenizer.from_pretrained(model_path)
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tok, config=cfg.data, processor=None)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([str(GROUP[n]) for n in names], dtype=object)
    scripts = _script(tok)
    episodes = [ScriptedEpisode(CASES[n][0], scripts[n]) for n in names]
    server = ScriptedLLMServer(tok, episodes, max_model_len=MAX_MODEL_LEN)
    executed: list[str] = []

    async def go():
        # verl's workers bind the running event loop at construction: build them inside it
        reward_worker = RewardLoopWorker(cfg)
        worker = AgentLoopWorker(cfg, server, reward_loop_worker_handles=[RewardHandle(reward_worker)])
        tool = worker.tools[0]
        real_execute = tool.execute

        async def spy_execute(instance_id, parameters, **kwargs):
            executed.append(parameters.get("code"))
            return await real_execute(instance_id, parameters, **kwargs)

        tool.execute = spy_execute
        try:
            return await asyncio.wait_for(worker.generate_sequences(batch), timeout=120)
        finally:
            await tool.aclose()

    out = asyncio.run(go())
    return type(
        "Run",
        (),
        {"out": out, "tok": tok, "server": server, "names": names, "executed": executed, "cfg": cfg},
    )


def _row(run, name: str) -> dict:
    """One episode's results: tensors without padding, extra fields, reward, recorded server calls."""
    i = run.names.index(name)
    out = run.out
    prompt_len = out.batch["prompts"].shape[1]
    attn = out.batch["attention_mask"][i]
    n_prompt, n_resp = int(attn[:prompt_len].sum()), int(attn[prompt_len:].sum())
    ids = out.batch["input_ids"][i]
    nt = {k: v[i] for k, v in out.non_tensor_batch.items()}
    return {
        "prompt": ids[prompt_len - n_prompt : prompt_len].tolist(),
        "response": ids[prompt_len : prompt_len + n_resp].tolist(),
        "mask": out.batch["response_mask"][i][:n_resp].tolist(),
        "reward": float(out.batch["rm_scores"][i].sum()),
        "nt": nt,
        "calls": run.server.calls_of(i),
    }


def _observations(run, r) -> list[str]:
    """The decoded mask-0 runs of a response (tool observations and template tokens)."""
    runs, cur = [], []
    for t, m in zip(r["response"], r["mask"], strict=True):
        if m == 0:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [run.tok.decode(x, skip_special_tokens=False) for x in runs]


# ------------------------------------------------------------------------------------- the episodes


def test_correct_tool_assisted_answer(run):
    r = _row(run, "correct")
    assert r["reward"] == 1.0 and bool(r["nt"]["acc"]) is True
    nt = r["nt"]
    assert (nt["termination"], nt["num_tool_calls"], nt["num_tool_executed"], nt["num_tool_errors"]) == (
        "answer",
        1,
        1,
        0,
    )
    assert nt["__num_turns__"] == 4  # system/user prompt + assistant + tool + assistant
    assert nt["model_response_text"] == "Let me compute.\nThe answer is \\boxed{84}."
    obs = _observations(run, r)
    assert len(obs) == 1 and "<tool_response>\n84\n</tool_response>" in obs[0]
    assert nt["tool_time_s"] > 0 and nt["reward_text_from_loop"]


def test_wrong_tool_assisted_answer(run):
    r = _row(run, "wrong")
    assert r["reward"] == 0.0 and r["nt"]["pred"] == "20"
    assert "<tool_response>\n20\n</tool_response>" in _observations(run, r)[0]


def test_tool_printed_answer_earns_no_credit(run):
    """print(r'\\boxed{42}') -> the tool prints \\boxed{42}; the model says "I am not sure." -> reward 0."""
    from envs.reward import compute_score as score_math

    r = _row(run, "credit")
    assert "\\boxed{42}" in _observations(run, r)[0]  # the tool really printed it
    assert r["reward"] == 0.0 and bool(r["nt"]["has_answer"]) is False
    assert r["nt"]["model_response_text"] == "Let me check.\nI am not sure."
    # what verl's naive manager decodes (attention mask, tool output included) would have earned 1
    solution_str = run.tok.decode(r["response"], skip_special_tokens=True)
    assert score_math("test/credit", solution_str, "42")["score"] == 1.0


def test_think_wrapped_call_runs_exactly_print2(run):
    r = _row(run, "think")
    assert [c for c in run.executed if c in ("print(1)", "print(2)")] == ["print(2)"]
    assert r["nt"]["num_tool_calls"] == 1 and r["nt"]["num_tool_executed"] == 1
    assert "<tool_response>\n2\n</tool_response>" in _observations(run, r)[0]
    assert r["reward"] == 1.0


def test_missing_brace_call_error_observation_turn_counted_nothing_run(run):
    r = _row(run, "brace")
    nt = r["nt"]
    obs = _observations(run, r)
    assert obs[0].split("<tool_response>\n")[1].startswith("Error: the tool call is not valid JSON")
    assert nt["num_malformed_calls"] == 1 and nt["num_tool_errors"] == 1
    assert nt["num_tool_calls"] == 2 and nt["num_tool_executed"] == 1  # only the corrected call ran
    assert run.executed.count("print(3 + 4)") == 1
    assert nt["num_assistant_turns"] == 3 and nt["__num_turns__"] == 6  # the malformed turn is counted
    assert nt["tool_call_log"][0]["error"] == "malformed"
    assert r["reward"] == 1.0


def test_tool_timeout_is_an_observation_and_the_episode_goes_on(run):
    r = _row(run, "timeout")
    nt = r["nt"]
    assert "TimeoutError: the program was stopped after" in _observations(run, r)[0]
    assert nt["num_tool_timeouts"] == 1 and nt["num_tool_errors"] == 1
    assert nt["tool_time_s"] >= TOOL_TIMEOUT_S * 0.9
    assert nt["termination"] == "answer" and r["reward"] == 1.0


def test_max_assistant_turns_stop(run):
    r = _row(run, "maxturn")
    nt = r["nt"]
    assert nt["termination"] == "max_assistant_turns" and nt["num_assistant_turns"] == MAX_TURNS
    assert nt["num_tool_executed"] == MAX_TURNS - 1  # the last turn's call is never run
    assert "print(81)" not in run.executed
    assert len(r["calls"]) == MAX_TURNS and r["reward"] == 0.0
    assert nt["__num_turns__"] == 2 * MAX_TURNS  # (MAX_TURNS - 1) tool turns + MAX_TURNS + 1


def test_call_cut_by_length_limit_is_never_executed(run):
    r = _row(run, "length")
    nt = r["nt"]
    assert nt["termination"] == "length" and bool(nt["hit_eos"]) is False
    assert len(r["response"]) == RESPONSE_LEN  # the turn filled the whole budget
    first, second = r["calls"]
    budget = RESPONSE_LEN - (len(second.prompt_ids) - len(first.prompt_ids))
    assert second.sampling_params["max_tokens"] == budget
    assert len(second.output_ids) == second.sampling_params["max_tokens"]
    assert not any(c and c.startswith("print(1+1") for c in run.executed)
    assert nt["num_tool_calls"] == 1 and bool(nt["truncated"]) is True and r["reward"] == 0.0


def test_call_cut_by_the_context_window_is_never_executed(run):
    """The server stops at max_model_len before the loop's max_tokens: still a cut, still not run."""
    r = _row(run, "window")
    first, second = r["calls"]
    assert (
        len(second.output_ids)
        == MAX_MODEL_LEN - len(second.prompt_ids)
        < second.sampling_params["max_tokens"]
    )
    assert r["nt"]["termination"] == "length" and bool(r["nt"]["hit_eos"]) is False
    assert r["nt"]["num_tool_executed"] == 1 and run.executed.count("print(3 * 3)") == 1
    assert not any(c and c.startswith("print(1+1") for c in run.executed) and r["reward"] == 0.0


def test_split_word_ids_are_kept_token_exact(run):
    r = _row(run, "split")
    tok = run.tok
    first, second = r["calls"][0], r["calls"][1]
    split_ids = tok.encode("he", add_special_tokens=False) + tok.encode("llo", add_special_tokens=False)
    assert first.output_ids[: len(split_ids)] == split_ids
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(first.output_ids)]
        == first.prompt_ids + first.output_ids
    )
    assert r["response"][: len(split_ids)] == split_ids and r["reward"] == 1.0


@pytest.mark.parametrize("name", list(CASES))
def test_token_in_token_out_and_mask(run, name):
    """prompt(k+1) = prompt(k) + ids(k) + observation ids; the final sequence is the last prompt + last ids;
    response_mask is 1 exactly on the ids the server generated."""
    r = _row(run, name)
    calls = r["calls"]
    for prev, nxt in zip(calls, calls[1:], strict=False):
        assert (
            nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.output_ids)] == prev.prompt_ids + prev.output_ids
        )
    assert r["prompt"] == calls[0].prompt_ids
    full = r["prompt"] + r["response"]
    assert full == calls[-1].prompt_ids + calls[-1].output_ids
    expected = [0] * len(r["response"])
    base = len(r["prompt"])
    for c in calls:
        start = len(c.prompt_ids) - base
        expected[start : start + len(c.output_ids)] = [1] * len(c.output_ids)
    assert r["mask"] == expected
    assert r["nt"]["response_length"] == sum(expected)


def test_batch_through_stare_estimator_tool_tokens_get_nothing(run):
    from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

    from stare_verl.methods.stare import compute_stare_advantage

    out = run.out
    mask = out.batch["response_mask"]
    rewards = out.batch["rm_scores"]
    index = np.array([str(GROUP[n]) for n in run.names], dtype=object)  # the rows' uids
    g = torch.Generator().manual_seed(0)
    old_lp = -torch.rand(mask.shape, generator=g) * 3
    ent = torch.rand(mask.shape, generator=g)
    tool_tok = (mask == 0) & (out.batch["attention_mask"][:, out.batch["prompts"].shape[1] :] == 1)
    assert int(tool_tok.sum()) > 0
    old_lp[mask == 0] = -50.0  # the most surprising tokens of the batch, if anything looked at them
    ent[mask == 0] = 9.0
    cfg = OmegaConf.create(
        {
            "norm_adv_by_std_in_grpo": True,
            "stare": {
                "variant": "C2",
                "top_p_ratio": 0.2,
                "reweight_w": 1.5,
                "reweight_m": 0.5,
                "target_entropy": 5.0,
            },
        }
    )
    metrics: dict = {}
    adv, _ = compute_stare_advantage(
        rewards, mask, index, cfg, old_log_probs=old_lp, entropys=ent, metrics=metrics
    )
    grpo, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=True)
    assert torch.all(adv[mask == 0] == 0) and torch.all(adv[tool_tok] == 0)
    changed = adv != grpo
    assert int(changed.sum()) > 0 and torch.all(mask[changed] == 1)  # only model tokens were reweighted
    assert metrics["stare/gate_on"] == 1.0 and metrics["entropy_control/model_tokens"] == float(mask.sum())
    assert metrics["entropy_control/batch_entropy"] == pytest.approx(float(ent[mask == 1].mean()), rel=1e-5)
    # L+ is the most surprising model tokens of the positive rows: tool tokens never displace them
    row_adv = grpo.sum(-1) / mask.sum(-1)
    pos = (row_adv > 0).unsqueeze(-1) & (mask == 1)
    sel = changed & pos
    assert float((-old_lp[sel]).min()) >= float((-old_lp[pos & ~sel]).max())
    assert torch.allclose(adv[sel], grpo[sel] * 1.5)


def test_plugin_registers_the_loop_in_a_fresh_process():
    code = (
        "import verl\nfrom verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r\n"
        "print(r['stare_tool_agent']['_target_'])"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert res.stdout.strip().splitlines()[-1] == "envs.tool_use.agent_loop.StareToolAgentLoop", res.stderr[-2000:]


class _HangingTool:
    """A verl BaseTool whose execute never returns in time, or raises; records its lifecycle."""

    def __init__(self, name: str, mode: str, log: list):
        from verl.tools.schemas import OpenAIFunctionToolSchema

        self.name, self.mode, self.log = name, mode, log
        self.tool_schema = OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": "test tool",
                    "parameters": {
                        "type": "object",
                        "properties": {"code": {"type": "string"}},
                        "required": ["code"],
                    },
                },
            }
        )

    async def create(self, instance_id=None, **kwargs):
        self.log.append(("create", self.name))
        return f"{self.name}-1", None

    async def execute(self, instance_id, parameters, **kwargs):
        self.log.append(("execute", self.name))
        if self.mode == "hang":
            await asyncio.sleep(60)
        raise RuntimeError("boom")

    async def release(self, instance_id, **kwargs):
        self.log.append(("release", instance_id))

    async def release_trajectory(self, request_id):
        self.log.append(("release_trajectory", self.name))


def test_loop_deadline_tool_exception_and_trajectory_release(run):
    """A tool that hangs past tool_timeout_s and one that raises: both become observations, are counted,
    are released; the episode goes on; per-trajectory state is released at the end."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from envs.tool_use.agent_loop import StareToolAgentLoop

    log: list = []
    tok = run.tok
    episode = ScriptedEpisode(
        "hang test",
        [
            tool_call_text("x", name="slow") + tool_call_text("y", name="bad"),
            "done \\boxed{1}",
        ],
    )
    server = ScriptedLLMServer(tok, [episode])
    cfg = run.cfg.copy()
    cfg.actor_rollout_ref.rollout.multi_turn.max_parallel_calls = 2

    async def go():
        loop = StareToolAgentLoop(
            trainer_config=DictConfigWrap(cfg),
            server_manager=server,
            tokenizer=tok,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap([_HangingTool("slow", "hang", log), _HangingTool("bad", "raise", log)]),
            tool_timeout_s=0.3,
        )
        msgs = [{"role": "user", "content": "hang test"}]
        return await asyncio.wait_for(loop.run({"temperature": 1.0}, raw_prompt=msgs, tools_kwargs={}), 30)

    out = asyncio.run(go())
    ef = out.extra_fields
    assert (
        ef["num_tool_calls"],
        ef["num_tool_timeouts"],
        ef["num_tool_exceptions"],
        ef["num_tool_errors"],
    ) == (2, 1, 1, 2)
    assert ef["num_tool_executed"] == 0 and ef["termination"] == "answer"
    assert 0.3 <= ef["tool_time_s"] < 5
    text = tok.decode(out.response_ids, skip_special_tokens=False)
    assert "Error: the tool call did not finish within 0.3 s and was stopped." in text
    assert "Error: tool 'bad' failed: RuntimeError: boom" in text
    assert ("release", "slow-1") in log and ("release", "bad-1") in log
    assert log[-2:] == [("release_trajectory", "slow"), ("release_trajectory", "bad")]
    assert ef["model_response_text"] == "done \\boxed{1}"
