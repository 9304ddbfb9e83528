"""The chain-of-thought families of the jobs (``SHORTCOT``, ``LONGCOT``): task table and demonstrations (no tool).

The problems are reasoning-gym ``chain_sum`` questions with 3-4 one-digit terms joined by ``+`` only
(``COT_TASKS``; the tiny model has no tool and must learn the addition facts). A
demonstration adds the terms one at a time, writing each running sum, in an order drawn uniformly at random
per demonstration: addition commutes, so every order is a correct solution, and the policy has genuine
freedom at a few decision tokens (which term comes next). That is the setting where plain GRPO can collapse
the entropy of those decisions and STARE should keep it.

Short CoT (family ``shortcot`` of ``envs.reward.compute_score``)::

    4 + 7 = 11, 11 + 3 = 14. \\boxed{14}

Long CoT (family ``longcot``: the answer counts only after a closed ``</think>``)::

    <think>
    Terms: 4, 7, 3.
    4 + 7 = 11
    11 + 3 = 14
    Check in another order:
    3 + 4 = 7
    7 + 7 = 14
    Both give 14.
    </think>
    The sum is \\boxed{14}.

The check adds the terms again in a second order drawn uniformly among the orders that differ from the first.
Every demonstration is scored with ``envs.reward.compute_score`` under its family and kept only when it
scores as correct against the generator's answer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import permutations
from typing import Any

from envs.cot import LONG_COT_FAMILY, SHORT_COT_FAMILY
from envs.family import EnvFamily
from stare_verl.jobs.families.base import JobFamily, PretrainedTask, Problem

__all__ = [
    "COT_DEMOS_PER_PROBLEM",
    "COT_TASKS",
    "LONGCOT",
    "SHORTCOT",
    "CotDemo",
    "CotDemonstrations",
    "cot_text",
    "sample_order",
    "terms_of",
]

# reasoning-gym ``chain_sum`` questions with 3-4 one-digit terms, kept only when every operator is ``+``
# (``addition_only``: the tiny model has no tool, so it must learn the addition facts itself; addition commutes,
# so the order of the terms is free in a solution).
COT_TASKS: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 1},
}
_ADDITION_ONLY = re.compile(r"\d+(?: \+ \d+)+")


def addition_only(expression: str) -> bool:
    """Whether ``expression`` is a sum of non-negative integers (``"4 + 7 + 3"``)."""
    return _ADDITION_ONLY.fullmatch(expression) is not None

# SFT demonstrations per problem (each with its own sampled order): ``SFTConfig.n_train`` demonstrations come
# from ``n_train // COT_DEMOS_PER_PROBLEM`` problems, which keeps the one-digit question pool (1,000 sums of
# three terms) from running dry before the RL split is drawn.
COT_DEMOS_PER_PROBLEM = 4


def terms_of(problem: Problem) -> list[int]:
    """The terms of a ``+``-only expression (``"4 + 7 + 3"`` -> ``[4, 7, 3]``).

    Raises:
        ValueError: the expression holds anything but non-negative integers joined by ``+``.
    """
    parts = [t.strip() for t in problem.expression.split("+")]
    if len(parts) < 2 or not all(t.isdigit() for t in parts):
        raise ValueError(f"not a sum of non-negative integers: {problem.expression!r}")
    return [int(t) for t in parts]


def sample_order(n: int, rng: random.Random, avoid: Sequence[int] | None = None) -> tuple[int, ...]:
    """A uniformly random order of ``range(n)``; with ``avoid``, uniform among the orders other than it."""
    orders = [o for o in permutations(range(n)) if avoid is None or list(o) != list(avoid)]
    return orders[rng.randrange(len(orders))]


def _running(terms: Sequence[int], order: Sequence[int]) -> list[str]:
    """``["a + b = s1", "s1 + c = s2", ...]`` adding ``terms`` in ``order``."""
    total = terms[order[0]]
    lines = []
    for i in order[1:]:
        lines.append(f"{total} + {terms[i]} = {total + terms[i]}")
        total += terms[i]
    return lines


def cot_text(
    terms: Sequence[int], order: Sequence[int], long: bool, check_order: Sequence[int] | None = None
) -> str:
    """The assistant text of one demonstration (without ``<|im_end|>``); see the module docstring.

    Args:
        terms: the terms as written in the question.
        order: the order in which they are added (a permutation of ``range(len(terms))``).
        long: the long-CoT form (think block with a check pass); ``check_order`` is then required.
        check_order: the order of the check pass.
    Raises:
        ValueError: an order that is not a permutation, or ``long`` without ``check_order``.
    """
    for o in (order, check_order) if long else (order,):
        if o is None or sorted(o) != list(range(len(terms))):
            raise ValueError(f"not an order of {len(terms)} terms: {o}")
    total = sum(terms)
    if not long:
        return ", ".join(_running(terms, order)) + f". \\boxed{{{total}}}"
    lines = [
        "<think>",
        "Terms: " + ", ".join(str(t) for t in terms) + ".",
        *_running(terms, order),
        "Check in another order:",
        *_running(terms, check_order),
        f"Both give {total}.",
        "</think>",
        f"The sum is \\boxed{{{total}}}.",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class CotDemo:
    """A problem and one chain-of-thought solution of it (single turn, no tool).

    Attributes:
        problem: the problem.
        text: the assistant's whole answer, as the model must generate it (without ``<|im_end|>``).
        order: the order in which the solution adds the terms (indices into the question's terms).
    """

    problem: Problem
    text: str
    order: tuple[int, ...]

    @property
    def tools(self) -> None:
        """No tool list (the chat template's ``tools=None``)."""
        return None

    def prompt(self) -> list[dict[str, str]]:
        """The chat messages the model is prompted with (the question alone, as in the RL rows)."""
        return [{"role": "user", "content": self.problem.question}]

    def messages(self) -> list[dict[str, Any]]:
        """The whole episode as chat messages (prompt, answer)."""
        return [*self.prompt(), {"role": "assistant", "content": self.text}]

    def assistant_texts(self) -> list[str]:
        """The text of the one model turn (without ``<|im_end|>``)."""
        return [self.text]


@dataclass(frozen=True)
class CotDemonstrations:
    """``JobFamily.demonstrations`` of a chain-of-thought family: ``per_problem`` demonstrations per problem, each
    with its own sampled order, checked by the family's reward.

    Attributes:
        env: the environment family whose reward checks each demonstration (short or long CoT).
        long: the long-CoT form (think block with a check pass).
    """

    env: EnvFamily
    long: bool = False

    def __call__(
        self, problems: Sequence[Problem], seed: int = 0, per_problem: int = 1
    ) -> tuple[list[CotDemo], list[Problem]]:
        """``(demos, rejected)``: a problem is rejected when its expression is not a sum of non-negative
        integers, or when a demonstration does not score as correct against the problem's answer.
        Raises ValueError for ``per_problem < 1``."""
        if per_problem < 1:
            raise ValueError(f"per_problem must be >= 1, got {per_problem}")
        reward = self.env
        rng = random.Random(seed)
        demos: list[CotDemo] = []
        rejected: list[Problem] = []
        for p in problems:
            try:
                terms = terms_of(p)
            except ValueError:
                rejected.append(p)
                continue
            mine = []
            for _ in range(per_problem):
                order = sample_order(len(terms), rng)
                check = sample_order(len(terms), rng, avoid=order) if self.long else None
                text = cot_text(terms, order, self.long, check)
                res = reward.compute_score(p.data_source, text, p.answer, {"family": reward.name, "hit_eos": True})
                if not res["acc"]:
                    break
                mine.append(CotDemo(p, text, order))
            if len(mine) == per_problem:
                demos.extend(mine)
            else:
                rejected.append(p)
        return demos, rejected


# CoT SFT defaults (stare_verl.jobs.demo.sft's docstring): steps where held-out greedy accuracy passes ~0.5 on the
# 2-core machine; max_response_tokens: the family's CPU recipe's data.max_response_length.
# The pretrained model's short CoT task (``--model``): chain_sum with two or three one-digit terms, ``+`` and ``-``,
# the question alone as the prompt (the model's own chat template and system prompt), scored on the last number of
# the answer when there is no box: SmolLM2-135M-Instruct answers in prose and writes a box only when taught one.
# Splits are disjoint by expression (a sum asked in another wording is the same problem).
PRETRAINED_COT_TASKS: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
}
SHORTCOT_PRETRAINED = PretrainedTask(
    task_table=PRETRAINED_COT_TASKS, reward_options={"last_number": True}, recipe="shortcot_real",
)

SHORTCOT = JobFamily(
    env=SHORT_COT_FAMILY,
    task_table=COT_TASKS,
    demonstrations=CotDemonstrations(SHORT_COT_FAMILY),
    accepts=addition_only,
    demos_per_problem=COT_DEMOS_PER_PROBLEM,
    sft_defaults={"steps": 1000, "max_response_tokens": 48},
    min_sft_accuracy=0.4,
    gpu_recipe="shortcot_qwen2.5-math-7b",
    # the STARE-effect comparison (docs/results/shortcot-stare-vs-grpo.md): the entropy of GRPO-ds and STARE
    # separate only after ~50 steps; 100-step runs take 7-9.6 minutes each on 2 cores, so two seeds per method fit
    # the comparison's 40 minutes (33 measured) and three take 47
    compare_steps=100,
    compare_seeds=(0, 1),
    pretrained=SHORTCOT_PRETRAINED,
)
LONGCOT = JobFamily(
    env=LONG_COT_FAMILY,
    task_table=COT_TASKS,
    demonstrations=CotDemonstrations(LONG_COT_FAMILY, long=True),
    accepts=addition_only,
    demos_per_problem=COT_DEMOS_PER_PROBLEM,
    sft_defaults={"steps": 800, "max_response_tokens": 128},
    min_sft_accuracy=0.4,
    gpu_recipe="longcot_r1-distill-qwen-1.5b",
)
