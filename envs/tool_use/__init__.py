"""The tool-use family: multi-turn Python tool use over the shared sandbox, tools, scoring and datasets.

- ``TOOL_USE_FAMILY`` (``envs.family.EnvFamily``): its names, agent loop, reward entry, tool, system prompt and
  row builder, for the jobs.
- ``agent_loop``: verl's agent loop ``stare_tool_agent`` (registered by ``envs.plugin``).
- ``task``: the dataset rows (``python -m envs.tool_use.task ...``) and the reward ``compute_score``.
- ``sft_data``: cold-start SFT data in the same chat format.
"""

from __future__ import annotations

from envs.contract import AGENT_NAME, TOOL_USE
from envs.family import EnvFamily
from envs.prompts import TOOL_USE_SYSTEM
from envs.tools.schema import TOOL_NAME

__all__ = ["TOOL_USE_FAMILY"]

TOOL_USE_FAMILY = EnvFamily(
    name=TOOL_USE, agent_name=AGENT_NAME, reward_module="envs.tool_use.task", tool_name=TOOL_NAME,
    system_prompt=TOOL_USE_SYSTEM,
)
