"""Four kinds of scorer fault, each tested through several members plus controls that must stay wrong:

1. an operator's bounds read as an assignment (``\\sum_{k=1}^{n} k^2`` taken for ``1}^{n}k^2``);
2. ellipsis lists and chains compared as numbers;
3. notations models write that the scorer did not read (repeating decimals, full-width punctuation, degrees inside
   trigonometric functions);
4. multi-part answers (a solution set with a tuple label and "and", parts boxed apart, a ground truth of several
   boxes, exactly k boxes in prose for k parts, Minerva's "The final answer is $X$" after a box, ``16,\\!386.20``).
"""

from __future__ import annotations

import pytest

from envs.reward import compute_score
from envs.scoring import normalize_answer
from envs.scoring.extract import extract_final_answer, last_boxes
from envs.scoring.normalize import read_notations


@pytest.fixture(scope="module", autouse=True)
def _close_scorer_workers():
    yield
    from envs.scoring import get_pool

    get_pool().close()


def _acc(pred: str, gold: str) -> bool:
    return compute_score(solution_str=f"So the answer is \\boxed{{{pred}}}.", ground_truth=gold)["acc"]


# ------------------------------------------------------------------ kind 1: an operator's bounds are no assignment


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"\sum_{k=1}^{n} k^2", "1"),
        (r"\sum_{k=1}^{n} k", "1"),
        (r"\prod_{i=1}^{n} i", "1"),
        (r"\int_{x=0}^{1} x\,dx", "0"),
        (r"\lim_{n=1} 5", "5"),
        (r"\max_{i=1} a_i", "1"),
        (r"\min_{j=2}^{5} b_j", "2"),
        (r"\bigcup_{i=1}^{n} A_i", "1"),
        (r"\sum\limits_{k=0}^{n} \binom{n}{k}", "0"),
        # an index bound in any script, whatever the operator is spelled as
        (r"\operatorname*{argmax}_{x=0} f(x)", "0"),
        (r"\operatorname{argmax}_{x=0} f(x)", "0"),
        (r"\operatorname{arg\,max}_{x=0} f(x)", "0"),
        (r"\mathop{\mathrm{argmax}}_{x=0} f(x)", "0"),
        (r"\mathop{\rm argmax}_{x=1} g(x)", "1"),
        (r"\underset{x=3}{\operatorname{argmin}} f(x)", "3"),
        (r"\underset{n=1}{\overset{5}{\sum}} n", "1"),
        (r"\overset{n=1}{\sum} a_n", "1"),
        (r"\mathop{\sum}_{k=1}^n k", "1"),
        (r"\mathop{\max}_{i=2} a_i", "2"),
        (r"\sum_{{k=1}}^{n} k", "1"),
        (r"\sum_{\substack{k=1\\k\ne 3}}^{n} k", "1"),
        (r"\lim_{\substack{x=0}} f(x)", "0"),
        (r"\stackrel{x=1}{=} 2", "1"),
        (r"\stackrel{n=2}{\longrightarrow} 4", "2"),
        (r"\Sigma_{k=1}^n k", "1"),  # a sum written with the Greek letter
        (r"\bigcup\limits_{i=1}^n A_i", "1"),
    ],
)
def test_operator_bounds_are_no_assignment(pred, gold):
    assert not _acc(pred, gold)


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"\sum_{k=1}^{n} k^2", r"\sum_{k=1}^{n}k^2"),  # kept whole, never 1}^{n}k^2
        (r"\prod_{i=1}^{n} i", r"\prod_{i=1}^{n}i"),
        ("x = 5", "5"),
        ("x_1 = 5", "5"),
        ("x_{12} = 5", "5"),
        (r"\alpha = 3", "3"),
        ("(x, y) = (1, 2)", "(1,2)"),
        ("f' = 3", "3"),
    ],
)
def test_assignment_left_side_is_a_name(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"\sum_{k=1}^{n} k^2", r"\frac{n(n+1)(2n+1)}{6}"),  # equal as values: math-verify evaluates the sum
        (r"\sum_{k=0}^{5} 2", "12"),
        (r"\int_{0}^{1} x\,dx", r"\frac{1}{2}"),
        ("x_1 = 5", "5"),
        (r"\alpha = 3", "3"),
        # typography of an operator changes nothing
        (r"\sum\limits_{k=1}^{10} k", "55"),
        (r"\sum_{k=1}^{10} k", "55"),
        (r"\sum\nolimits_{k=1}^{10} k", "55"),
        (r"\displaystyle\sum\limits_{k=1}^{4} k", "10"),
        (r"\textstyle\prod_{j=2}^{3} j", "6"),
        (r"\prod\limits_{i=1}^{4} i", "24"),
        (r"\mathop{\prod}_{i=1}^{4} i", "24"),
        (r"\sum_{{k=1}}^{4} k", "10"),
        # controls: names with subscripts and relations outside scripts
        ("x_{n} = 3", "3"),
        ("a_{1}=7", "7"),
        (r"\sum_{k=1}^{3}k = 6", "6"),
        (r"n=\sum_{k=1}^{3} k", "6"),
    ],
)
def test_operators_and_assignments_still_score(pred, gold):
    assert _acc(pred, gold)


