"""The tool list for chat templates that ignore ``tools=`` (verl-free).

Qwen's templates render the offered tools into the system message; a plain ChatML template (SmolLM2-Instruct's,
``{{'<|im_start|>' + role + '\\n' + content + '<|im_end|>\\n'}}`` per message) drops them, so the model would
never learn that a tool exists. For such a template the tool list goes into the system message instead
(:func:`with_tool_prompt`): the tools' OpenAI function schemas between ``<tools>`` tags and the hermes call format
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` that ``envs.tool_use.parser`` reads (SmolLM2-Instruct
was tuned on function calling with the schemas in a ``<tools>`` block of the system prompt and ``<tool_call>``
JSON in its answer). The training loop (``envs.tool_use.agent_loop``), the held-out evaluation
(``stare_verl.jobs.evaluation.engine``) and the warm-start SFT's encoding (``stare_verl.jobs.demo.encode``) all call it,
so the model sees one prompt everywhere. A template that renders the tools gets the messages unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TOOL_PROMPT_HEADER", "template_renders_tools", "tool_system_prompt", "with_tool_prompt"]

TOOL_PROMPT_HEADER = "You can use the following tools:"

_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_tool_b7e1", "description": "probe", "parameters": {"type": "object",
                                                                                   "properties": {}}},
}
_RENDERS: dict[int, bool] = {}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template puts an offered tool into the prompt (a probe tool's name appears
    in the rendered text). Cached per tokenizer object. A tokenizer without a chat template, or one whose
    rendering fails with tools, counts as not rendering them."""
    key = id(tokenizer)
    if key in _RENDERS:
        return _RENDERS[key]
    probe = [{"role": "user", "content": "hi"}]
    try:
        text = tokenizer.apply_chat_template(probe, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True)
        ok = isinstance(text, str) and _PROBE_TOOL["function"]["name"] in text
    except Exception:  # noqa: BLE001 - no template, or a template that cannot take tools: treat as ignoring them
        ok = False
    _RENDERS[key] = ok
    return ok


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ValueError(f"a tool must be an OpenAI function schema with function.name, got {tool!r}")
    return fn


def tool_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-message text that offers ``tools`` (OpenAI function schemas, ``{"type": "function",
    "function": {"name", "description", "parameters"}}``): one JSON line per function between ``<tools>`` tags,
    the call format, and that the tool's output comes back in the next message.

    Raises:
        ValueError: ``tools`` is empty or a tool has no ``function.name``.
    """
    if not tools:
        raise ValueError("no tools to describe")
    lines = [json.dumps(dict(_function(t)), ensure_ascii=False) for t in tools]
    name = _function(tools[0])["name"]
    return (
        f"{TOOL_PROMPT_HEADER}\n<tools>\n" + "\n".join(lines) + "\n</tools>\n"
        "To call a tool, answer with one JSON object inside tool-call tags, for example:\n"
        f'<tool_call>{{"name": "{name}", "arguments": {{...}}}}</tool_call>\n'
        "The tool's output comes back in the next message. When you know the answer, write it within \\boxed{}."
    )


def with_tool_prompt(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, tokenizer: Any
) -> list[dict[str, Any]]:
    """``messages`` with the tool list in the system message when ``tokenizer``'s template ignores ``tools=``
    (:func:`template_renders_tools`): the text of :func:`tool_system_prompt` becomes the system message, after
    the content of a system message already first in ``messages`` (a blank line between). Unchanged (a list of
    copies) when there are no tools, the template renders them itself, or the first system message already
    carries :data:`TOOL_PROMPT_HEADER` (adding it twice changes nothing).

    Raises:
        ValueError: a tool without ``function.name`` (:func:`tool_system_prompt`).
    """
    out = [dict(m) for m in messages]
    if not tools or template_renders_tools(tokenizer):
        return out
    text = tool_system_prompt(tools)
    if out and out[0].get("role") == "system":
        content = out[0].get("content") or ""
        if isinstance(content, str) and TOOL_PROMPT_HEADER in content:
            return out
        out[0]["content"] = f"{content}\n\n{text}" if content else text
        return out
    return [{"role": "system", "content": text}, *out]
