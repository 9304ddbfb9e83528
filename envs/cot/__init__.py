"""The CoT families (``shortcot``, ``longcot``): their descriptors, over the shared pieces.

Rows come from ``envs.datasets`` (``--family shortcot|longcot``, prompts in ``envs.prompts``), scored by
``envs.reward.compute_score`` (``reward_kwargs.family``; long CoT requires the ``<think>`` block: its ``think``
preset), with verl's ``single_turn_agent``. ``SHORT_COT_FAMILY`` / ``LONG_COT_FAMILY`` (``envs.family.EnvFamily``)
say so to the datasets, the reward and the jobs.
"""

from __future__ import annotations

from envs.contract import LONG_COT, SHORT_COT
from envs.family import EnvFamily

__all__ = ["COT_AGENT_NAME", "LONG_COT_FAMILY", "SHORT_COT_FAMILY"]

COT_AGENT_NAME = "single_turn_agent"  # verl's own single-turn agent loop (no tool)

# Offline sets (reasoning-gym task, config overrides): only tasks whose answers are numbers the scorer reads
# exactly (integers, fractions) and where any equivalent form is a right answer.
SHORT_COT_FAMILY = EnvFamily(
    name=SHORT_COT, agent_name=COT_AGENT_NAME, reward_module="envs.reward", aliases=("short_cot",),
    offline_tasks=(
        ("gsm_symbolic", {}),
        ("basic_arithmetic", {"min_terms": 2, "max_terms": 4, "max_digits": 2}),
        ("chain_sum", {"min_terms": 2, "max_terms": 5}),
        ("simple_equations", {}),
        ("lcm", {"max_value": 100}),
        ("gcd", {"max_value": 1000}),
        ("leg_counting", {}),
    ),
)
LONG_COT_FAMILY = EnvFamily(
    name=LONG_COT, agent_name=COT_AGENT_NAME, reward_module="envs.reward", aliases=("long_cot",), think="required",
    offline_tasks=(
        ("gsm_symbolic", {}),
        ("basic_arithmetic", {"min_terms": 4, "max_terms": 6, "max_digits": 3}),
        ("simple_equations", {"min_terms": 3, "max_terms": 4}),
        ("dice", {}),
        ("lcm", {"min_numbers": 3, "max_numbers": 4, "max_value": 200}),
        ("leg_counting", {"min_animals": 4, "max_animals": 8}),
    ),
)
