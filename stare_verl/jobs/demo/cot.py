"""The chain-of-thought demonstrations of the ``shortcot`` and ``longcot`` families, as the demo pipeline imports
them (they live with the families: ``stare_verl.jobs.families.cot``)."""

from __future__ import annotations

from stare_verl.jobs.families.cot import (
    COT_DEMOS_PER_PROBLEM,
    COT_TASKS,
    CotDemo,
    build_cot_demos,
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
