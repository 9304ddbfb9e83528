"""Prompt templates per task family and model style (chat lists for verl's RLHFDataset ``prompt`` column).

Families (``envs.families``): ``shortcot`` (instruct models, GSM8K/MATH-style), ``longcot`` (reasoning models that
think in ``<think>...</think>``), ``tooluse`` (multi-turn Python tool use), or a registered new one.

Model styles:

- ``default``: one user turn, the problem followed by the reference instruction
  ``"Please reason step by step, and put your final answer within \\boxed{}."``
- ``qwen_math``: the Qwen2.5-Math convention, the instruction as the system message and the bare problem
  as the user turn.
- ``r1_distill``: DeepSeek-R1-distill recommendation: no system message, the instruction inside the user
  turn (the chat template itself opens ``<think>``).
- ``qwen3``: like ``default``; thinking on or off is a chat-template switch (``enable_thinking``), not
  part of the prompt.

A family with its own system prompt (``EnvFamily.system_prompt``: tool use's ``envs.tool_use.TOOL_USE_SYSTEM``)
gets it as the system message in every style (the tool schema itself is added by the chat template from the tool
config).
"""

from __future__ import annotations

from envs.contract import SHORT_COT
from envs.families import env_family

__all__ = ["BOXED_INSTRUCTION", "STYLES", "build_prompt"]

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

STYLES = ("default", "qwen_math", "r1_distill", "qwen3")


def build_prompt(
    question: str, family: str = SHORT_COT, style: str = "default", system: str | None = None
) -> list[dict[str, str]]:
    """Chat messages for one problem.

    Args:
        question: the problem text (non-empty).
        family: a registered family's name or alias (``envs.families``).
        style: one of ``STYLES``.
        system: override of the system message (tool use), or None for the family/style default.
    Returns:
        list of ``{"role": ..., "content": ...}`` dicts.
    Raises:
        ValueError: empty question, unknown family or style.
    """
    fam = env_family(family)  # ValueError for an unknown one
    if style not in STYLES:
        raise ValueError(f"unknown model style {style!r}; choose one of {STYLES}")
    q = (question or "").strip()
    if not q:
        raise ValueError("empty question")
    if fam.system_prompt is not None:
        return [
            {"role": "system", "content": system if system is not None else fam.system_prompt},
            {"role": "user", "content": q},
        ]
    if style == "qwen_math":
        return [
            {"role": "system", "content": system if system is not None else BOXED_INSTRUCTION},
            {"role": "user", "content": q},
        ]
    msgs = [{"role": "user", "content": f"{q}\n\n{BOXED_INSTRUCTION}"}]
    if system is not None:
        msgs.insert(0, {"role": "system", "content": system})
    return msgs
