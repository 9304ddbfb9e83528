"""Issue 31, items 1-4: false positives of the scorer (each a reward hack). A hedge scores only when every value it
offers is the answer; variable names must agree; a command written with parentheses is read as the command,
never as the number before it; letter units give way to the ground truth's variables; bold choice letters score.
Each kind is tested with several members, in both directions (what must score 0 and what must still score 1)."""

from __future__ import annotations

import pytest

from envs.reward import compute_score
from envs.scoring import answers_equal, normalize_answer
from envs.scoring.offers import offers


@pytest.fixture(scope="module", autouse=True)
def _close_workers():
    yield
    from envs.scoring import get_pool

    get_pool().close()


def _eq(pred, gold):
    return answers_equal(pred, gold, timeout_s=10.0)


# ------------------------------------------------------------------ item 1: a hedge is not an answer

HEDGES = [
    r"5 = 7",  # the example
    r"x = 5 = 7",
    r"5 \to 7",
    r"5 \rightarrow 7",
    r"5 \Rightarrow 7",
    r"5 \implies 7",
    r"5 \longrightarrow 7",
    r"5 -> 7",
    r"5 \approx 7",
    r"5 \equiv 7",
    r"5 \iff 7",
    r"5 \Leftrightarrow 7",
    r"5 \mapsto 7",
    r"5 \mid 7",
    r"5 \lor 7",
    r"5 \vee 7",
    r"5 \text{ or } 7",
    r"5 \text{ else } 7",
    r"either 5 or 7",
    r"5 (\text{or } 7)",  # parenthesised alternatives
    r"5 \text{ (or 7)}",
    r"5\ (\text{or}\ 7)",
    r"5 \text{ or maybe } 7",
    r"x = 5 \text{ or } x = 7",
]


@pytest.mark.parametrize("pred", HEDGES)
def test_a_hedge_scores_as_neither_side(pred):
    for gold in ("7", "5"):  # neither the last side nor the first
        v = _eq(pred, gold)
        assert v.equal is False, (pred, gold, v)
    assert compute_score("x", rf"\boxed{{{pred}}}", "7", timeout_s=10.0)["acc"] is False


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"\frac{10}{2} = 5", "5"),  # every value is the answer: not a hedge
        (r"2 + 3 = 5", "5"),
        (r"7 = 7", "7"),
        (r"x = 7 = 7.0", "7"),
        (r"\frac{1}{2} \text{ or equivalently } 0.5", r"\frac12"),
        (r"x = 5 \text{ or } x = 7", "5, 7"),  # alternatives against a list ground truth: that list
        (r"x = 5 \text{ or } x = 7", r"\{5, 7\}"),
        (r"y = 2x + 3", "2x+3"),  # a label, not a value
        (r"f(x) = 2x + 3", "2x+3"),
        (r"x + y = 5", "5"),  # the question restated against a number
        (r"x^2 + y^2 = 1", "x^2+y^2=1"),  # a ground truth that is itself a relation is compared as written
    ],
)
def test_chains_whose_every_value_is_the_answer_still_score(pred, gold):
    assert _eq(pred, gold).equal is True, (pred, gold)


def test_offers_reads_values_and_leaves_lists_and_inequalities_alone():
    o = offers(r"x = 5 = 7")
    assert o.labels == frozenset({"x"}) and o.values == ("5", "7") and not o.alternatives
    o = offers(r"5 \text{ (or 7)}")
    assert o.values == ("5", "7") and o.alternatives
    assert offers("x=2, y=3") is None  # a list
    assert offers(r"x > 2 \text{ or } x < -1") is None  # inequalities: math-verify's
    assert offers("42") is None and offers("color") is None  # "or" inside a word is no alternative
    assert _eq(r"x > 2 \text{ or } x < -1", r"(-\infty,-1)\cup(2,\infty)").method == "math_verify"


def test_arrows_survive_normalisation():
    """\\right and \\left go, never the start of \\rightarrow / \\leftarrow (which became the letters "arrow")."""
    assert normalize_answer(r"5 \rightarrow 7") == r"5\rightarrow7"
    assert normalize_answer(r"a \leftrightarrow b") == r"a\leftrightarrow b"
    assert normalize_answer(r"\left(1, 2\right)") == "(1,2)"


