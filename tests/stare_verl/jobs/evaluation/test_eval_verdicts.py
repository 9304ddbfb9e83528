"""An answer checker that gives no verdict (its time ran out, its worker crashed, it raised) is never stored as a
plain wrong answer: the record keeps ``verdict: "unverified"`` with the reason, the summary and the printed table
count such samples, a resume scores them again from the stored response (rewriting their line), and during RL
such a response keeps its reward 0 while the step's ``reward/timed_out/mean`` counts it. The checker's failures
are forced by replacing ``envs.reward.answers_equal`` (the real reward, episode driver, results file and summary
run); ``tests/envs/scoring/test_verifier_failures.py`` shows the real worker producing those verdicts."""

from __future__ import annotations

import asyncio
import json

import pytest

import envs.reward as reward_mod
from envs.scoring.verify import Verdict
from stare_verl.jobs.evaluation.episode import (
    MAX_SCORE_ATTEMPTS,
    EvalProblem,
    EvalRecord,
    Sample,
    TurnResult,
    rescore_record,
    run_episode,
    verdict_of,
)
from stare_verl.jobs.evaluation.runner import EvalSettings, ResultsFile, resume_split
from stare_verl.jobs.evaluation.summary import format_table, summarize, unverified_notes

GOLD = r"x^3+3x^2+3x+1"
RIGHT = r"The expansion is \boxed{(x+1)^{3}}"  # only math-verify decides it (no exact / numeric path)
WRONG_TEXT = r"\boxed{7}"


def _problem(i=0, tool_use=False):
    return EvalProblem(i, f"toy/test/{i}", "toy", [{"role": "user", "content": "expand (x+1)^3"}], GOLD,
                       {"family": "tool_use" if tool_use else "short_cot"}, tool_use)


@pytest.fixture
def checker(monkeypatch):
    """Set what the answer checker answers for pairs math-verify would decide: ``checker.mode`` = "timeout" |
    "error" | "ok" (a real verdict: equal when the prediction expands to the gold). Counts the calls."""
    state = {"mode": "ok", "calls": 0}
    real = reward_mod.answers_equal

    def fake(pred, gold, timeout_s=5.0, pool=None):
        state["calls"] += 1
        if "x+1" in str(pred) and state["mode"] != "ok":
            return Verdict(None, state["mode"])
        if "x+1" in str(pred):
            return Verdict(True, "math_verify")
        return real(pred, gold, timeout_s=timeout_s)

    monkeypatch.setattr(reward_mod, "answers_equal", fake)
    return state


def _episode(text, tool_use=False, finish="stop"):
    async def generate(req):
        return TurnResult(text=text, finish_reason=finish, prompt_tokens=5, completion_tokens=7)

    return asyncio.run(run_episode(Sample(_problem(tool_use=tool_use), 0, 0), generate, max_tokens=64, max_turns=2,
                                   runner=None if not tool_use else _NoTools()))


class _NoTools:
    schemas: dict = {}

    async def release_trajectory(self, request_id):
        pass


# ------------------------------------------------------------------------------------------ the record


@pytest.mark.parametrize("score, expected", [
    ({"acc": True, "timed_out": False, "verify_method": "math_verify"}, ("correct", "math_verify")),
    ({"acc": False, "timed_out": True, "verify_method": "timeout"}, ("unverified", "timeout")),
    ({"acc": False, "timed_out": True, "verify_method": "error"}, ("unverified", "error")),
    ({"acc": False, "timed_out": False, "verify_method": "error"}, ("unverified", "error")),
    ({"acc": False, "timed_out": False, "verify_method": "math_verify"}, ("wrong", "math_verify")),
    ({"acc": False, "timed_out": False, "verify_method": "hedge"}, ("wrong", "hedge")),
    ({"acc": False, "timed_out": False, "verify_method": "empty"}, ("wrong", "empty")),
    ({"acc": False, "timed_out": False, "verify_method": "no_ground_truth"}, ("wrong", "no_ground_truth")),
    ({}, ("wrong", "")),
])  # fmt: skip
def test_verdict_of_a_reward_dict(score, expected):
    assert verdict_of(score) == expected


