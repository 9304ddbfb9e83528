"""The assistant message one turn leaves in the chat history: one function for the training loop and both
evaluations (verl-free).

Training (``envs.tool_use.agent_loop``) is token-in / token-out: the next turn's context is the turn's own ids,
its reasoning (``<think>...</think>``) included; the local evaluation (``stare_verl.jobs.evaluation.engine``) does
the same. Their message lists (which only place the observations' tokens) and the API evaluation's messages
(which are the next request) are built here, so every path keeps what the model wrote:

- the reasoning stays in ``content``, inside ``<think>...</think>`` where the model wrote it; a server that split
  it off (``reasoning_content``) gets it back there (a template that renders content as is, ChatML, gives the
  model's own text; one that splits ``<think>`` off the content, Qwen3's, renders it as the turn's reasoning);
- tool calls: given as structured calls (the training loop's parsed calls, :func:`tool_call_dicts`, or a server's
  ``tool_calls``), they go in ``tool_calls`` and their blocks leave ``content`` (calls inside reasoning are
  reasoning and stay); not given, ``content`` keeps the hermes blocks as written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envs.markup import scan_markup
from envs.tool_use.parser import ParsedCall

__all__ = ["assistant_message", "tool_call_dicts", "with_reasoning"]


def with_reasoning(content: str, reasoning: str | None) -> str:
    """``content`` with the reasoning a server split off put back in front, inside ``<think>...</think>``
    (``content`` unchanged when there is none)."""
    return f"<think>{reasoning}</think>{content}" if reasoning else content


def tool_call_dicts(calls: Sequence[ParsedCall]) -> list[dict[str, Any]]:
    """The training loop's structured calls of a turn: ``{"type": "function", "function": {"name", "arguments"}}``
    per call (a malformed one as ``invalid_tool_call`` with the first 200 characters of its text)."""
    return [
        {
            "type": "function",
            "function": {
                "name": c.name or "invalid_tool_call",
                "arguments": c.arguments if c.ok else {"raw": c.raw[:200]},
            },
        }
        for c in calls
    ]


def _without_visible_calls(text: str) -> str:
    mk = scan_markup(text)
    parts, pos = [], 0
    for c in mk.visible_calls():
        parts.append(text[pos : max(pos, c.start)])
        pos = max(pos, c.end)
    parts.append(text[pos:])
    return "".join(parts).strip()


def assistant_message(
    text: str, tool_calls: Sequence[Mapping[str, Any]] | None = None, *, reasoning: str | None = None
) -> dict[str, Any]:
    """The history message of one assistant turn (module docstring).

    Args:
        text: the turn as the model wrote it (reasoning inside think tags; a server's ``content``).
        tool_calls: the turn's calls in structured form (their blocks are then removed from ``content``); None or
            empty: no structured calls (``content`` is ``text`` as written).
        reasoning: reasoning a server returned apart (``reasoning_content``), put back in front of ``text``.
    Returns:
        ``{"role": "assistant", "content": ...}`` (+ ``"tool_calls"`` when given).
    """
    text = with_reasoning(text or "", reasoning)
    if not tool_calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": _without_visible_calls(text), "tool_calls": [dict(c) for c in tool_calls]}
