"""Resuming an evaluation never reuses stale answers (issue 31.11): the data's content is in the fingerprint,
samples without (or with other) settings are refused with how to start afresh, corrupt records are skipped and
counted, and one de-duplication rule (the first record of a pair) holds for resume, order and every count.
No server, no model: the results file, the real data loader and the summary."""

import json
import logging

import pytest

from envs.datasets import make_row, write_parquet
from stare_verl.jobs.evaluation.episode import EvalRecord
from stare_verl.jobs.evaluation.metrics import aggregate_problems, unique_records
from stare_verl.jobs.evaluation.runner import (
    EvalSettings,
    ResultsFile,
    ResumeMismatch,
    data_digest,
    load_problems,
    record_order,
    resume_split,
)
from stare_verl.jobs.evaluation.summary import summarize

QA = [("What is 2 + 3?", "5"), ("What is 3 + 4?", "7")]
K = 2


def _parquet(tmp_path, qa=QA, name="toy_test.parquet"):
    return write_parquet([make_row(q, a, "toy", i, "test") for i, (q, a) in enumerate(qa)], tmp_path / name)


def _jsonl(tmp_path, qa=QA, name="toy_test.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(make_row(q, a, "toy", i, "test")) + "\n" for i, (q, a) in enumerate(qa)))
    return path


def _rec(p, j, correct=True, **kw):
    return EvalRecord(problem_id=p.problem_id, problem_index=p.index, sample_index=j, data_source=p.data_source,
                      ground_truth=p.ground_truth, correct=correct, **kw).model_dump()


def _first_run(data, out, settings=None, model="m"):
    """A finished run: every sample of every problem answered (correct), with its settings file."""
    settings = settings or EvalSettings(k=K, max_tokens=8)
    problems = load_problems(data)
    rf = ResultsFile(out, settings.fingerprint(model, data))
    try:
        for p in problems:
            for j in range(settings.k):
                rf.append(_rec(p, j))
    finally:
        rf.close()
    return problems


# ------------------------------------------------------------------------------ the data's content


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
@pytest.mark.parametrize("edit", ["new ground truth", "new question", "one more row", "one row less"])
def test_data_changed_in_place_is_refused(tmp_path, kind, edit):
    write = _parquet if kind == "parquet" else _jsonl
    data = write(tmp_path)
    out = tmp_path / "out.jsonl"
    _first_run(data, out)
    before = data_digest(data)
    changed = {
        "new ground truth": [QA[0], ("What is 3 + 4?", "8")],
        "new question": [QA[0], ("What is 3 + 5?", "7")],
        "one more row": [*QA, ("What is 1 + 1?", "2")],
        "one row less": QA[:1],
    }[edit]
    assert write(tmp_path, changed) == data  # the same path, other content
    assert data_digest(data) != before
    settings = EvalSettings(k=K, max_tokens=8)
    with pytest.raises(ResumeMismatch, match=r"data_sha256 differ.*content changed.*--overwrite") as err:
        ResultsFile(out, settings.fingerprint("m", data))
    assert f"{2 * K} line(s) of {out}" in str(err.value)
    assert len(out.read_text().splitlines()) == 2 * K  # nothing lost by the refusal
    # starting afresh: the old records are gone, everything runs again against the new ground truths
    rf = ResultsFile(out, settings.fingerprint("m", data), overwrite=True)
    try:
        problems = load_problems(data)
        done, todo = resume_split(problems, settings, rf)
    finally:
        rf.close()
    assert done == [] and len(todo) == len(changed) * K
    assert json.loads((tmp_path / "out.jsonl.meta.json").read_text())["data_sha256"] == data_digest(data)


def test_same_content_resumes_and_a_rewrite_with_equal_bytes_is_no_change(tmp_path):
    data = _jsonl(tmp_path)
    out = tmp_path / "out.jsonl"
    problems = _first_run(data, out)
    _jsonl(tmp_path)  # written again, byte for byte the same
    settings = EvalSettings(k=K + 1, max_tokens=8)  # a larger k is allowed
    rf = ResultsFile(out, settings.fingerprint("m", data))
    try:
        done, todo = resume_split(problems, settings, rf)
    finally:
        rf.close()
    assert len(done) == 2 * K and [(s.problem.problem_id, s.index) for s in todo] == [
        ("toy/test/0", 2), ("toy/test/1", 2)]  # fmt: skip
    assert settings.fingerprint("m", tmp_path / "none.jsonl")["data_sha256"] is None


# ------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("second", [
    {"model": "m"},  # the same settings: still refused, nothing says they are the same
    {"model": "other-model"},
    {"model": "m", "temperature": 0.6},
    {"model": "other-model", "temperature": 0.0, "top_p": 1.0},
])  # fmt: skip
def test_samples_without_their_settings_file_are_refused(tmp_path, second):
    data = _parquet(tmp_path)
    out = tmp_path / "out.jsonl"
    _first_run(data, out)
    (tmp_path / "out.jsonl.meta.json").unlink()
    kw = {k: v for k, v in second.items() if k != "model"}
    fp = EvalSettings(k=K, max_tokens=8, **kw).fingerprint(second["model"], data)
    with pytest.raises(ResumeMismatch, match=r"settings file .*out.jsonl.meta.json is missing.*--overwrite"):
        ResultsFile(out, fp)
    assert not (tmp_path / "out.jsonl.meta.json").exists()  # the refusal writes no settings for the old samples
    ResultsFile(out, fp, overwrite=True).close()
    assert not out.exists() and json.loads((tmp_path / "out.jsonl.meta.json").read_text())["model"] == second["model"]


