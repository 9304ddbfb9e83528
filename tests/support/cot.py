"""The chain-of-thought demonstrations of the ``shortcot`` and ``longcot`` families under one name, for the tests
(they live with the families: ``stare_verl.jobs.families.cot``), and :func:`build_cot_demos` by family name."""

from __future__ import annotations

from collections.abc import Sequence

from stare_verl.jobs.families import job_family
from stare_verl.jobs.families.base import Problem
from stare_verl.jobs.families.cot import (
    COT_DEMOS_PER_PROBLEM,
    COT_TASKS,
    CotDemo,
    CotDemonstrations,
    cot_text,
    sample_order,
    terms_of,
)

__all__ = [
    "COT_DEMOS_PER_PROBLEM",
    "COT_TASKS",
    "CotDemo",
    "build_cot_demos",
    "cot_text",
    "sample_order",
    "terms_of",
]


def build_cot_demos(
    problems: Sequence[Problem], family: str, seed: int = 0, per_problem: int = 1
) -> tuple[list[CotDemo], list[Problem]]:
    """``per_problem`` demonstrations per problem, each with its own sampled order, checked by our scorer.

    Args:
        problems: ``+``-only problems (``sample_problems(..., family=family)``).
        family: a chain-of-thought job family (``shortcot`` or ``longcot``).
        seed: seed of the order sampling (deterministic for given problems, family and seed).
        per_problem: demonstrations per problem (>= 1).
    Returns:
        ``(demos, rejected)``: a problem is rejected when its expression is not a sum of non-negative
        integers, or when a demonstration does not score as correct against the problem's answer with
        ``envs.reward.compute_score`` (the family's).
    Raises:
        ValueError: unknown or not a chain-of-thought family, or ``per_problem < 1``.
    """
    build = job_family(family).demonstrations
    if not isinstance(build, CotDemonstrations):
        raise ValueError(f"not a chain-of-thought family: {family!r}")
    return build(problems, seed=seed, per_problem=per_problem)

