"""The evaluation episode driver (stare_verl.jobs.evaluation.episode) over scripted ``generate`` functions and a
fake tool: budget accounting, the two ways a turn is not made, cut turns, the reward text, server call ids, the
record schema and the concurrency of run_samples."""

from __future__ import annotations

import asyncio
import json

import pytest

from envs.tool_use.episode import ToolCallRunner
from stare_verl.jobs.evaluation.episode import (
    CONTEXT_FULL,
    NO_BUDGET,
    RECORD_KEYS,
    EvalProblem,
    EvalRecord,
    Sample,
    TurnResult,
    run_episode,
    run_samples,
)

CALL = '<tool_call>{"name": "echo", "arguments": {"x": 1}}</tool_call>'


class _Echo:
    """A verl-BaseTool-shaped tool answering "echo:<x>" (no schema: no argument checks)."""

    tool_schema = None

    def __init__(self):
        self.ran = 0

    async def create(self, create_kwargs=None):
        return "i", None

    async def execute(self, instance_id, parameters, agent_data=None):
        self.ran += 1
        return f"echo:{parameters['x']}", None, {}

    async def release(self, instance_id):
        pass


def _problem(tool_use=True, answer="4"):
    return EvalProblem(0, "toy/0", "toy", [{"role": "user", "content": "2 + 2?"}], answer,
                       {"family": "tool_use" if tool_use else "short_cot"}, tool_use)


def _scripted(results):
    """A generate answering turn k with ``results[k]`` and recording each request."""
    seen = []

    async def generate(req):
        seen.append((req.turn, req.max_tokens, req.seed, [dict(m) for m in req.messages], req.tools))
        return results[req.turn]

    return generate, seen


def _run(sample, generate, **kw):
    kw.setdefault("max_turns", 8)
    kw.setdefault("max_tokens", 100)
    return asyncio.run(run_episode(sample, generate, **kw))


def test_tool_episode_budget_and_messages():
    tool = _Echo()
    generate, seen = _scripted([
        TurnResult("Let me see. " + CALL, "stop", prompt_tokens=10, completion_tokens=7,
                   message={"role": "assistant", "content": "raw", "tool_calls": [{"id": "c1"}]},
                   tool_call_ids=["c1"]),
        TurnResult("So \\boxed{4}.", "stop", prompt_tokens=30, completion_tokens=5),
    ])
    rec = _run(Sample(_problem(), 2, seed=11), generate, runner=ToolCallRunner({"echo": tool}))
    assert tool.ran == 1
    assert [s[1] for s in seen] == [100, 93]  # each turn asks for what is left of the budget
    assert [s[2] for s in seen] == [11, 11] and seen[0][4] == []  # the sample's seed; no schema to offer
    second = seen[1][3]
    assert second[1] == {"role": "assistant", "content": "raw", "tool_calls": [{"id": "c1"}]}  # the server's format
    assert second[2] == {"role": "tool", "content": "echo:1", "tool_call_id": "c1"}
    # 7 + 5 model tokens; response tokens = last prompt - first prompt + last completion = 20 + 5
    assert (rec.tokens, rec.response_tokens, rec.turns, rec.tool_calls, rec.tool_executed) == (12, 25, 2, 1, 1)
    assert rec.response == "Let me see.\nSo \\boxed{4}." and rec.correct and rec.score == 1.0
    assert (rec.sample_index, rec.seed, rec.termination, rec.finish_reason, rec.truncated) == (2, 11, "answer",
                                                                                               "stop", False)


def test_no_turn_results_and_a_spent_budget():
    runner = ToolCallRunner({"echo": _Echo()})
    first = TurnResult(CALL, "stop", prompt_tokens=10, completion_tokens=7)
    # the observation no longer fits (the local engine's answer): "length", not a cut, no turn counted
    generate, _ = _scripted([first, TurnResult(generated=False, finish_reason=NO_BUDGET)])
    rec = _run(Sample(_problem(), 0), generate, runner=runner)
    assert (rec.termination, rec.truncated, rec.turns, rec.finish_reason, rec.response_tokens) == (
        "length", False, 1, "stop", 7)
    # the server's window is full on a later turn: a cut episode, the message kept
    generate, _ = _scripted([first, TurnResult(generated=False, finish_reason=CONTEXT_FULL, error="too long")])
    rec = _run(Sample(_problem(), 0), generate, runner=runner)
    assert (rec.termination, rec.truncated, rec.finish_reason, rec.error) == ("length", True, CONTEXT_FULL,
                                                                              "too long")
    # the first turn spends the whole budget (ended by the model): its call is never answered (training's order)
    generate, seen = _scripted([TurnResult(CALL, "stop", prompt_tokens=10, completion_tokens=7)])
    rec = _run(Sample(_problem(), 0), generate, runner=runner, max_tokens=7)
    assert (rec.termination, rec.truncated, rec.tool_calls, len(seen)) == ("length", False, 0, 1)


