"""The markup of model text, found in one linear scan: reasoning blocks (``<think>...</think>``) and hermes tool
calls (``<tool_call>{json}</tool_call>``). Standard library only (no verl), shared by the tool-call parser
(``envs.tool_use.parser``), the reward text and the think-span scan of the scorer
(``envs.scoring.extract.think_visible_spans``), so the three cannot disagree on where a call or a block ends.

Rules (the *extent* of each piece of markup):

- **A call ends where its JSON ends.** After ``<tool_call>`` (and optional whitespace) one JSON value is
  decoded with the standard raw decoder; the call is *well-formed in shape* when ``</tool_call>`` follows it
  (after optional whitespace). Tags written inside the JSON's strings (code that prints ``</tool_call>``,
  ``<tool_call>``, ``<think>`` or ``</think>``) are string content: they end, open or close nothing.
- **A broken call whose JSON started** (a JSON value begins after the tag but does not decode, or something
  other than ``</tool_call>`` follows it) is still a call, in visible text and inside reasoning alike, and its
  extent is found without trusting any tag its code may print:
  - a raw newline or tab inside a string (invalid JSON, but common in model output) is decoded leniently to
    find where the JSON ends; the call stays malformed for the parser;
  - an unterminated string runs to the end of the text (everything after its quote is inside it);
  - after any other break (single quotes, a quote the code did not escape, a trailing comma, a bad escape,
    extra data, an integer over Python's digit limit) it ends at the text's *last* ``</tool_call>`` when that
    lies after the break, else at the end of the text (unclosed): once the JSON broke nothing tells string
    content from markup, so no tag in between is trusted (a well-formed call after it in the same text is
    swallowed with it, and R1 reasoning's ``</think>`` after it too: safe, not generous).
- **A fence or a tool name before the object** (``<tool_call>```json {...} ```</tool_call>``,
  ``<tool_call>code_interpreter {...}</tool_call>``) is a broken call whose extent is its object's (then the end
  tag, after an optional closing fence); if that object breaks, the rules above apply.
- **A bare tag** (no JSON value or object after ``<tool_call>``, e.g. prose mentioning the tag) ends at the first ``</tool_call>`` after it; a
  ``<think>`` or ``</think>`` before that ends it there instead (unclosed), and without either it runs to the
  end of the text (unclosed). Inside reasoning a bare tag is prose.
- **Reasoning blocks nest** (an inner ``</think>`` does not end the outer block). A ``</think>`` that closes no
  open block ends reasoning opened by the chat template (R1-distill), so everything before it, calls included,
  is reasoning. Text after a ``<think>`` left open is reasoning.
- **Inside reasoning** a call (well-formed or broken, by the rules above) is skipped whole (its strings stay
  string content) and counted as a call inside reasoning; it never runs.

Every scan is linear in ``len(text)``: a decode starts only after the previous call's end and reads the call's
JSON plus at most a few windows of ``_FIRST_WINDOW`` characters (the next start is after the break point or the
call's end), and tags are found with forward searches only (``tests/envs/test_tool_call_markup.py`` counts the
characters read on tag floods).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "CallSpan",
    "Markup",
    "remove_calls",
    "scan_markup",
]

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

_TAG_RE = re.compile(r"<think>|</think>|<tool_call>")
_BROKEN_END_RE = re.compile(r"</tool_call>|<think>|</think>")
_WS_RE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_LENIENT = json.JSONDecoder(strict=False)  # raw newlines and tabs inside strings: only to find a call's extent
_CTRL_RE = re.compile(r"[\x00-\x1f]")
_LOOSE_START_RE = re.compile(r"[ \t\n\r]*(?:```[A-Za-z]*[ \t\n\r]*)?(?:[A-Za-z_][\w.-]{0,63}[ \t\n\r]*)?(?=\{)")
_LOOSE_END_RE = re.compile(r"[ \t\n\r]*(?:```[ \t\n\r]*)?")


@dataclass(frozen=True)
class CallSpan:
    """One ``<tool_call>`` of a text, by character offsets.

    Attributes:
        start: offset of ``<tool_call>``.
        end: offset just after the call (after ``</tool_call>``; for an unclosed call the offset of the think tag
            that ended it, or ``len(text)``).
        body_start, body_end: the text between the tags (``body_end`` is the offset of ``</tool_call>``, or
            ``end`` when unclosed).
        closed: ended by ``</tool_call>``.
        decoded: the JSON value decoded and ``</tool_call>`` followed it (``value`` holds it).
        value: the decoded JSON value (None unless ``decoded``).
        json_error: why the body is not one JSON value: ``"<json message> at char <n>"`` (``n`` counted from the
            first non-blank character of the body), ``"too deep"`` (nesting beyond the decoder's recursion
            limit), or None.
        in_think: the call stands inside reasoning (it is never run).
    """

    start: int
    end: int
    body_start: int
    body_end: int
    closed: bool
    decoded: bool
    value: Any = None
    json_error: str | None = None
    in_think: bool = False


@dataclass
class Markup:
    """The markup of one text (see the module docstring).

    Attributes:
        visible: ``[(start, end), ...]`` non-empty ranges outside reasoning, in order (visible calls included).
        calls: every call in order (``in_think`` tells the ones inside reasoning).
        depth: reasoning nesting depth at the end of the text (> 0: a block was left open).
    """

    visible: list[tuple[int, int]]
    calls: list[CallSpan]
    depth: int

    def visible_calls(self) -> list[CallSpan]:
        """The calls outside reasoning (the ones a loop answers)."""
        return [c for c in self.calls if not c.in_think]


_FIRST_WINDOW = 512  # characters of the first decode attempt of a call; grown 4x while the JSON reaches its end
_EDGE = 32
_VALUE_START = frozenset('{["-0123456789tfnNI')  # a decode that stops this close to the window's end may have been cut by it: try a larger window


def _decode(text: str, body: int, decoder: json.JSONDecoder | None = None) -> tuple[bool, Any, int, str | None]:
    """Decode one JSON value at ``body`` (after blanks): ``(ok, value, stop, error)`` with ``stop`` the offset
    after the value, or where the JSON broke.

    The decoder runs on a window of the text that grows geometrically while the value reaches the window's end,
    so the work is proportional to the value's length, not to the text's (``json.JSONDecodeError`` counts lines
    from the start of the string it was given, which would make a flood of broken calls quadratic).
    """
    n = len(text)
    j = _WS_RE.match(text, body).end()
    if j >= n or text[j] not in _VALUE_START:  # no JSON value starts here (e.g. a flood of bare tags)
        return False, None, j, "Expecting value at char 0"
    size = _FIRST_WINDOW
    while True:
        end = min(n, j + size)
        window = text[j:end]
        cut = end < n
        try:
            value, stop = (decoder or _DECODER).raw_decode(window)
        except json.JSONDecodeError as err:
            if cut and (err.pos >= len(window) - _EDGE or err.msg.startswith("Unterminated string")):
                size *= 4
                continue
            return False, None, j + err.pos, f"{err.msg.removesuffix(' at')} at char {err.pos}"
        except RecursionError:  # thousands of nested brackets: the decoder recurses per level
            return False, None, j, "too deep"
        except ValueError as err:  # an integer beyond Python's digit limit: a larger window cannot help
            return False, None, j, f"{err} at char 0"
        if cut and stop >= len(window) - _EDGE:
            size *= 4
            continue
        return True, value, j + stop, None


def _loose_json_start(text: str, body: int) -> int | None:
    """Where a JSON object starts after a code fence (`````json``) and/or a bare tool name right after the tag, or
    None (``<tool_call>```json {...}``` `` and ``<tool_call>code_interpreter {...}`` are broken calls whose
    extent is their object's)."""
    m = _LOOSE_START_RE.match(text, body)
    return m.end() if m is not None else None


def _json_started(text: str, body: int) -> bool:
    """True when a JSON value begins at ``body`` (after blanks)."""
    j = _WS_RE.match(text, body).end()
    return j < len(text) and text[j] in _VALUE_START


def _broken_extent(text: str, stop: int, err: str, last_close: int) -> tuple[int, bool, int]:
    """``(end, closed, body_end)`` of a call whose JSON started but broke at ``stop`` (module docstring): an
    unterminated string runs to the end of the text; after any other break the call ends at the text's last
    ``</tool_call>`` (``last_close``, found once per scan) when that lies at or after the break, else at the
    end of the text. After a break nothing tells string content from markup (a quote the code did not escape
    shifts every pairing), so no tag in between is trusted."""
    n = len(text)
    if err.startswith("Unterminated string"):
        return n, False, n
    if last_close >= stop:
        return last_close + len(TOOL_CALL_END), True, last_close
    return n, False, n


def scan_markup(text: str) -> Markup:
    """Find the reasoning blocks and tool calls of ``text`` (module docstring), in one linear pass.

    Args:
        text: any string (a decoded assistant turn, special tokens kept or not).
    Returns:
        :class:`Markup`. Never raises for any input.
    """
    n = len(text)
    visible: list[tuple[int, int]] = []
    calls: list[CallSpan] = []
    reasoning_calls = 0  # calls[:reasoning_calls] stand before a prompt-opened block's </think>
    depth, vis_start, i = 0, 0, 0
    last_close: int | None = None  # the text's last </tool_call>, found at the first broken call
    while i < n:
        m = _TAG_RE.search(text, i)
        if m is None:
            break
        tag, s = m.group(), m.start()
        if tag == THINK_OPEN:
            if depth == 0:
                visible.append((vis_start, s))
            depth += 1
            i = m.end()
            continue
        if tag == THINK_CLOSE:
            if depth == 0:  # closes reasoning the prompt opened: everything before is reasoning
                visible.clear()
                reasoning_calls = len(calls)
            else:
                depth -= 1
            if depth == 0:
                vis_start = m.end()
            i = m.end()
            continue
        body = m.end()
        # decoded leniently (raw newlines and tabs inside strings allowed) to find where the JSON ends; a value
        # that holds a raw control character is then checked strictly: if that fails the call is malformed,
        # with its extent still exact
        ok, value, stop, err = _decode(text, body, _LENIENT)
        if ok:
            j = _WS_RE.match(text, body).end()
            if _CTRL_RE.search(text[j:stop]) is not None:
                try:
                    _DECODER.raw_decode(text[j:stop])
                except json.JSONDecodeError as e:
                    ok, value, err = False, None, f"{e.msg.removesuffix(' at')} at char {e.pos}"
            k = _WS_RE.match(text, stop).end()
            if text.startswith(TOOL_CALL_END, k):
                calls.append(CallSpan(s, k + len(TOOL_CALL_END), body, k, True, ok, value, err, depth > 0))
                i = k + len(TOOL_CALL_END)
                continue
            err = f"Extra data at char {k - j}"
            stop = k
        if last_close is None:
            last_close = text.rfind(TOOL_CALL_END)
        json_at = body if _json_started(text, body) else _loose_json_start(text, body)
        if json_at is not None and json_at != body:  # a fence (```json) or a tool name before the object
            ok, value, stop, err = _decode(text, json_at, _LENIENT)
            k = _LOOSE_END_RE.match(text, stop).end() if ok else stop
            if ok and text.startswith(TOOL_CALL_END, k):
                err = f"the JSON object does not follow the tag directly (at char {json_at - body})"
                calls.append(CallSpan(s, k + len(TOOL_CALL_END), body, k, True, False, None, err, depth > 0))
                i = k + len(TOOL_CALL_END)
                continue
            err = err or f"Extra data at char {k - json_at}"
            stop = max(stop, k)
        if json_at is not None:
            end, closed, body_end = _broken_extent(text, stop, err or "", last_close)
            calls.append(CallSpan(s, end, body, body_end, closed, False, None, err, depth > 0))
            i = end
            continue
        if depth > 0:  # a bare tag inside reasoning is prose
            i = max(stop, body)
            continue
        t = _BROKEN_END_RE.search(text, stop)
        if t is not None and t.group() == TOOL_CALL_END:
            calls.append(CallSpan(s, t.end(), body, t.start(), True, False, None, err, False))
            i = t.end()
        else:
            end = n if t is None else t.start()
            calls.append(CallSpan(s, end, body, end, False, False, None, err, False))
            i = end
    if depth == 0:
        visible.append((vis_start, n))
    if reasoning_calls:
        calls[:reasoning_calls] = [c if c.in_think else _in_think(c) for c in calls[:reasoning_calls]]
    return Markup([sp for sp in visible if sp[1] > sp[0]], calls, depth)


def _in_think(c: CallSpan) -> CallSpan:
    return CallSpan(c.start, c.end, c.body_start, c.body_end, c.closed, c.decoded, c.value, c.json_error, True)


def remove_calls(text: str, markup: Markup | None = None) -> str:
    """``text`` without any tool call (visible ones and those inside reasoning, well-formed or broken), by the
    extents of :func:`scan_markup`; everything else (reasoning included) is kept. Linear."""
    if markup is None and TOOL_CALL_START not in text:  # no call can start: nothing to scan for
        return text
    mk = markup if markup is not None else scan_markup(text)
    out, pos = [], 0
    for c in mk.calls:
        out.append(text[pos : c.start])
        pos = c.end
    out.append(text[pos:])
    return "".join(out)
