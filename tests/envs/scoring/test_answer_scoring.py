"""Answer extraction, normalisation, numeric fast path and math-verify equivalence (envs.scoring)."""

from __future__ import annotations

import sys
import threading
import time
from fractions import Fraction

import pytest

from envs.scoring import (
    MathVerifyPool,
    Verdict,
    answers_equal,
    clear_verdict_cache,
    count_reflections,
    evaluate,
    extract_boxed,
    extract_final_answer,
    find_boxed_all,
    normalize_answer,
    numeric_equal,
    split_think,
)


@pytest.fixture(scope="module")
def pool():
    p = MathVerifyPool(max_workers=2)
    assert p.prewarm(1, wait_s=60.0)
    yield p
    p.close()


# --------------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the answer is \boxed{\frac{3}{4}}.", r"\frac{3}{4}"),
        (r"\boxed{1} first, then \fbox{42}", "42"),  # the last box wins, \fbox counts
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces do not close the box
        (r"\boxed{5} and then \boxed{12", "5"),  # incomplete last box: the last *complete* one
        (r"\boxed{x+\boxed{3}}", r"x+\boxed{3}"),  # outermost box
        (r"\boxed 42.", "42"),
        (r"\boxed{a}\boxed{b}", "a, b"),  # boxes side by side are one answer (issue 14)
        ("It could be 42 or 17.", None),
        (r"\boxed{}", ""),
        (r"\boxed{\frac{1}{2}", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_find_boxed_all_outermost_in_order():
    assert find_boxed_all(r"\boxed{1} x \boxed{\boxed{2}} \boxed{3") == ["1", r"\boxed{2}"]


def test_extraction_is_linear_on_many_unclosed_boxes():
    text = r"\boxed{" * 30000 + r"\boxed{7}"
    t0 = time.process_time()
    assert extract_boxed(text) == "7"
    assert time.process_time() - t0 < 30.0  # a hang guard in CPU seconds (ms idle; quadratic: minutes)


def test_non_strict_fallbacks():
    assert extract_final_answer("work...\nAnswer: $42$", strict_box=False) == ("42", "answer_line")
    assert extract_final_answer("so #### 1000", strict_box=False) == ("1000", "gsm8k")
    assert extract_final_answer("The final answer is 7.", strict_box=False) == ("7", "final_answer_is")
    assert extract_final_answer("work...\nAnswer: 42", strict_box=True) == (None, "none")


def test_split_think_styles():
    r1 = split_think(r"reasoning \boxed{1}</think>final \boxed{2}")  # R1-distill: only the closing tag
    assert (r1.reasoning, r1.answer, r1.closed) == (r"reasoning \boxed{1}", r"final \boxed{2}", True)
    q3 = split_think("<think>\nhmm\n</think>\n\nThe answer is 5")
    assert (q3.reasoning, q3.answer.strip(), q3.opened) == ("\nhmm\n", "The answer is 5", True)
    unclosed = split_think(r"<think>still going \boxed{3}")
    assert unclosed.answer == "" and not unclosed.closed
    plain = split_think(r"no tags \boxed{4}")
    assert plain.answer == r"no tags \boxed{4}"
    assert split_think(r"no tags \boxed{4}", mode="required").answer == ""
    assert split_think(r"<think>a</think>b", mode="off").answer == "<think>a</think>b"


# ------------------------------------------------------------------------------------ normalisation


@pytest.mark.parametrize(
    "raw, expected",
    [
        (r"\dfrac{3}{4}", r"\frac{3}{4}"),
        (r"\tfrac{3}{4}", r"\frac{3}{4}"),
        (r"\frac34", r"\frac{3}{4}"),
        (r"12 \text{ cm}", "12"),
        (r"12\text{ cm}^2", "12"),
        ("5 meters", "5"),
        (r"50\%", "50"),
        ("1,000", "1000"),
        (r"1{,}000", "1000"),
        ("1,234,567.5", "1234567.5"),
        ("x=5", "5"),
        ("y = 2x+3", "2x+3"),
        ("x^2+y^2=1", "x^2+y^2=1"),  # not an assignment: kept
        (r"\fbox{42}", "42"),
        (r"90^\circ", "90"),
        (r"\$ 1,000", "1000"),
        (r"\text{(C)}", "C"),
        (r"\text{Monday}", "Monday"),
        (r"\left(1, 2\right)", "(1,2)"),
        ("(1,2)", "(1,2)"),  # a tuple keeps its comma
        ("42.", "42"),
        (r"\sqrt2", r"\sqrt{2}"),
        ("{5}", "5"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


# ------------------------------------------------------------------------------------ numeric path


def test_numeric_evaluate_values():
    assert evaluate(r"\frac{3}{4}").value == Fraction(3, 4)
    assert evaluate("0.75").value == Fraction(3, 4) and evaluate("0.75").decimal
    assert evaluate(r"\sqrt[3]{27}").value == 3 and evaluate(r"\sqrt[3]{27}").exact
    assert evaluate("2^{10}").value == 1024
    assert evaluate(r"-3^2").value == -9
    assert evaluate(r"2\sqrt{3}").value == pytest.approx(12**0.5)
    assert not evaluate(r"2\sqrt{3}").exact
    for outside in (r"\pi", "(1,2)", "x+1", "9^{9^{9}}", r"\sqrt{-4}", "1/0", "2^23"):
        assert evaluate(outside) is None, outside


def test_numeric_equal_rules():
    assert numeric_equal(evaluate(r"2\sqrt{3}"), evaluate(r"\sqrt{12}")) is True
    assert numeric_equal(evaluate(r"3\sqrt{2}"), evaluate(r"2\sqrt{3}")) is False
    assert numeric_equal(evaluate("5"), evaluate("6")) is False
    assert numeric_equal(evaluate("0.5"), evaluate(r"\frac{1}{2}")) is True
    assert numeric_equal(evaluate("0.33"), evaluate(r"\frac{1}{3}")) is None  # rounding: math-verify decides


# ------------------------------------------------------------------------------------ equivalence


@pytest.mark.parametrize(
    "pred, gold, method",
    [
        (r"\dfrac{3}{4}", r"\frac{3}{4}", "exact"),
        (r"12 \text{ cm}", "12", "exact"),
        (r"50\%", "50", "exact"),
        ("1,000", "1000", "exact"),
        ("x=5", "5", "exact"),
        (r"\fbox{42}", "42", "exact"),
        ("0.75", r"\frac{3}{4}", "numeric"),
        (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", "numeric"),
        ("c", r"\text{(C)}", "exact"),
    ],
)
def test_equal_fast_paths(pred, gold, method, pool):
    v = answers_equal(pred, gold, pool=pool)
    assert (v.equal, v.method) == (True, method)


@pytest.mark.parametrize(
    "pred, gold, equal",
    [
        (r"x^2+2x+1", r"(x+1)^2", True),
        (r"\frac{\pi}{2}", r"\pi/2", True),
        ("[0,1)", "[0,1]", False),
        ("(2,1)", "(1,2)", False),
        ("3.14", r"\pi", False),
    ],
)
def test_equal_via_math_verify(pred, gold, equal, pool):
    v = answers_equal(pred, gold, pool=pool)
    assert (v.equal, v.method) == (equal, "math_verify")


def test_wrong_answers_are_wrong(pool):
    assert answers_equal("12", "120", pool=pool).equal is False
    assert answers_equal("-5", "5", pool=pool).equal is False
    assert answers_equal(None, "5", pool=pool).equal is False
    assert answers_equal("", "5", pool=pool).method == "empty"


def _in_thread(fn):
    out = {}

    def run():
        t0 = time.perf_counter()
        out["value"] = fn()
        out["elapsed"] = time.perf_counter() - t0

    th = threading.Thread(target=run)
    th.start()
    th.join(timeout=60)
    assert not th.is_alive()
    return out["value"], out["elapsed"]


def test_hard_time_limit_holds_in_a_thread_even_if_the_checker_ignores_signals():
    """A worker stuck where no signal reaches it (C code) is killed at the deadline, from a non-main thread."""
    hang = (
        "import json, signal, time; signal.signal(signal.SIGALRM, signal.SIG_IGN); "
        "print(json.dumps({'ready': True}), flush=True); time.sleep(600)"
    )
    stuck = MathVerifyPool(max_workers=1, worker_command=[sys.executable, "-c", hang], wall_factor=1.0, wall_margin_s=0.5)
    clear_verdict_cache()
    try:  # the wall-clock backstop: 1.0 * timeout_s + 0.5 s
        verdict, elapsed = _in_thread(lambda: answers_equal("(1,2)", "[1,2]", timeout_s=1.0, pool=stuck))
        assert verdict.equal is None and verdict.method == "timeout"
        assert 1.4 < elapsed < 4.0
        assert stuck.kills == 1 and not stuck._all  # the stuck worker is gone
    finally:
        stuck.close()


def test_pathological_latex_in_a_thread_is_bounded(pool):
    clear_verdict_cache()
    verdict, elapsed = _in_thread(lambda: answers_equal(r"(10^{6})!", "1", timeout_s=1.0, pool=pool))
    assert verdict.equal is not True and verdict.method in ("timeout", "math_verify")
    # a hang guard, not a speed target: the worker's CPU budget is 1 s and the wall-clock backstop 3x + 1 s on an
    # idle machine, but on a loaded machine wall time stretches (the budget is CPU time)
    assert elapsed < 30.0
    # the pool still answers afterwards (a killed worker is replaced)
    assert answers_equal(r"(x+1)^2", r"x^2+2x+1", timeout_s=60.0, pool=pool).equal is True


def test_many_threads_queue_for_few_workers_without_spurious_timeouts():
    """8 threads, 1 worker, distinct symbolic pairs: waiting for the worker does not eat the check's limit."""
    clear_verdict_cache()
    one = MathVerifyPool(max_workers=1)
    cases = [(f"x^2+{2 * k}x+{k * k}", f"(x+{k})^2", True) for k in range(1, 5)]
    cases += [(f"x^2+{k}", f"(x+{k})^2", False) for k in range(1, 5)]
    out = [None] * len(cases)

    def run(i, p, g):
        out[i] = answers_equal(p, g, timeout_s=3.0, pool=one)

    try:
        ths = [threading.Thread(target=run, args=(i, p, g)) for i, (p, g, _) in enumerate(cases)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=120)
        assert [v.equal for v in out] == [e for _, _, e in cases]
        assert {v.method for v in out} == {"math_verify"} and one.kills == 0
    finally:
        one.close()


def test_reflection_counts():
    c = count_reflections("Wait, let me verify. Hmm, but I double-checked; however, alternatively re-examine. Waiting")
    assert c["wait"] == 1 and c["verify"] == 1 and c["check"] == 1 and c["however"] == 1
    assert c["alternatively"] == 1 and c["hmm"] == 1 and c["but"] == 1 and c["reconsider"] == 1
    assert c["total"] == 8
    assert count_reflections("")["total"] == 0


def test_a_worker_that_cannot_start_gives_an_undecided_verdict_not_a_crash():
    broken = MathVerifyPool(max_workers=1, worker_command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    clear_verdict_cache()
    try:
        t0 = time.perf_counter()
        v = answers_equal("(1,2)", "[1,2]", timeout_s=5.0, pool=broken)
        assert (v.equal, v.method) == (None, "error")
        assert time.perf_counter() - t0 < 30.0 and not broken._all  # a hang guard: the 5 s timeout is not waited
        # fast paths never need a worker
        assert answers_equal(r"\dfrac{1}{2}", "0.5", pool=broken).equal is True
    finally:
        broken.close()


def test_definite_math_verify_verdicts_are_remembered(pool):
    clear_verdict_cache()
    assert answers_equal(r"(x+1)^{3}", r"x^3+3x^2+3x+1", pool=pool).equal is True
    stuck = MathVerifyPool(max_workers=1, worker_command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    try:  # the same pair again needs no worker
        assert answers_equal(r"(x+1)^{3}", r"x^3+3x^2+3x+1", pool=stuck) == Verdict(True, "math_verify")
    finally:
        stuck.close()


def test_clear_caches_forgets_every_memo():
    from envs.scoring import clear_caches
    from envs.scoring import normalize as N
    from envs.scoring import reflection as R

    clear_caches()
    assert normalize_answer("\\frac{1}{2}") == normalize_answer("\\frac{1}{2}")
    assert evaluate("3/4") == evaluate("3/4")
    assert count_reflections("Wait, let me verify.")["total"] == 2
    assert N._normalize_cached.cache_info().currsize >= 1 and evaluate.cache_info().currsize >= 1
    assert R._FORM_CACHE["wait"] == "wait"
    clear_caches()
    assert N._normalize_cached.cache_info().currsize == 0 and evaluate.cache_info().currsize == 0
    assert R._FORM_CACHE == {}
