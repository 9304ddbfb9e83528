"""Held-out evaluation loop: scripted policies through the real tool, sandbox and scorer; a real tiny model."""

import asyncio

import pytest
import torch

from envs.tiny_hf import build_model, build_tokenizer
from stare_verl.jobs.demo.evaluate import _pass_at_ks, _report, evaluate_model, run_episodes
from stare_verl.jobs.demo.sft import render_demo
from stare_verl.jobs.evaluation.episode import EvalRecord
from tests.support.demos import build_demos, sample_problems, tool_call_text

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    demos, _ = build_demos(sample_problems(9, seed=11))
    tok = build_tokenizer([render_demo(d) for d in demos], tmp_path_factory.mktemp("tok"))
    return demos, tok


def _scripted(tok, by_question, turns_of):
    """A token policy answering each problem's turn k with ``turns_of(demo)[k]`` (+ EOS); ``calls`` records
    (question, k, max_tokens, decoded prompt) of every call."""
    calls = []

    async def generate(prompt_ids, temperature, max_tokens, seed):
        text = tok.decode(prompt_ids)
        demo = next(d for q, d in by_question.items() if q in text)
        k = text.count("<tool_response>")
        ids = tok.encode(turns_of(demo)[k], add_special_tokens=False) + [tok.eos_token_id]
        calls.append((demo.problem.question, k, max_tokens, text))
        return ids[:max_tokens]

    return generate, calls


def _record(question="q", correct=False, **kw):
    return EvalRecord(problem_id=question, problem_index=0, sample_index=0, data_source="rg/t", ground_truth="1",
                      correct=correct, **kw)


def test_correct_tool_assisted_policy_scores_one(setup):
    demos, tok = setup
    gen, calls = _scripted(tok, {d.problem.question: d for d in demos}, lambda d: d.assistant_texts())
    res = asyncio.run(run_episodes([d.problem for d in demos], gen, tok))
    rep = _report(res, 0.0, 0.0)
    assert rep.accuracy == 1.0 and rep.mean_turns == 2.0 and rep.mean_tool_calls == 1.0
    assert rep.tool_error_rate == 0.0 and rep.truncated_rate == 0.0
    assert set(rep.per_task) == {d.problem.task for d in demos}
    for i, (r, d) in enumerate(zip(res, demos, strict=True)):
        assert r.response == f"\\boxed{{{d.problem.answer}}}"  # tool call removed, tool text never included
        assert (r.problem_index, r.seed, r.data_source, r.termination) == (i, i, d.problem.data_source, "answer")
        second = next(c[3] for c in calls if c[0] == d.problem.question and c[1] == 1)
        assert f"<tool_response>\n{d.problem.answer}\n</tool_response>" in second  # the observation the model read
        assert r.tool_time_s > 0 and r.response_tokens > r.tokens > 0
    assert len(calls) == 2 * len(demos)


def test_tool_output_earns_no_credit_and_malformed_call_is_answered(setup):
    demos, tok = setup
    d = demos[0]
    wrong = str(int(d.problem.answer) + 1)
    gen, _ = _scripted(tok, {d.problem.question: d}, lambda d: [tool_call_text(d.problem.code), f"\\boxed{{{wrong}}}"])
    (r,) = asyncio.run(run_episodes([d.problem], gen, tok))
    assert r.correct is False and r.score == 0.0 and r.tool_calls == 1

    bad = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}</tool_call>'  # brace missing
    gen, calls = _scripted(tok, {d.problem.question: d}, lambda d: [bad, *d.assistant_texts()])
    (r,) = asyncio.run(run_episodes([d.problem], gen, tok, max_response_tokens=512))
    assert r.malformed_calls == 1 and r.tool_calls == 2 and r.tool_errors == 1
    assert r.turns == 3 and r.correct is True
    assert "not valid JSON" in calls[1][3]