@pytest.mark.parametrize("mode", ["timeout", "error"])
@pytest.mark.parametrize("tool_use", [False, True])
def test_a_checker_without_verdict_is_recorded_unverified_with_its_reason(checker, mode, tool_use):
    checker["mode"] = mode
    rec = _episode(RIGHT, tool_use=tool_use)
    assert (rec.correct, rec.verdict, rec.verify_method, rec.score) == (False, "unverified", mode, 0.0)
    assert rec.has_answer and rec.response == RIGHT  # the response is kept: it can be scored again
    checker["mode"] = "ok"
    rec = _episode(RIGHT, tool_use=tool_use)
    assert (rec.correct, rec.verdict, rec.verify_method, rec.score) == (True, "correct", "math_verify", 1.0)


@pytest.mark.parametrize("text, finish, method", [(WRONG_TEXT, "stop", "math_verify"), ("no box", "stop", "empty"),
                                                  (RIGHT, "length", "empty")])  # fmt: skip
def test_wrong_answers_stay_wrong_whatever_the_checker_does(checker, text, finish, method):
    checker["mode"] = "timeout"  # decided (a real check of 7), no answer, a cut response
    rec = _episode(text, finish=finish)
    assert (rec.correct, rec.verdict, rec.verify_method) == (False, "wrong", method)


def test_a_record_whose_verdict_contradicts_correct_is_invalid():
    base = dict(problem_id="p", problem_index=0, sample_index=0, data_source="toy", ground_truth="1")
    assert EvalRecord(**base, correct=True).verdict == "correct"  # derived when not given
    assert EvalRecord(**base).verdict == "wrong"
    for correct, verdict in ((True, "wrong"), (False, "correct"), (True, "unverified")):
        with pytest.raises(ValueError, match="contradicts"):
            EvalRecord(**base, correct=correct, verdict=verdict)
    with pytest.raises(ValueError):
        EvalRecord(**base, verdict="maybe")


# ------------------------------------------------------------------------------------------ the summary


def _row(i, j, verdict, method="math_verify", source="toy"):
    return EvalRecord(problem_id=f"{source}/test/{i}", problem_index=i, sample_index=j, data_source=source,
                      ground_truth=GOLD, response=RIGHT, correct=verdict == "correct", verdict=verdict,
                      verify_method=method).model_dump()  # fmt: skip


def test_the_summary_and_the_table_count_unverified_samples():
    rows = [_row(0, 0, "correct"), _row(0, 1, "unverified", "timeout"), _row(1, 0, "wrong"),
            _row(1, 1, "unverified", "error"), _row(0, 0, "wrong", source="aime"), _row(0, 1, "wrong", source="aime"),
            _row(1, 0, "unverified", "timeout", source="aime"), _row(1, 1, "correct", source="aime")]  # fmt: skip
    s = summarize(rows)
    g = s["groups"]
    assert (g["toy"]["unverified"], g["toy"]["unverified_why"]) == (2, {"error": 1, "timeout": 1})
    assert (g["aime"]["unverified"], g["aime"]["unverified_why"]) == (1, {"timeout": 1})
    assert (g["all"]["unverified"], g["all"]["unverified_why"]) == (3, {"error": 1, "timeout": 2})
    assert g["toy"]["avg@k"] == 0.25  # unverified counts as wrong in the accuracy (and is said so)
    notes = unverified_notes(s)
    assert notes[0].startswith("aime: 1 of 4 samples unverified (timeout 1)")
    assert notes[1].startswith("toy: 2 of 4 samples unverified (error 1, timeout 1)")
    assert notes[2].startswith("all: 3 of 8 samples unverified") and len(notes) == 3
    table = format_table(s)
    head, _, *lines = table.splitlines()
    col = head.split().index("unverif")
    assert [ln.split()[col] for ln in lines[:3]] == ["1", "2", "3"]
    assert sum(ln.startswith("! ") for ln in lines) == 3


