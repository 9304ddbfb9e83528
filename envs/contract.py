"""Names shared by the environments and everything that drives them, spelled once (no imports, verl-free).

- ``AGENT_NAME``: the verl agent loop of the tool-use family (``agent_name`` of a dataset row,
  ``actor_rollout_ref.rollout.agent.default_agent_loop`` of a recipe); registered by ``envs.plugin``.
- ``MODEL_TEXT_KEY``: the ``extra_info`` key under which the agent loop hands the model-generated text
  (response_mask == 1 tokens, tool calls removed) to the reward.
- ``FAMILIES``: the names of the built-in families, one spelling everywhere (``extra_info["family"]``,
  ``reward_kwargs.family``, ``--family``, recipe and run-folder names): ``shortcot``, ``longcot``, ``tooluse``. Each
  is described by an ``envs.family.EnvFamily`` (``envs.cot``, ``envs.tool_use``; registered in ``envs.families``),
  which also answers to the older data spelling (``short_cot``, ``long_cot``, ``tool_use``) that existing
  parquet rows and recipes carry, and by the ``stare_verl.jobs.families.JobFamily`` that holds it.
- ``END_OF_TURN_TOKENS``: token strings that end a model turn besides the tokenizer's EOS (a base model's
  tokenizer may name ``<|endoftext|>`` as EOS while its chat template ends turns with ``<|im_end|>``); the
  agent loop stops a turn and the reward manager decides "EOS hit" on them.
"""

from __future__ import annotations

__all__ = [
    "AGENT_NAME",
    "END_OF_TURN_TOKENS",
    "FAMILIES",
    "LONG_COT",
    "MODEL_TEXT_KEY",
    "SHORT_COT",
    "TOOL_USE",
]

AGENT_NAME = "stare_tool_agent"
MODEL_TEXT_KEY = "model_response_text"

SHORT_COT = "shortcot"
LONG_COT = "longcot"
TOOL_USE = "tooluse"
FAMILIES = (SHORT_COT, LONG_COT, TOOL_USE)

END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "</s>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)
