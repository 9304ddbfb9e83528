"""The tool-use family: multi-turn Python tool use over the shared sandbox, tools, scoring and datasets.

- ``agent_loop``: verl's agent loop ``stare_tool_agent`` (registered by ``envs.plugin``).
- ``task``: the dataset rows (``python -m envs.tool_use.task``) and the reward ``compute_score``.
- ``sft_data``: cold-start SFT data in the same chat format.
"""