def test_an_empty_results_file_without_settings_starts_normally(tmp_path):
    data = _parquet(tmp_path)
    out = tmp_path / "out.jsonl"
    out.write_text("")
    rf = ResultsFile(out, EvalSettings(k=K, max_tokens=8).fingerprint("m", data))
    try:
        assert rf.load() == []
    finally:
        rf.close()
    assert (tmp_path / "out.jsonl.meta.json").is_file()


@pytest.mark.parametrize("field, change", [
    ("model", {"model": "other"}), ("temperature", {"temperature": 0.6}), ("top_p", {"top_p": 0.95}),
    ("max_tokens", {"max_tokens": 16}), ("seed", {"seed": 7}), ("max_turns", {"max_turns": 2}),
    ("reward_kwargs", {"reward_kwargs": {"overlong_buffer_len": 4}}),
])  # fmt: skip
def test_other_settings_are_refused_by_name(tmp_path, field, change):
    data = _parquet(tmp_path)
    out = tmp_path / "out.jsonl"
    _first_run(data, out)
    kw = {k: v for k, v in change.items() if k != "model"}
    fp = EvalSettings(k=K, **{"max_tokens": 8, **kw}).fingerprint(change.get("model", "m"), data)
    with pytest.raises(ResumeMismatch, match=rf"other settings \({field} differ.*--overwrite"):
        ResultsFile(out, fp)


# -------------------------------------------------------------------------------- corrupt records


BAD_FIELDS = [
    {"sample_index": "abc"},
    {"sample_index": "1"},  # a string, even of digits
    {"sample_index": True},
    {"sample_index": -1},
    {"sample_index": 1.5},
    {"problem_id": [1]},
    {"problem_id": None},
    {"problem_id": {"a": 1}},
    {"correct": "yes"},
    {"problem_index": "0"},
]


def test_corrupt_records_are_skipped_counted_and_run_again(tmp_path, caplog):
    data = _parquet(tmp_path)
    out = tmp_path / "out.jsonl"
    problems = _first_run(data, out, EvalSettings(k=1, max_tokens=8))  # sample 0 of both problems
    p0, p1 = problems
    lines = out.read_text().splitlines()
    lines.insert(1, json.dumps({**_rec(p1, 1), **BAD_FIELDS[0]}))
    lines += [json.dumps({**_rec(p0, 1), **bad}) for bad in BAD_FIELDS[1:]]
    lines += ["[1, 2]", "null", '"text"', "{not json"]
    out.write_text("\n".join(lines) + "\n")
    settings = EvalSettings(k=K, max_tokens=8)
    rf = ResultsFile(out, settings.fingerprint("m", data))
    try:
        with caplog.at_level(logging.WARNING, logger="stare_verl.jobs.evaluation.results"):
            done, todo = resume_split(problems, settings, rf)
    finally:
        rf.close()
    assert rf.skipped == len(BAD_FIELDS) + 4
    assert [(r["problem_id"], r["sample_index"]) for r in done] == [("toy/test/0", 0), ("toy/test/1", 0)]
    assert [(s.problem.problem_id, s.index) for s in todo] == [("toy/test/0", 1), ("toy/test/1", 1)]
    warning = next(m for m in caplog.messages if "no valid record" in m)
    assert f"skipped {len(BAD_FIELDS) + 4} line(s)" in warning and "line 2: sample_index" in warning
    assert "their samples run again" in warning


# --------------------------------------------------------------------------------- de-duplication


def test_one_deduplication_rule_for_resume_order_and_every_count(tmp_path):
    data = _parquet(tmp_path)
    out = tmp_path / "out.jsonl"
    settings = EvalSettings(k=K, max_tokens=8)
    problems = load_problems(data)
    p0, p1 = problems
    first = [_rec(p0, 0, correct=True, tokens=10), _rec(p0, 1, correct=False, tokens=10),
             _rec(p1, 0, correct=False, tokens=10), _rec(p1, 1, correct=False, tokens=10)]  # fmt: skip
    repeats = [_rec(p0, 0, correct=False, tokens=1000), _rec(p1, 1, correct=True, tokens=1000),
               _rec(p1, 1, correct=True, tokens=3000)]  # fmt: skip
    rf = ResultsFile(out, settings.fingerprint("m", data))
    for r in [first[0], repeats[0], first[1], first[2], repeats[1], first[3], repeats[2]]:
        rf.append(r)
    rf.close()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    # the rule itself, on the file's order: the first record of each pair
    assert unique_records(rows) == [first[0], first[1], first[2], repeats[1]]

    rf = ResultsFile(out, settings.fingerprint("m", data))
    try:
        done, todo = resume_split(problems, settings, rf)
    finally:
        rf.close()
    assert rf.duplicates == 3 and todo == []  # (p0, 0) once, (p1, 1) twice over
    ordered = record_order(problems, K, rows)  # the raw rows, repeats included
    assert ordered == record_order(problems, K, done) == [first[0], first[1], first[2], repeats[1]]
    assert [(p.n, p.c) for p in aggregate_problems(rows, [1, 2])] == [(2, 1), (2, 1)]
    s = summarize(rows)["groups"]["all"]
    assert s["samples"] == 4 and s["k"] == 2 and s["min_samples_per_problem"] == 2
    assert s["avg@k"] == pytest.approx(0.5) and s["pass@k"]["2"] == pytest.approx(1.0)
    assert s["mean_tokens"] == pytest.approx((10 + 10 + 10 + 1000) / 4)  # the kept records' tokens only
    assert summarize(rows) == summarize(ordered)