# ------------------------------------------------------------------ item 2: labels must agree


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"x = -\frac{1}{32}", r"y = -\frac{1}{32}"),  # the example
        (r"\alpha = 3", r"\beta = 3"),  # Greek letters
        (r"x_1 = 3", r"x_2 = 3"),  # subscripts
        (r"a_{n} = 3", r"a_{m} = 3"),
        (r"X = 3", r"x = 3"),  # case matters
        (r"f(x) = 3", r"g(x) = 3"),
        (r"y = 5 \text{ or } y = 7", r"x = 5"),
    ],
)
def test_different_variable_names_do_not_score(pred, gold):
    v = _eq(pred, gold)
    assert v.equal is False and v.method in ("label", "hedge"), (pred, gold, v)


@pytest.mark.parametrize(
    "pred, gold",
    [
        (r"-\frac{1}{32}", r"x = -\frac{1}{32}"),  # one side bare: still scores
        (r"x = -\frac{1}{32}", r"-\frac{1}{32}"),
        (r"a_{n} = 3", r"a_n = 3"),  # one name, two spellings
        (r"\alpha=3", r"\alpha = 3"),
        (r"x = 3", r"x = 3.0"),
    ],
)
def test_the_same_name_or_a_bare_side_scores(pred, gold):
    assert _eq(pred, gold).equal is True, (pred, gold)


# ------------------------------------------------------------------ item 3: malformed function syntax


@pytest.mark.parametrize(
    "pred, gold, equal",
    [
        (r"2\sqrt(3)", "2", False),  # the example: not the 2 in front
        (r"2\sqrt(3)", r"2\sqrt{3}", True),  # read as the command
        (r"\sqrt(3)", r"\sqrt{3}", True),
        (r"\sqrt[3](8)", "2", True),
        (r"\frac(1)(2)", "1", False),
        (r"\frac(1)(2)", "0.5", True),
        (r"\frac{1}(2)", r"\frac12", True),
        (r"\frac(3){4}", "0.75", True),
        (r"2\binom(4)(2)", "2", False),
        (r"\binom(4)(2)", "6", True),
        (r"2\sqrt(3", "2", False),  # unbalanced: no answer at all
        (r"2\frac(1)(2", "2", False),
    ],
)
def test_commands_with_parentheses_are_the_command_never_the_number_before(pred, gold, equal):
    v = _eq(pred, gold)
    assert v.equal is equal, (pred, gold, v)


def test_unbalanced_command_is_malformed():
    assert _eq(r"2\sqrt(3", "2").method == "malformed"
    assert normalize_answer(r"\frac(1)(2)") == r"\frac{1}{2}" and normalize_answer(r"\sqrt[3](8)") == r"\sqrt[3]{8}"
    assert normalize_answer(r"\frac{1}{2}(3)") == r"\frac{1}{2}(3)"  # braces already: a product, untouched


# ------------------------------------------------------------------ item 4: letter units, bold choice letters


@pytest.mark.parametrize(
    "pred, gold, equal",
    [
        ("2m", "2", True),  # no variable m in the ground truth: a unit (metres)
        ("7g", "7", True),
        ("2in", "2", True),
        ("2 m^2", "2", True),
        ("2", "2m", False),  # the ground truth has a variable m: no unit
        ("7", "7g", False),
        ("2", "2in", False),
        ("2m", "2m", True),
        ("2 m", "2m", True),
        (r"m \cdot 2", "2m", True),
        ("3m", "m+2", False),
        ("5", r"5 \text{ cm}", True),  # word units are units as before
        ("5 cm", "5", True),
    ],
)
def test_letter_units_give_way_to_the_ground_truths_variables(pred, gold, equal):
    v = _eq(pred, gold)
    assert v.equal is equal, (pred, gold, v)


@pytest.mark.parametrize(
    "pred",
    [
        r"\textbf{(B) } 5",  # the example
        r"\textbf{(B)} 5",
        r"\mathbf{(B)}\ 5",
        r"\text{(B) } 5",
        r"(B) 5",
        r"**(B)** 5",
        r"\textbf{B.} 5",
        r"B) 5",
    ],
)
def test_bold_choice_letters_score(pred):
    assert _eq(pred, "B").equal is True, pred
    assert _eq(pred, "(B)").equal is True, pred
    assert _eq(pred, "C").equal is False, pred
    assert compute_score("x", rf"\boxed{{{pred}}}", "B", timeout_s=10.0)["acc"] is True


def test_two_choices_are_no_choice():
    assert _eq(r"(B) 5 (C) 6", "B").equal is False
    assert _eq(r"\textbf{(B)} \text{ or } \textbf{(C)}", "B").equal is False
