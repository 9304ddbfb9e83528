"""Prompt templates per task family and model style (chat lists for verl's RLHFDataset ``prompt`` column).

Families: ``short_cot`` (instruct models, GSM8K/MATH-style), ``long_cot`` (reasoning models that think
in ``<think>...</think>``), ``tool_use`` (multi-turn Python tool use).

Model styles:

- ``default``: one user turn, the problem followed by the reference instruction
  ``"Please reason step by step, and put your final answer within \\boxed{}."``
- ``qwen_math``: the Qwen2.5-Math convention, the instruction as the system message and the bare problem
  as the user turn.
- ``r1_distill``: DeepSeek-R1-distill recommendation: no system message, the instruction inside the user
  turn (the chat template itself opens ``<think>``).
- ``qwen3``: like ``default``; thinking on or off is a chat-template switch (``enable_thinking``), not
  part of the prompt.

For ``tool_use`` every style gets ``TOOL_USE_SYSTEM`` as system message (the tool schema itself is
added by the chat template from the tool config).
"""

from __future__ import annotations

from envs.contract import FAMILIES, SHORT_COT, TOOL_USE

__all__ = ["BOXED_INSTRUCTION", "FAMILIES", "STYLES", "TOOL_USE_SYSTEM", "build_prompt"]

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

TOOL_USE_SYSTEM = (
    "You are a careful mathematician with a Python interpreter. You may call the `code_interpreter` tool "
    "to run Python code whenever computation helps; its printed output is returned to you. "
    "When you are done, put your final answer within \\boxed{}."
)

STYLES = ("default", "qwen_math", "r1_distill", "qwen3")


def build_prompt(
    question: str, family: str = SHORT_COT, style: str = "default", system: str | None = None
) -> list[dict[str, str]]:
    """Chat messages for one problem.

    Args:
        question: the problem text (non-empty).
        family: one of ``FAMILIES``.
        style: one of ``STYLES``.
        system: override of the system message (tool use), or None for the family/style default.
    Returns:
        list of ``{"role": ..., "content": ...}`` dicts.
    Raises:
        ValueError: empty question, unknown family or style.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")
    if style not in STYLES:
        raise ValueError(f"unknown model style {style!r}; choose one of {STYLES}")
    q = (question or "").strip()
    if not q:
        raise ValueError("empty question")
    if family == TOOL_USE:
        return [
            {"role": "system", "content": system if system is not None else TOOL_USE_SYSTEM},
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
