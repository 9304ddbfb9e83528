"""Issue 12 (one tool-call path): the same scripted tool-use episode through the API evaluation and the held-out
evaluation gives the same statistics, because both answer calls with ``envs.tool_use.episode``'s runner.
(The training loop uses the same runner; ``tests/test_agent_loop.py`` runs it through verl.)"""

import asyncio
import contextlib
import io

import pytest

from envs.tiny_hf import build_tokenizer
from envs.tools.schema import tool_call_text
from stare_verl.jobs.demo.demos import build_demos, sample_problems
from stare_verl.jobs.demo.evaluate import run_episodes
from stare_verl.jobs.demo.sft import render_demo
from stare_verl.jobs.evaluation.client import ChatResult
from stare_verl.jobs.evaluation.runner import EvalProblem, EvalSettings, _Runner

MARKUP_CODE = 'print("</tool_call>")\nx = "\\\\boxed{9} <think>"'


def _turns(answer: str) -> list[str]:
    return [
        # a call whose code prints markup (ends nothing) and a second call beyond the per-turn limit of 1
        "Run it. " + tool_call_text(MARKUP_CODE) + tool_call_text("print(2)"),
        # empty arguments of a tool with a required parameter: a clear error, nothing run
        '<tool_call>{"name": "code_interpreter", "arguments": ""}</tool_call>',
        f"So \\boxed{{{answer}}}.",
    ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    demos, _ = build_demos(sample_problems(3, seed=5))
    tok = build_tokenizer([render_demo(d) for d in demos], tmp_path_factory.mktemp("tok"))
    return demos[0], tok


def _heldout(demo, tok):
    turns = _turns(demo.problem.answer)
    for t in turns:
        assert tok.decode(tok.encode(t, add_special_tokens=False)) == t
    k = [0]

    async def generate(prompt_ids, temperature, max_tokens, seed):
        ids = tok.encode(turns[k[0]], add_special_tokens=False) + [tok.eos_token_id]
        k[0] += 1
        return ids[:max_tokens]

    (r,) = asyncio.run(run_episodes([demo.problem], generate, tok, max_assistant_turns=8, max_response_tokens=4096,
                                    max_tool_response_chars=256, tool_timeout_s=5.0))
    st = r.stats
    return {"turns": r.assistant_turns, "tool_calls": st.num_tool_calls, "tool_executed": st.num_tool_executed,
            "malformed_calls": st.num_malformed_calls, "tool_errors": st.num_tool_errors,
            "tool_timeouts": st.num_tool_timeouts, "termination": st.termination, "truncated": st.truncated,
            "correct": r.acc, "score": r.score, "response": r.model_text}


class _ScriptedClient:
    def __init__(self, turns):
        self.turns, self.k, self.seen = turns, 0, []

    async def chat(self, messages, **params):
        self.seen.append([dict(m) for m in messages])
        text = self.turns[self.k]
        self.k += 1
        return ChatResult(content=text, finish_reason="stop")


def _api(demo):
    from envs.tools.code_interpreter import CodeInterpreterTool

    with contextlib.redirect_stdout(io.StringIO()):
        tool = CodeInterpreterTool({"type": "native", "sandbox": {"limits": {"timeout_s": 5.0, "cpu_s": 5}}})
    settings = EvalSettings(k=1, max_turns=8, tools="on", max_tool_response_chars=256, max_parallel_calls=1,
                            tool_timeout_s=10.0)
    p = EvalProblem(0, "x/0", demo.problem.data_source, [{"role": "user", "content": demo.problem.question}],
                    demo.problem.answer, {"family": "tool_use"}, True)
    client = _ScriptedClient(_turns(demo.problem.answer))

    async def go():
        try:
            return await _Runner(client, settings, {"code_interpreter": tool}).run_sample(p, 0)
        finally:
            await tool.aclose()

    rec = asyncio.run(go())
    return {k: rec[k] for k in ("turns", "tool_calls", "tool_executed", "malformed_calls", "tool_errors",
                                "tool_timeouts", "termination", "truncated", "correct", "score", "response")}


def test_same_episode_same_statistics_through_api_and_heldout(setup):
    demo, tok = setup
    held, api = _heldout(demo, tok), _api(demo)
    expected = {"turns": 3, "tool_calls": 3, "tool_executed": 1, "malformed_calls": 2, "tool_errors": 2,
                "tool_timeouts": 0, "termination": "answer", "truncated": False, "correct": True, "score": 1.0}
    assert {k: held[k] for k in expected} == expected
    assert {k: api[k] for k in expected} == expected
    # the reward text holds no call: the \boxed{9} inside the code is never the answer
    for r in (held, api):
        assert "\\boxed{9}" not in r["response"] and "tool_call" not in r["response"]
        assert r["response"].endswith(f"So \\boxed{{{demo.problem.answer}}}.")