def test_no_unverified_samples_no_note():
    s = summarize([_row(0, 0, "correct"), _row(0, 1, "wrong")])
    assert s["groups"]["all"]["unverified"] == 0 and unverified_notes(s) == []
    assert "!" not in format_table(s)


# ------------------------------------------------------------------------------------------ resume


def _results(tmp_path, rows, settings):
    out = tmp_path / "out.jsonl"
    rf = ResultsFile(out, settings.fingerprint("m", tmp_path / "data.jsonl"))
    for r in rows:
        rf.append(r)
    return out, rf


def test_resume_scores_unverified_samples_again_and_rewrites_their_lines(tmp_path, checker):
    settings = EvalSettings(k=2, max_tokens=64)
    problems = [_problem(0), _problem(1)]
    other = {**_row(9, 0, "unverified", "timeout"), "problem_id": "toy/test/9"}  # not in this run's problems
    rows = [_row(0, 0, "unverified", "timeout"), _row(0, 1, "wrong"), _row(1, 0, "correct"),
            _row(1, 1, "unverified", "error"), other]  # fmt: skip
    out, rf = _results(tmp_path, rows, settings)
    before = out.read_text().splitlines()
    try:
        checker["mode"] = "ok"
        checker["calls"] = 0
        done, todo = resume_split(problems, settings, rf)
    finally:
        rf.close()
    assert todo == [] and checker["calls"] == 2  # only the two unverified samples were scored again
    got = {(r["problem_id"], r["sample_index"]): (r["verdict"], r["correct"], r["score"]) for r in done}
    assert got == {("toy/test/0", 0): ("correct", True, 1.0), ("toy/test/0", 1): ("wrong", False, 0.0),
                   ("toy/test/1", 0): ("correct", True, 0.0), ("toy/test/1", 1): ("correct", True, 1.0)}  # fmt: skip
    after = out.read_text().splitlines()
    assert len(after) == len(before) and after[1:3] == before[1:3] and after[4] == before[4]  # others untouched
    assert json.loads(after[0])["verdict"] == "correct" and json.loads(after[3])["verify_method"] == "math_verify"
    # a second resume reads the rewritten lines: nothing left to score again
    rf = ResultsFile(out, settings.fingerprint("m", tmp_path / "data.jsonl"))
    try:
        checker["calls"] = 0
        done2, _ = resume_split(problems, settings, rf)
    finally:
        rf.close()
    assert checker["calls"] == 0 and done2 == done


def test_a_checker_still_failing_on_resume_leaves_the_sample_unverified(tmp_path, checker):
    settings = EvalSettings(k=1, max_tokens=64)
    out, rf = _results(tmp_path, [_row(0, 0, "unverified", "timeout")], settings)
    try:
        checker["mode"] = "error"
        done, todo = resume_split([_problem(0)], settings, rf)
    finally:
        rf.close()
    assert todo == [] and (done[0]["verdict"], done[0]["verify_method"]) == ("unverified", "error")
    assert json.loads(out.read_text())["verify_method"] == "error"  # the new reason is kept
    assert summarize(done)["groups"]["all"]["unverified"] == 1


