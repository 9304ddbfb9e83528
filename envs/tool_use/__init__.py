"""The tool-use family: multi-turn Python tool use over the shared sandbox, tools, scoring and datasets.

- ``TOOL_USE_FAMILY`` (``envs.family.EnvFamily``): its names, agent loop, reward entry, tool, system prompt
  (``TOOL_USE_SYSTEM``), offline task mix and row builder, for the datasets and the jobs.
- ``agent_loop``: verl's agent loop ``stare_tool_agent`` (registered by ``envs.plugin``).
- ``task``: the dataset rows (``python -m envs.tool_use.task ...``) and the reward ``compute_score``.
- ``sft_data``: cold-start SFT data in the same chat format.
"""

from __future__ import annotations

from envs.contract import AGENT_NAME, TOOL_USE
from envs.family import EnvFamily
from envs.tools.schema import TOOL_NAME

__all__ = ["TOOL_USE_FAMILY", "TOOL_USE_SYSTEM"]

TOOL_USE_SYSTEM = (
    "You are a careful mathematician with a Python interpreter. You may call the `code_interpreter` tool "
    "to run Python code whenever computation helps; its printed output is returned to you. "
    "When you are done, put your final answer within \\boxed{}."
)
"""The system message of every tool-use row and SFT conversation, in every model style (the tool schema itself is
added by the chat template from the tool config)."""

TOOL_USE_FAMILY = EnvFamily(
    name=TOOL_USE, agent_name=AGENT_NAME, reward_module="envs.tool_use.task", tool_name=TOOL_NAME,
    system_prompt=TOOL_USE_SYSTEM, aliases=("tool_use",),
    # the offline set of ``envs.datasets`` (``envs.tool_use.task``'s own offline rows are its OFFLINE_TOOL_TASKS)
    offline_tasks=(
        ("count_primes", {}),
        ("products", {"min_terms": 2, "max_terms": 3, "min_digits": 4, "max_digits": 6}),
        ("lcm", {"min_numbers": 3, "max_numbers": 5, "max_value": 10000}),
        ("gcd", {"min_numbers": 2, "max_numbers": 4, "max_value": 1000000}),
        ("dice", {}),
    ),
)
