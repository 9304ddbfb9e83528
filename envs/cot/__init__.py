"""The CoT families (``short_cot``, ``long_cot``): their descriptors, over the shared pieces.

Rows come from ``envs.datasets`` (``--family short_cot|long_cot``, prompts in ``envs.prompts``), scored by
``envs.reward.compute_score`` (``reward_kwargs.family``; long CoT requires the ``<think>`` block), with verl's
``single_turn_agent``. ``SHORT_COT_FAMILY`` / ``LONG_COT_FAMILY`` (``envs.family.EnvFamily``) say so to the jobs.
"""

from __future__ import annotations

from envs.contract import LONG_COT, SHORT_COT
from envs.family import EnvFamily

__all__ = ["COT_AGENT_NAME", "LONG_COT_FAMILY", "SHORT_COT_FAMILY"]

COT_AGENT_NAME = "single_turn_agent"  # verl's own single-turn agent loop (no tool)

SHORT_COT_FAMILY = EnvFamily(name=SHORT_COT, agent_name=COT_AGENT_NAME, reward_module="envs.reward")
LONG_COT_FAMILY = EnvFamily(name=LONG_COT, agent_name=COT_AGENT_NAME, reward_module="envs.reward")