# ------------------------------------------------------------------ kind 2: ellipses are never numbers


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"1, 3, 5, \ldots, 2n-1", r"1, 2, \ldots, n"),
        (r"1, 3, 5, \dots, 2n-1", r"1, 2, \dots, n"),
        (r"1, 2, \cdots, n", r"1, 3, \cdots, 2n-1"),
        ("1, 2, ..., n", "1, 3, ..., 2n-1"),
        ("1, 2, …, n", "1, 3, …, 2n-1"),
        (r"1 + 2 + \cdots + n", r"1 + 3 + \cdots + (2n-1)"),
        (r"a_1 < a_2 < \cdots < a_n", r"a_1 > a_2 > \cdots > a_n"),
        (r"1, 2, 3, \ldots", "1, 2, 3"),  # one side has no ellipsis
        (r"2, 4, \ldots, 2n", r"2, 4, 6, \ldots, 2n"),  # another number of terms
    ],
)
def test_ellipsis_answers_are_not_read_as_numbers(pred, gold):
    assert not _acc(pred, gold)


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"1, 2, \ldots, n", r"1,2,\dots,n"),
        ("1, 2, ..., n", r"1, 2, \cdots, n"),
        ("1, 2, …, n", r"1, 2, \ldots, n"),
        (r"\frac{1}{2}, \frac{1}{4}, \ldots", r"0.5, 0.25, \dots"),  # term by term
        (r"1+2+\cdots+n", r"1+2+\ldots+n"),
    ],
)
def test_equal_ellipsis_answers_score(pred, gold):
    assert _acc(pred, gold)