def test_cut_turn_is_never_executed_and_max_turns():
    tool = _Echo()
    generate, _ = _scripted([TurnResult("\\boxed{4} " + CALL, "length", completion_tokens=5)])
    rec = _run(Sample(_problem(), 0), generate, runner=ToolCallRunner({"echo": tool}))
    assert (rec.truncated, rec.termination, rec.tool_calls, tool.ran, rec.correct) == (True, "length", 0, 0, False)
    generate, _ = _scripted([TurnResult("abc", "abort", completion_tokens=1)])
    assert _run(Sample(_problem(), 0), generate, runner=ToolCallRunner({})).termination == "aborted"
    generate, _ = _scripted([TurnResult(CALL, "stop", completion_tokens=1)] * 2)
    rec = _run(Sample(_problem(), 0), generate, runner=ToolCallRunner({"echo": tool}), max_turns=2)
    assert (rec.termination, rec.turns, tool.ran, rec.tokens, rec.response_tokens) == ("max_assistant_turns", 2, 1,
                                                                                        2, 2)


def test_plain_row_scores_the_whole_turn_without_special_tokens():
    generate, seen = _scripted([TurnResult("<think>hm</think>\\boxed{4}<|im_end|>", "stop")])
    rec = _run(Sample(_problem(tool_use=False), 0), generate, special_tokens=("<|im_end|>",))
    assert rec.response == "<think>hm</think>\\boxed{4}" and rec.correct and seen[0][4] is None
    assert rec.tokens is None and rec.response_tokens is None  # no usage reported
    with pytest.raises(ValueError, match="needs a tool runner"):
        _run(Sample(_problem(), 0), generate)


def test_record_schema_is_the_results_file_format():
    assert RECORD_KEYS == (
        "problem_id", "problem_index", "sample_index", "data_source", "ground_truth", "seed", "response",
        "extracted_answer", "has_answer", "correct", "verdict", "verify_method", "score_attempts", "score",
        "finish_reason",
        "truncated", "termination", "tokens", "response_tokens", "chars", "turns", "tool_calls", "tool_executed", "malformed_calls", "tool_errors",
        "tool_timeouts", "tool_time_s", "reflections", "error",
    )
    rec = EvalRecord(problem_id="a", problem_index=1, sample_index=0, data_source="s", ground_truth=["1", "2"])
    assert EvalRecord.model_validate(json.loads(json.dumps(rec.model_dump()))) == rec
    with pytest.raises(ValueError):
        EvalRecord(problem_id="a", problem_index=1, sample_index=0, data_source="s", ground_truth="1", bogus=1)


def test_run_samples_keeps_order_bounds_concurrency_and_stops_on_error():
    active, peak, done = 0, 0, []

    async def generate(req):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01 * (3 - req.seed % 3))  # later samples finish first
        active -= 1
        return TurnResult("\\boxed{4}", "stop")

    samples = [Sample(_problem(tool_use=False), j, seed=j) for j in range(6)]
    recs = asyncio.run(run_samples(samples, generate, concurrency=3, max_tokens=10, max_turns=1,
                                   on_record=lambda r: done.append(r.sample_index)))
    assert [r.sample_index for r in recs] == list(range(6)) and sorted(done) == list(range(6))
    assert peak == 3 and done != list(range(6))  # three in flight; written in finishing order

    async def failing(req):
        if req.seed == 1:
            raise RuntimeError("server gone")
        await asyncio.sleep(0.05)
        return TurnResult("x", "stop")

    with pytest.raises(RuntimeError, match="server gone"):
        asyncio.run(run_samples(samples, failing, concurrency=2, max_tokens=10, max_turns=1))
