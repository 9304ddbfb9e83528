"""pass@k / avg@k estimators and the summary, on hand-computed values."""

import math
from fractions import Fraction

import pytest

from stare_verl.jobs.evaluation.metrics import (
    aggregate_problems,
    avg_at_k,
    default_ks,
    mean_pass_at_k,
    pass_at_k,
)
from stare_verl.jobs.evaluation.summary import format_table, partial_pass_at, summarize


def _exact(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k: some pair always holds a correct sample
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10


def test_pass_at_k_matches_exact_binomials_and_is_stable():
    for n in (1, 2, 7, 32, 64):
        for c in range(n + 1):
            for k in {k for k in (1, 2, n // 2, n) if 1 <= k <= n}:
                assert pass_at_k(n, c, k) == pytest.approx(float(_exact(n, c, k)), abs=1e-12)
    # large n: no overflow, still the exact value
    assert pass_at_k(2000, 3, 100) == pytest.approx(float(_exact(2000, 3, 100)), rel=1e-12)
    # pass@1 is the share of correct samples
    assert pass_at_k(32, 12, 1) == pytest.approx(12 / 32)


def test_pass_at_k_bad_arguments():
    with pytest.raises(ValueError, match="needs 1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(0, 0, 1)
    with pytest.raises(ValueError):
        avg_at_k([])


def test_default_ks():
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    assert default_ks(5) == [1, 2, 4, 5]
    assert default_ks(1) == [1]


def _recs(pattern, source="s"):
    return [
        {"problem_id": pid, "sample_index": j, "correct": bool(x), "data_source": source, "tokens": 10 * (j + 1),
         "chars": 5, "tool_calls": 0, "reflections": {"wait": j, "total": j}}
        for pid, row in pattern.items()
        for j, x in enumerate(row)
    ]


def test_aggregate_and_summary():
    recs = _recs({"a": [1, 1, 0, 1], "b": [0, 0, 0, 1], "c": [0, 0, 0, 0]})
    recs.append(dict(recs[0]))  # a duplicated (problem, sample) counts once
    probs = aggregate_problems(recs, [1, 2, 4])
    assert [(p.n, p.c) for p in probs] == [(4, 3), (4, 1), (4, 0)]
    assert mean_pass_at_k(probs, 2) == (pytest.approx((1.0 + 0.5 + 0.0) / 3), 3)
    assert mean_pass_at_k(probs, 8) == (None, 0)
    s = summarize(recs[:-1])["groups"]["all"]
    assert s["avg@k"] == pytest.approx((0.75 + 0.25 + 0) / 3)
    assert s["pass@k"]["1"] == pytest.approx(1 / 3)
    assert s["pass@k"]["4"] == pytest.approx(2 / 3)
    assert s["mean_tokens"] == pytest.approx(25.0)
    assert s["reflections"]["total"] == pytest.approx(1.5)
    table = format_table(summarize(recs[:-1]))
    assert "pass@4" in table and "33.3" in table and "66.7" in table
    head = table.splitlines()[0].split()
    assert "avg@k%" in head and "pass@4%" in head  # percent, said in the header (the JSON holds fractions)


def test_summary_per_source_and_uneven_samples():
    recs = _recs({"a": [1, 0]}, "x") + _recs({"b": [1, 1, 1, 0]}, "y")
    g = summarize(recs, ks=[1, 4])["groups"]
    assert g["x"]["pass@k"] == {"1": 0.5}  # 2 samples: no pass@4
    assert g["y"]["pass@k"]["4"] == 1.0
    assert g["all"]["pass@k"]["4"] == 1.0 and g["all"]["pass@k_problems"]["4"] == 1
    assert all(k.isdigit() for gr in g.values() for k in gr["pass@k"])  # rates only: every key is a k
    # a k asked for that no problem of a group reaches has no value, a count of 0 and a warning
    assert g["x"]["pass@k_problems"] == {"1": 1, "4": 0}
    assert "pass@4 of x has no value: no problem of its 1 has 4 samples" in partial_pass_at(summarize(recs, ks=[1, 4]))
    assert g["all"]["avg@k"] == pytest.approx((0.5 + 0.75) / 2)


def test_pass_at_k_is_marked_where_it_covers_only_some_problems():
    """Issue 14.8: 2 problems, one with 8 samples and one with 2 (failed or resumed requests)."""
    recs = _recs({"a": [1, 0, 0, 0, 0, 0, 0, 0], "b": [1, 1]}, "aime")
    s = summarize(recs)
    g = s["groups"]["aime"]
    assert g["pass@k"]["8"] == 1.0 and g["pass@k_problems"]["8"] == 1  # the value over the covered problem
    assert g["pass@k_problems"] == {"1": 2, "2": 2, "4": 1, "8": 1}
    assert partial_pass_at(s) == [
        "pass@4 of aime covers 1 of 2 problems (1 has fewer than 4 samples)",
        "pass@8 of aime covers 1 of 2 problems (1 has fewer than 8 samples)",
    ]
    table = format_table(s)
    row = next(line for line in table.splitlines() if line.startswith("aime"))
    assert "100.0*" in row and "50.0*" in row  # pass@8 and pass@4 marked
    assert " 62.5 " in row + " "  # pass@2 covers both problems: not marked
    assert table.splitlines()[-1] == "* pass@8 of aime covers 1 of 2 problems (1 has fewer than 8 samples)"


def test_pass_at_k_marks_per_row_and_a_full_set_has_no_marks():
    full = _recs({"a": [1, 0, 0, 1], "b": [0, 0, 0, 0]}, "x")
    assert partial_pass_at(summarize(full)) == [] and "*" not in format_table(summarize(full))
    mixed = full + _recs({"c": [1]}, "y")
    s = summarize(mixed)
    notes = partial_pass_at(s)
    assert notes == ["pass@2 of all covers 2 of 3 problems (1 has fewer than 2 samples)",
                     "pass@4 of all covers 2 of 3 problems (1 has fewer than 4 samples)"]
    rows = {line.split()[0]: line for line in format_table(s).splitlines()[2:] if not line.startswith("*")}
    assert "*" not in rows["x"] and "*" not in rows["y"] and rows["all"].count("*") == 2
    assert s["groups"]["all"]["pass@k_problems"] == {"1": 3, "2": 2, "4": 2}