# ------------------------------------------------------------------ kind 3: notations models write


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"0.\overline{3}", r"\frac{1}{3}"),
        (r"0.1\overline{6}", r"\frac{1}{6}"),
        (r"0.\bar{3}", r"\frac{1}{3}"),
        ("0.(3)", r"\frac{1}{3}"),
        (r"0.\dot{3}", r"\frac{1}{3}"),
        (r"0.\dot{1}2\dot{3}", r"\frac{41}{333}"),
        (r"2.\overline{45}", r"\frac{27}{11}"),
        (r"0.\overline{9}", "1"),
        ("f(0.5)(3)", "f(0.5)(3)"),  # no repeating decimal
        ("１，２", "1, 2"),
        ("（１，２）", "(1, 2)"),
        ("３．５", "3.5"),
        ("－３", "-3"),
        ("１：２", "1:2"),
        ("1、2", "1, 2"),
        (r"\sin 30^\circ", r"\sin(\frac{30\pi}{180})"),
        (r"\cos(60°)", r"\cos(\frac{60\pi}{180})"),
        (r"\tan^2{45^{\circ}}", r"\tan^2(\frac{45\pi}{180})"),
        (r"\sin\left(30^\circ\right)", r"\sin(\frac{30\pi}{180})"),
        (r"\sin 30", r"\sin 30"),  # radians
        (r"\sin 30^{o}", r"\sin(\frac{30\pi}{180})"),
        (r"\tan 45^o", r"\tan(\frac{45\pi}{180})"),
        ("0.333...", r"\frac{1}{3}"),
        (r"0.3333\dots", r"\frac{1}{3}"),
        (r"0.1666\ldots", r"\frac{1}{6}"),
        ("0.1212…", r"\frac{4}{33}"),
        ("0.142857142857...", r"\frac{1}{7}"),
        (r"-0.333\ldots", r"-\frac{1}{3}"),
        (r"0.999\dots", "1"),
        ("3.14159...", "3.14159..."),  # no repetition: no number
        ("0.33...", "0.33..."),  # two digits are no repetition
        (r"0.1, 0.2, \ldots", r"0.1, 0.2, \ldots"),  # a list
        (r"0.\overline{" + "3" * 300 + "}", r"0.\overline{" + "3" * 300 + "}"),  # too long a period: as written
    ],
)
def test_read_notations(text, expected):
    assert read_notations(text) == expected


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"0.\overline{3}", r"\frac{1}{3}"),
        (r"0.1\overline{6}", r"\frac{1}{6}"),
        ("0.(3)", r"\frac{1}{3}"),
        (r"0.\dot{3}", r"\frac{1}{3}"),
        (r"0.\overline{12}", r"\frac{4}{33}"),
        (r"\frac{1}{3}", r"0.\overline{3}"),  # on the ground truth's side too
        ("１，２", "1, 2"),
        ("（1，2）", "(1, 2)"),
        ("－３", "-3"),
        ("3．5", "3.5"),
        ("1：2", "1:2"),
        (r"\sin 30^\circ", r"\frac{1}{2}"),
        (r"\cos(60°)", r"\frac{1}{2}"),
        (r"\tan 45^{\circ}", "1"),
        (r"\sin^2 45^\circ", r"\frac{1}{2}"),
        # trigonometric values that are exactly 0 (the checker once failed on them: 'not comparable')
        (r"\sin 180^\circ", "0"),
        (r"\cos 90^\circ", "0"),
        (r"\cos 90°", "0"),
        (r"\tan 180^\circ", "0"),
        (r"\cos 270^\circ", "0"),
        (r"\sin 360^\circ", "0"),
        (r"\cos 450^\circ", "0"),
        (r"\sin(-180^\circ)", "0"),
        (r"\tan 360°", "0"),
        (r"\sin 30^{o}", r"\frac12"),
        (r"\cos 60^{o}", r"\frac12"),
        (r"\tan 45^o", "1"),
        ("30^{o}", "30"),
        # repeating decimals written with an ellipsis
        ("0.333...", r"\frac13"),
        (r"0.3333\dots", r"\frac13"),
        (r"0.1666\ldots", r"\frac16"),
        ("0.142857142857...", r"\frac17"),
        ("2.4545…", r"\frac{27}{11}"),
        # digits in parentheses after decimal digits: the repeating decimal, or math-verify's product
        ("0.5(2)", "1"),
        ("1.5(3)", "4.5"),
        ("0.5(2)", r"\frac{47}{90}"),
        ("2.5(4)", "10"),
    ],
)
def test_notations_score(pred, gold):
    assert _acc(pred, gold)


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"0.\overline{3}", "0.3"),
        (r"0.\overline{3}", r"\frac{1}{4}"),
        (r"0.1\overline{6}", r"\frac{1}{5}"),
        ("１，２", "12"),  # a full-width comma separates items, never thousands
        ("（1，2）", "(2, 1)"),
        (r"\sin 30", r"\frac{1}{2}"),  # radians without a degree mark
        (r"\sin 30^\circ", r"\sin 30"),  # 30 degrees is not 30 radians
        (r"\sin 30^\circ", r"\frac{\sqrt{3}}{2}"),
        (r"\sin 180^\circ", "1"),
        (r"\tan 90^\circ", "0"),
        (r"\cos 60^{o}", "1"),
        ("3.14159...", r"\pi"),
        ("0.33...", r"\frac13"),
        (r"0.333\ldots", "0.333"),
        (r"0.1666\ldots", r"\frac15"),
        ("0.(3)", "0"),  # no decimal digits before the parentheses: only the repeating decimal
        # malformed notations are no answer
        (r"0.\overline{}", "0"),
        (r"0.\bar{}", "0"),
        (r"0.\dot{}", "0"),
        (r"0.\overline{a}", "0"),
        ("0.(", "0"),
        ("0.(33", r"\frac13"),
        (r"\sin 30^\circ^\circ", r"\frac12"),
        (r"\cos 60^\circ^\circ", r"\frac12"),
        (r"\sin 10^{100}^\circ", "0"),
        ("2^{3}^{2}", "64"),
    ],
)
def test_notation_controls_stay_wrong(pred, gold):
    assert not _acc(pred, gold)


def test_notations_get_a_verdict():
    """A checker failure is no answer and leaves the sample unverified: these once ended in ``verify_method=error``."""
    for pred, gold in [(r"\sin 180^\circ", "0"), (r"\tan 180^\circ", "0"), (r"0.\overline{" + "3" * 5000 + "}", "0")]:
        r = compute_score(solution_str=f"\\boxed{{{pred}}}", ground_truth=gold)
        assert not r["timed_out"] and r["verify_method"] not in ("error", "timeout"), (pred, r["verify_method"])