def test_an_always_failing_checker_stops_being_retried_after_the_last_attempt(tmp_path, checker):
    settings = EvalSettings(k=2, max_tokens=64)
    rows = [_row(0, 0, "unverified", "error"), {**_row(0, 1, "unverified", "timeout"), "score_attempts": 2}]
    out, rf = _results(tmp_path, rows, settings)
    rf.close()
    checker["mode"] = "error"  # the same error every time (an input the checker always fails on)
    seen = []
    for _ in range(MAX_SCORE_ATTEMPTS + 1):
        rf = ResultsFile(out, settings.fingerprint("m", tmp_path / "data.jsonl"))
        try:
            checker["calls"] = 0
            done, todo = resume_split([_problem(0)], settings, rf)
        finally:
            rf.close()
        seen.append((checker["calls"], [r["score_attempts"] for r in done]))
        assert todo == [] and [r["verdict"] for r in done] == ["unverified", "unverified"]
    # the first record is scored on two resumes (attempts 2 and 3), the second on one (attempt 3); then never again
    assert seen == [(2, [2, 3]), (1, [3, 3]), (0, [3, 3]), (0, [3, 3])]
    assert [json.loads(line)["score_attempts"] for line in out.read_text().splitlines()] == [3, 3]
    assert summarize(done)["groups"]["all"]["unverified"] == 2  # still counted as unverified
    # a checker that recovers before the last attempt gives the verdict
    rows = [{**_row(1, 0, "unverified", "timeout"), "score_attempts": MAX_SCORE_ATTEMPTS - 1}]
    one = EvalSettings(k=1, max_tokens=64)
    _, rf = _results(tmp_path / "b", rows, one)
    try:
        checker["mode"] = "ok"
        done, _ = resume_split([_problem(1)], one, rf)
    finally:
        rf.close()
    assert (done[0]["verdict"], done[0]["score_attempts"]) == ("correct", MAX_SCORE_ATTEMPTS)


def test_records_of_an_earlier_version_without_a_verdict_are_read_and_wrong_ones_scored_again(tmp_path, checker):
    settings = EvalSettings(k=3, max_tokens=64)
    legacy = []
    for j, (correct, text) in enumerate([(True, RIGHT), (False, RIGHT), (False, WRONG_TEXT)]):
        r = _row(0, j, "correct" if correct else "wrong")
        r.update(response=text)
        del r["verdict"], r["verify_method"]
        legacy.append(r)
    out, rf = _results(tmp_path, legacy, settings)
    try:
        checker["mode"] = "ok"
        done, todo = resume_split([_problem(0)], settings, rf)
    finally:
        rf.close()
    assert rf.skipped == 0 and todo == []  # no sample is drawn again
    assert [(r["verdict"], r["verify_method"]) for r in done] == [
        ("correct", "not_recorded"), ("correct", "math_verify"), ("wrong", "math_verify")]  # fmt: skip
    assert all("verdict" in json.loads(line) for line in out.read_text().splitlines()[1:])


def test_rescore_record_uses_the_recorded_truncation_and_length(checker):
    checker["mode"] = "ok"
    cut = {**_row(0, 0, "unverified", "timeout"), "truncated": True, "finish_reason": "length"}
    assert rescore_record(_problem(0), cut, {})["verdict"] == "wrong"  # a cut response has no answer
    long = {**_row(0, 0, "unverified", "timeout"), "tokens": 60}
    r = rescore_record(_problem(0), long, {"max_response_length": 64, "overlong_buffer_len": 8})
    assert r["verdict"] == "correct" and r["score"] == pytest.approx(1.0 - 4 / 8)  # the overlong penalty


# ------------------------------------------------------------------------------------------ training


@pytest.mark.parametrize("mode", ["timeout", "error"])
def test_during_training_an_unverified_response_scores_0_and_is_counted(checker, mode):
    from stare_verl.trainer import reward_extra_means_of

    checker["mode"] = mode
    infos = [reward_mod.compute_score("x", RIGHT, GOLD), reward_mod.compute_score("x", WRONG_TEXT, GOLD)]
    checker["mode"] = "ok"
    infos += [reward_mod.compute_score("x", RIGHT, GOLD), reward_mod.compute_score("x", RIGHT, GOLD)]
    assert [i["score"] for i in infos] == [0.0, 0.0, 1.0, 1.0]
    means = reward_extra_means_of(infos)
    assert means["reward/timed_out/mean"] == 0.25 and means["reward/acc/mean"] == 0.5
