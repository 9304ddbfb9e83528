"""The hermes tool-call parser of the tool-use family (verl-free: importing it imports no verl).

One parser for every path that reads a model's tool calls: the training loop (``envs.tool_use.agent_loop``),
the API evaluation and the held-out evaluation (``envs.tool_use.episode``). Extents come from
``envs.markup.scan_markup``: a call ends where its JSON ends (tags inside the JSON's strings end nothing),
calls inside ``<think>...</think>`` are never run, and a call's text never reaches the reward
(:func:`remove_tool_calls`, :func:`model_response_text`).

Argument checks use the tool's OpenAI function schema, read by attribute (``schema.function.parameters``
with ``required`` and ``properties[name].type``), so verl's ``OpenAIFunctionToolSchema`` and any object of the
same shape work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from envs.markup import TOOL_CALL_END, TOOL_CALL_START, CallSpan, remove_calls, scan_markup

__all__ = [
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "ParsedCall",
    "model_response_text",
    "parse_tool_calls",
    "remove_tool_calls",
    "strip_thinking",
]

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}

_CALL_FORMAT = 'Write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>.'


def strip_thinking(text: str) -> str:
    """The text outside reasoning spans (``envs.markup`` rules: nested blocks, prompt-opened reasoning ended by
    an unmatched ``</think>``, an unclosed ``<think>`` hiding the rest; think tags inside a call's JSON strings
    open and close nothing). Tool calls outside reasoning are kept. Linear in ``len(text)``."""
    mk = scan_markup(text)
    return "".join(text[a:b] for a, b in mk.visible)


def remove_tool_calls(text: str) -> str:
    """``text`` without any ``<tool_call>`` (closed, broken or unclosed, inside reasoning or not; a call ends where
    its JSON ends, so a ``</tool_call>`` inside the call's code ends nothing). Linear in ``len(text)``."""
    return remove_calls(text)


@dataclass
class ParsedCall:
    """One tool call written by the model (outside thinking).

    Attributes:
        raw: the text between the tags (or after an unclosed ``<tool_call>``).
        name: the tool name, when the JSON had one.
        arguments: the arguments object, when the call is valid.
        error: None for a well-formed call of a known tool with the required arguments; otherwise the
            message the model gets as the observation ("Error: ...; nothing was run.").
    """

    raw: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True for a well-formed call of a known tool (it will be run)."""
        return self.error is None

    def function_call(self):
        """verl's ``FunctionCall`` of a valid call (arguments as a JSON string); imports verl.

        Raises:
            ValueError: the call is malformed.
        """
        if not self.ok:
            raise ValueError(f"malformed tool call: {self.error}")
        from verl.experimental.agent_loop.tool_parser import FunctionCall

        return FunctionCall(name=self.name, arguments=json.dumps(self.arguments, ensure_ascii=False))


def _check_arguments(name: str, args: dict[str, Any], schema: Any) -> str | None:
    if schema is None:
        return None
    params = schema.function.parameters
    missing = [r for r in (getattr(params, "required", None) or []) if r not in args]
    if missing:
        return f"Error: tool '{name}' needs the argument(s) {', '.join(missing)}; nothing was run."
    for key, value in args.items():
        prop = (getattr(params, "properties", None) or {}).get(key)
        if prop is None:
            continue
        names = [prop.type] if isinstance(prop.type, str) else list(prop.type)
        if any(t not in _JSON_TYPES for t in names):
            continue
        expected = tuple(ty for t in names for ty in _JSON_TYPES[t])
        if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
            return (
                f"Error: argument '{key}' of tool '{name}' must be a JSON {' or '.join(names)}, "
                f"got {type(value).__name__}; nothing was run."
            )
    return None


def _parse_value(raw: str, obj: Any, tools: dict[str, Any]) -> ParsedCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ParsedCall(raw, error='Error: a tool call must be a JSON object with a "name"; nothing was run.')
    name = obj["name"]
    if name not in tools:
        avail = ", ".join(sorted(tools)) or "none"
        return ParsedCall(raw, name=name, error=f"Error: unknown tool '{name}'. Available tools: {avail}.")
    # Llama-style calls name the object "parameters": used when "arguments" is absent or empty (null, "", {})
    key = "arguments"
    if "parameters" in obj and obj.get("arguments") in (None, "", {}) and obj["parameters"] not in (None, "", {}):
        key = "parameters"
    args = obj.get(key)
    if isinstance(args, str):  # some models write the arguments as a JSON string; "" or blanks: no arguments
        if not args.strip():
            args = None
        else:
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                pass
    if args is None:  # a missing key, null, "" or blanks: no arguments (an error only if some are required)
        args = {}
    if not isinstance(args, dict):
        return ParsedCall(
            raw, name=name, error=f"Error: \"{key}\" of tool '{name}' must be a JSON object; nothing was run."
        )
    err = _check_arguments(name, args, tools[name])
    return ParsedCall(raw, name=name, arguments=args if err is None else None, error=err)


def _parse_span(text: str, span: CallSpan, tools: dict[str, Any]) -> ParsedCall:
    raw = text[span.body_start : span.body_end]
    if not span.closed:
        return ParsedCall(raw, error=f"Error: the tool call was not closed with {TOOL_CALL_END}; nothing was run.")
    if span.json_error == "too deep":
        return ParsedCall(raw, error="Error: the tool call nests JSON too deeply; nothing was run.")
    if not span.decoded:
        return ParsedCall(
            raw, error=f"Error: the tool call is not valid JSON ({span.json_error}); nothing was run. {_CALL_FORMAT}"
        )
    return _parse_value(raw, span.value, tools)


def parse_tool_calls(text: str, tools: dict[str, Any] | None) -> tuple[str, list[ParsedCall]]:
    """Parse the hermes tool calls of one assistant turn, ignoring those inside ``<think>...</think>``.

    Args:
        text: the decoded turn (special tokens kept).
        tools: the available tools, name -> OpenAI function schema (None: no argument checks); None or ``{}``
            for no tools at all (every call is an unknown-tool error).

    Returns:
        ``(content, calls)``: the turn's text without thinking and tool calls (stripped), and the calls in order
        (well-formed ones and malformed ones with their error message). An unclosed ``<tool_call>`` is one
        malformed call. Never raises for any text.
    """
    tools = tools or {}
    mk = scan_markup(text)
    calls = [c for c in mk.calls if not c.in_think]
    parts: list[str] = []
    ci = 0
    for a, b in mk.visible:
        pos = a
        while ci < len(calls) and calls[ci].start < b:
            c = calls[ci]
            parts.append(text[pos : max(pos, c.start)])
            pos = max(pos, c.end)
            ci += 1
        if pos < b:
            parts.append(text[pos:b])
    return "".join(parts).strip(), [_parse_span(text, c, tools) for c in calls]


def _mask_runs(response_ids: list[int], response_mask: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    cur: list[int] = []
    for tok, m in zip(response_ids, response_mask, strict=False):
        if m:
            cur.append(int(tok))
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def model_response_text(response_ids: list[int], response_mask: list[int], tokenizer: Any) -> str:
    """The text the reward may see: the model-generated tokens only (``response_mask == 1``).

    Each run of mask-1 tokens (one assistant turn) is decoded on its own with special tokens kept, its tool
    calls are removed (:func:`remove_tool_calls`: the code sent to a tool is an action, not an answer), then the
    tokenizer's special-token strings are removed; the turns are joined with newlines. Tool output (mask 0)
    never enters it.

    Args:
        response_ids, response_mask: the episode's response tokens and mask (same length).
        tokenizer: a Hugging Face tokenizer (``decode``, ``all_special_tokens``).
    """
    specials = [s for s in getattr(tokenizer, "all_special_tokens", []) if s]
    parts = []
    for run in _mask_runs(response_ids, response_mask):
        parts.append(turn_reward_text(tokenizer.decode(run, skip_special_tokens=False), specials))
    return "\n".join(p for p in parts if p)


def turn_reward_text(text: str, specials: list[str] | tuple[str, ...] = ()) -> str:
    """One assistant turn's contribution to the reward text: ``text`` without tool calls, without the given
    special-token strings, stripped."""
    text = remove_tool_calls(text)
    for s in specials:
        text = text.replace(s, "")
    return text.strip()