def test_failing_code_and_length_budget(setup):
    demos, tok = setup
    d = demos[1]
    gen, calls = _scripted(tok, {d.problem.question: d}, lambda d: [tool_call_text("print(1/0)"), "\\boxed{0}"])
    (r,) = asyncio.run(run_episodes([d.problem], gen, tok))
    # training's rule (envs.tool_use.episode): code that ran and failed is a result the model reads, not a tool error
    assert r.tool_errors == 0 and r.tool_executed == 1 and r.tool_calls == 1
    assert "ZeroDivisionError" in calls[1][3]

    gen, calls = _scripted(tok, {d.problem.question: d}, lambda d: d.assistant_texts())
    (r,) = asyncio.run(run_episodes([d.problem], gen, tok, max_response_tokens=10))
    assert r.truncated and r.correct is False and r.tool_calls == 0  # a cut call is never executed
    assert (r.termination, r.finish_reason) == ("length", "length")
    assert r.tokens == r.response_tokens == 10 and calls[0][2] == 10

    # the observation does not fit what is left of the budget (training's rule): the episode ends on "length"
    # without another turn and without the observation's tokens; not a cut
    n1 = len(tok.encode(d.assistant_texts()[0], add_special_tokens=False)) + 1
    gen, calls = _scripted(tok, {d.problem.question: d}, lambda d: d.assistant_texts())
    (r,) = asyncio.run(run_episodes([d.problem], gen, tok, max_response_tokens=n1 + 3))
    assert (r.turns, r.tool_executed, r.termination, r.truncated, r.finish_reason) == (1, 1, "length", False, "stop")
    assert r.tokens == r.response_tokens == n1 and len(calls) == 1


def test_real_tiny_model_batched(setup):
    demos, tok = setup
    model = build_model(tok, seed=0).eval()
    problems = [d.problem for d in demos[:4]]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: one thread is faster than two competing ones
    try:
        out = evaluate_model(model, tok, problems, (0.0, 1.0), max_response_tokens=16)
        greedy_again = evaluate_model(model, tok, problems, (0.0,), max_response_tokens=16)[0.0][1]
    finally:
        torch.set_num_threads(threads)
    for t in (0.0, 1.0):
        rep, eps = out[t]
        assert rep.n == 4 and 0.0 <= rep.accuracy <= 1.0
        assert all(e.response_tokens <= 16 and e.turns >= 1 for e in eps)
        assert rep.mean_response_tokens == pytest.approx(sum(e.tokens for e in eps) / 4)
    again = [(e.response, e.tokens, e.response_tokens) for e in greedy_again]
    assert again == [(e.response, e.tokens, e.response_tokens) for e in out[0.0][1]]


def test_pass_at_k_from_rounds():
    # 2 problems x 4 rounds: problem 0 correct in rounds 0 and 2, problem 1 never
    eps = [_record(f"p{i}", correct=(i == 0 and j in (0, 2))) for j in range(4) for i in range(2)]
    got = _pass_at_ks(eps, 2, 4)
    assert list(got) == [1, 2, 4]
    assert got[1] == pytest.approx(0.25) and got[4] == pytest.approx(0.5)
    assert got[2] == pytest.approx((1 - 1 / 6) / 2)  # 1 - C(2,2)/C(4,2) for problem 0, 0 for problem 1
    with pytest.raises(ValueError):
        _pass_at_ks(eps[:-1], 2, 4)


def test_real_tiny_model_samples_per_problem(setup):
    demos, tok = setup
    model = build_model(tok, seed=0).eval()
    problems = [d.problem for d in demos[:3]]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = evaluate_model(model, tok, problems, (0.0, 1.0), samples=3, max_response_tokens=8)
        one = evaluate_model(model, tok, problems, (1.0,), max_response_tokens=8)[1.0][1]
    finally:
        torch.set_num_threads(threads)
    greedy, sampled = out[0.0][0], out[1.0][0]
    assert greedy.n == 3 and greedy.samples_per_problem == 1 and greedy.pass_at_k == {}
    assert sampled.n == 9 and sampled.samples_per_problem == 3 and list(sampled.pass_at_k) == [1, 2, 3]
    assert sampled.pass_at_k[1] == pytest.approx(sampled.accuracy)
    # round 0 uses the seeds of the single-sample evaluation
    assert [(e.seed, e.response, e.tokens) for e in out[1.0][1][:3]] == [(e.seed, e.response, e.tokens) for e in one]