# ------------------------------------------------------------------ kind 4: multi-part answers


@pytest.mark.parametrize(
    "response, gold",
    [
        (r"\boxed{(x, y) = (5, 8) \quad \text{and} \quad (8, 5)}", "(5, 8), (8, 5)"),
        (r"\boxed{(5, 8) \text{ and } (8, 5)}", "(5, 8), (8, 5)"),
        (r"$\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 1)}$", "(3, 3), (1, 1)"),
        (r"\( y_1 = \boxed{-2(x - 1)^2 + 5} \) and \( y_2 = \boxed{3(x + 2)^2 - 2} \)",
         r"y_{1}=-2 x^{2}+4 x+3, y_{2}=3 x^{2}+12 x+10"),
        (r"\boxed{1,2}", r"\boxed{1} papers and \boxed{2} bins"),
        (r"\boxed{\$16,\!386.20}", "16386.20"),
        (r"the interest is $\boxed{255}$. Final Answer: The final answer is $10,455$. I hope it is correct.", "10455"),
        # exactly k boxes in prose for k parts, none withdrawn: the parts in order
        (r"Area is \boxed{2}, perimeter is \boxed{3}.", "2, 3"),
        (r"We get \boxed{2}; also \boxed{3}.", "2, 3"),
        (r"x is \boxed{2}. y is \boxed{3}.", "(2, 3)"),
        (r"$a=\boxed{1}$, $b=\boxed{2}$ and $c=\boxed{3}$", "1, 2, 3"),
        (r"$a=\boxed{1}$, $b=\boxed{2}$, and $c=\boxed{3}$", "1, 2, 3"),
        (r"The width is \boxed{4} cm. The height is \boxed{7} cm.", "4, 7"),
        (r"Part (a): \boxed{\frac12}. Part (b): \boxed{0.25}.", r"\frac12, \frac14"),
        (r"The mean is \boxed{5} and the median is \boxed{6}.", "(5, 6)"),
    ],
)  # fmt: skip
def test_multi_part_answers_score(response, gold):
    assert compute_score(solution_str=response, ground_truth=gold)["acc"]


@pytest.mark.parametrize(
    "response, gold",
    [
        (r"\boxed{(x, y) = (5, 8) \text{ and } (8, 6)}", "(5, 8), (8, 5)"),
        (r"\boxed{x = 5 \text{ and } y = 7}", "7"),
        (r"\boxed{1,2}", r"\boxed{1} no no no no no \boxed{2}"),  # prose without a connector: the last box only
        (r"\boxed{3} for part (a) and \boxed{1}", "5, 1"),
        (r"\boxed{1}. After much more work the first answer was wrong, so the answer is \boxed{2}", "1, 2"),
        (r"\boxed{1}. Wait, 1 is wrong and it is \boxed{2}", "1, 2"),  # a sentence ends between them
        (r"\boxed{5} and \boxed{7}", "5"),  # two values against one: a list
        (r"$\boxed{255}$. The final answer is $10,455$.", "255"),  # the restated final answer wins
        (r"First \boxed{2}. Later I realise it is \boxed{3}.", "2, 3"),  # a correction
        (r"\boxed{2} but not \boxed{3}", "2, 3"),
        (r"It is \boxed{2}. Actually, it is \boxed{3}.", "2, 3"),
        (r"Maybe \boxed{2}, hmm, \boxed{3}.", "2, 3"),
        (r"x is \boxed{3}. y is \boxed{2}.", "(2, 3)"),  # a tuple keeps its order
        (r"Area is \boxed{2}, perimeter is \boxed{4}.", "2, 3"),
        (r"We get \boxed{1}, then \boxed{2}, then \boxed{3}.", "2, 3"),  # three boxes for two parts
        (r"x is \boxed{2}.", "(2, 3)"),
    ],
)
def test_multi_part_controls_stay_wrong(response, gold):
    assert not compute_score(solution_str=response, ground_truth=gold)["acc"]


def test_last_boxes_takes_the_connected_run():
    text = r"first \boxed{9}. Much later, after a long detour: \boxed{(3, 3)} for part (a) and \boxed{(1, 1)}"
    assert last_boxes(text) == "(3, 3), (1, 1)"
    assert last_boxes(text, 2) == "(3, 3), (1, 1)"
    assert last_boxes(text, 1) == "(1, 1)"
    assert last_boxes(text, 3) is None  # the 9 is not connected
    assert last_boxes("no box", 1) is None
    assert extract_final_answer(text) == ("(1, 1)", "box")  # the plain extraction still takes the last run
