"""Answer extraction from model responses.

Our own extraction (rather than math-verify's whole-text regexes) so that scoring is fast and the rule
is explicit: the *last complete* ``\\boxed{...}`` or ``\\fbox{...}`` in the answer part of a response
wins; braces are matched with escaped ``\\{``/``\\}`` skipped, so ``\\boxed{\\{1,2\\}}`` yields
``\\{1,2\\}``. A box cut off by the length limit (``\\boxed{12`` with no closing brace) is not an answer;
an earlier complete box is used instead.

An answer boxed piece by piece is one answer: the last box together with the boxes right before it that
are separated from it only by whitespace, punctuation (``, ; . :``), math delimiters (``$``, ``\\(``,
``\\[`` ...), LaTeX spacing or the words "and"/"or" (``\\boxed{1}, \\boxed{2} and \\boxed{3}`` ->
``1, 2, 3``; repeated contents count once). Any other text between two boxes ends the run: a box written
after more prose replaces the earlier ones (self-correction).

When the ground truth has k parts and the response exactly k boxes with nothing between them that withdraws the
earlier one (:func:`every_box`), ``envs.reward`` also reads the boxes in order as the answer.

Long-CoT responses are split at the reasoning delimiter (``</think>``) first: the answer is searched
only after the reasoning, never inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from envs.scoring.normalize import normalize_answer

__all__ = [
    "BOX_COMMANDS",
    "ThinkSplit",
    "extract_boxed",
    "every_box",
    "extract_final_answer",
    "find_boxed_all",
    "last_boxes",
    "split_think",
    "think_visible_spans",
]

BOX_COMMANDS = ("\\boxed", "\\fbox")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.S)


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Complete boxes of ``text`` as ``(start, end, content)``, in order of their start.

    One pass of a brace stack over the brace/escape tokens after the first box command (escaped
    ``\\{``/``\\}`` are skipped), so the cost is linear even for thousands of unclosed boxes.
    """
    cmds = list(_BOX_RE.finditer(text))
    if not cmds:
        return []
    first = cmds[0].start()
    match: dict[int, int] = {}
    stack: list[int] = []
    for tok in _BRACE_TOKEN_RE.finditer(text, first):
        c = tok.group(0)
        if c == "{":
            stack.append(tok.start())
        elif c == "}":
            if stack:
                match[stack.pop()] = tok.start()
    out: list[tuple[int, int, str]] = []
    n = len(text)
    for m in cmds:
        j = m.end()
        while j < n and text[j] in " \t":
            j += 1
        if j < n and text[j] == "{":
            close = match.get(j)
            if close is not None:
                out.append((m.start(), close + 1, text[j + 1 : close]))
        elif j > m.end() and j < n:
            # "\\boxed 42" form (no braces, one token after a space)
            tm = re.match(r"[^\s$]+", text[j : j + 200])
            if tm:
                out.append((m.start(), j + tm.end(), tm.group(0).rstrip(".,;")))
    return out


def find_boxed_all(text: str) -> list[str]:
    """All complete ``\\boxed{}`` / ``\\fbox{}`` contents, outermost boxes only, in order.

    Args:
        text: any string.
    Returns:
        list of the box contents (str).
    """
    return [content for _, _, content in _outermost(_boxes(text))]


# What may stand between two boxes of one answer: whitespace, , ; . : punctuation, markdown bold, math
# delimiters, LaTeX spacing and line breaks, and the words and/or (bare or in \text{}).
_BOX_SEPARATOR_RE = re.compile(
    r"(?:\s|[,;.:*]|\$|\\[()\[\]\\]|\\(?:quad|qquad)(?![A-Za-z])|\\[,;:! ]|~|&"
    r"|\\(?:text|mathrm|textrm|mbox)\s*\{\s*(?:and|or|,)?\s*\}|(?<![A-Za-z])(?:and|or)(?![A-Za-z]))*",
    re.I,
)


def _outermost(boxes: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    last_end = -1
    for box in boxes:
        if box[0] >= last_end:
            out.append(box)
            last_end = box[1]
    return out


def extract_boxed(text: str) -> str | None:
    """The final boxed answer of ``text``: the last complete outermost ``\\boxed{}``/``\\fbox{}``, joined
    with the boxes right before it that only separators part from it (module docstring), or None.

    An incomplete box (no closing brace, e.g. a response cut by the length limit) is skipped; the last
    complete one wins. Nested boxes: the outer box is the answer (its content keeps the inner box,
    which normalisation unwraps). Several boxes give their stripped contents joined by ``", "`` in order,
    a value repeated in the run kept once, however it is written (``\\boxed{1}, \\boxed{2}`` -> ``"1, 2"``;
    ``\\boxed{1000}, \\boxed{1{,}000}`` -> ``"1000"``: compared after ``normalize_answer``). Linear in
    ``len(text)``.
    """
    return _boxed_run(text)[0]


def _join(contents: list[str]) -> str:
    """Box contents joined by ``", "``, each value once (compared after ``normalize_answer``), empty ones dropped
    when there are others."""
    parts: list[str] = []
    seen: set[str] = set()
    for content in contents:
        c = content.strip()
        key = normalize_answer(c) if len(contents) > 1 else c  # the same value written twice is one value
        if key not in seen:
            seen.add(key)
            parts.append(c)
    if len(parts) > 1:
        parts = [p for p in parts if p]  # an empty box among filled ones adds nothing
    return ", ".join(parts)


def _boxed_run(text: str) -> tuple[str | None, int]:
    """``(answer, end)``: the answer of :func:`extract_boxed` and the offset after its last box (-1 when none)."""
    if not text or "\\" not in text:
        return None, -1
    boxes = _outermost(_boxes(text))
    if not boxes:
        return None, -1
    run = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        gap_start, gap_end = box[1], run[-1][0]
        if _BOX_SEPARATOR_RE.fullmatch(text, gap_start, gap_end) is None:
            break
        run.append(box)
    return _join([content for _, _, content in reversed(run)]), boxes[-1][1]


_CONNECTOR_RE = re.compile(r"(?<![A-Za-z])and(?![A-Za-z])", re.I)
_SENTENCE_END_RE = re.compile(r"[.!?](?:\s|$)")
_MAX_CONNECTED_GAP = 40


def _connected(text: str, start: int, end: int) -> bool:
    """The text between two boxes joins them into one list: separators only (module docstring), or a short gap
    (at most ``_MAX_CONNECTED_GAP`` characters, no sentence end in it) that holds the word "and"
    (``\\boxed{(3, 3)} for part (a) and \\boxed{(1, 1)}``, ``y_1 = \\boxed{..} and y_2 = \\boxed{..}``)."""
    if _BOX_SEPARATOR_RE.fullmatch(text, start, end) is not None:
        return True
    return (
        end - start <= _MAX_CONNECTED_GAP
        and _CONNECTOR_RE.search(text, start, end) is not None
        and _SENTENCE_END_RE.search(text[start:end]) is None
    )


def last_boxes(text: str, k: int | None = None) -> str | None:
    """The last boxes of ``text`` that connectors join into one list (``_connected``), joined as
    :func:`extract_boxed` joins a run (``"(3, 3), (1, 1)"`` from ``\\boxed{(3, 3)} for part (a) and
    \\boxed{(1, 1)}``).

    Args:
        text: a response's answer part or a ground truth.
        k: how many boxes to take (None: the whole connected run).
    Returns:
        the joined contents, or None when ``text`` has no box or its last connected run holds fewer than ``k``.
        Linear in ``len(text)``.
    """
    if (k is not None and k < 1) or not text or "\\" not in text:
        return None
    boxes = _outermost(_boxes(text))
    if not boxes:
        return None
    run = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if (k is not None and len(run) >= k) or not _connected(text, box[1], run[-1][0]):
            break
        run.append(box)
    if k is not None and len(run) < k:
        return None
    return _join([content for _, _, content in reversed(run)])


# words between two boxes that withdraw, doubt or hedge the earlier one: the boxes are then no list of parts
_RETRACT_RE = re.compile(
    r"(?<![A-Za-z])(?:or|nor|either|but|not|no|never|wait|actually|instead|rather|wrong|incorrect|mistakes?"
    r"|correct(?:ion|ed|ing)?|realis\w*|realiz\w*|hmm+|however|alternatively|alternative|oops|sorry|meant"
    r"|revis\w*|redo|again|re-?(?:check|consider|think|examine|evaluate|do)\w*|double-?check\w*|scratch"
    r"|ignore|previous(?:ly)?|earlier|updated?|isn't|wasn't|can't|cannot)(?![A-Za-z])",
    re.I,
)


def every_box(text: str, k: int) -> str | None:
    """The contents of the boxes of ``text``, in order, joined by ``", "`` when ``text`` holds exactly ``k`` (>= 2)
    complete outermost boxes and no text between two of them withdraws, doubts or hedges the earlier one
    (``_RETRACT_RE``: "or", "but", "not", "wait", "actually", "wrong", "realise", "earlier" ...): the parts of a
    list boxed one by one in prose (``Area is \\boxed{2}, perimeter is \\boxed{3}.``, ``x is \\boxed{2}. y is
    \\boxed{3}.``); None otherwise (``First \\boxed{2}. Later I realise it is \\boxed{3}.`` is a correction). Every
    box is one part (a value boxed twice counts twice). Linear in ``len(text)``."""
    if k < 2 or not text or "\\" not in text:
        return None
    boxes = _outermost(_boxes(text))
    if len(boxes) != k:
        return None
    if any(_RETRACT_RE.search(text, a[1], b[0]) for a, b in zip(boxes, boxes[1:], strict=False)):
        return None
    contents = [content.strip() for _, _, content in boxes]
    return ", ".join(contents) if all(contents) else None


_ANSWER_LINE_RE = re.compile(r"(?im)^\s*\**\s*(?:final\s+)?answer\s*\**\s*[:：]\s*\**\s*(.+?)\s*$")
_FINAL_IS_RE = re.compile(r"(?i)the\s+final\s+answer\s+is\s*[:：]?\s*(.+?)(?:\.\s*(?:I hope|$)|$)", re.S)
_GSM_RE = re.compile(r"####\s*([^\n]+)")
# "The final answer is $X$" (Minerva's format) after the last box restates the answer: it wins
_FINAL_MATH_RE = re.compile(r"(?i)final\s+answer\s+is\s*:?\s*\$(?P<a>[^$]{1,500})\$")


def extract_final_answer(text: str, strict_box: bool = True, last_number: bool = False) -> tuple[str | None, str]:
    """Final answer of a response (the answer part, after any reasoning block).

    Args:
        text: the answer part of a response.
        strict_box: when True only a complete ``\\boxed{}``/``\\fbox{}`` counts (a ``The final answer is $X$``
            written after the last box restates the answer, and ``X`` is taken); when False, fall back
            (in this order) to a last ``Answer: X`` line (DAPO/Minerva), ``The final answer is X`` and
            GSM8K's ``#### X``.
        last_number: when nothing above is found (whatever ``strict_box`` says), the last number written in the
            text is the answer (:func:`extract_last_number`): the lenient rule for a pretrained model that answers
            in prose without a box.
    Returns:
        ``(answer, how)`` with ``how`` one of ``"box"``, ``"answer_line"``, ``"final_answer_is"``,
        ``"gsm8k"``, ``"last_number"``, ``"none"``; ``answer`` is None when nothing was found.
    """
    boxed, end = _boxed_run(text)
    if boxed is not None:
        finals = list(_FINAL_MATH_RE.finditer(text, end))
        if finals and finals[-1].group("a").strip():
            return finals[-1].group("a").strip(), "final_answer_is"
        return boxed, "box"
    if not text:
        return None, "none"
    if strict_box:
        return _last_number_or_none(text, last_number)
    tail = text[-2000:]
    lines = _ANSWER_LINE_RE.findall(tail)
    if lines:
        ans = lines[-1].strip().strip("*").strip()
        if ans.startswith("$") and ans.endswith("$") and len(ans) > 1:
            ans = ans.strip("$")
        return ans.rstrip("."), "answer_line"
    finals = list(_FINAL_IS_RE.finditer(tail))
    if finals:
        ans = finals[-1].group(1).strip().strip("$").rstrip(".")
        if ans:
            return ans, "final_answer_is"
    g = _GSM_RE.findall(tail)
    if g:
        return g[-1].strip(), "gsm8k"
    return _last_number_or_none(text, last_number)


# A number as prose writes it: an optional sign, digits with optional thousands separators, an optional decimal part
# (the sign only when it does not follow a letter or digit, so "3-4" reads as 3 and 4, "x = -4" as -4).
_NUMBER_RE = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|(?<![\w.])-?\d+(?:\.\d+)?|(?<=[A-Za-z])\d+(?:\.\d+)?")


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text`` (thousands separators dropped, a trailing ``.`` not part of it), or None.

    ``"6 + 3 = 9."`` -> ``"9"``; ``"It is 1,234 apples"`` -> ``"1234"``; ``"x = -4"`` -> ``"-4"``; ``"2.50 dollars"``
    -> ``"2.50"``; no digits -> None. Only the last 2,000 characters are read.
    """
    found = _NUMBER_RE.findall(text[-2000:] if text else "")
    return found[-1].replace(",", "") if found else None


def _last_number_or_none(text: str, last_number: bool) -> tuple[str | None, str]:
    if last_number:
        num = extract_last_number(text)
        if num is not None:
            return num, "last_number"
    return None, "none"


ThinkMode = Literal["auto", "required", "off"]


@dataclass(frozen=True)
class ThinkSplit:
    """A response split at its reasoning block.

    Attributes:
        reasoning: text of the reasoning (between ``<think>`` and the last ``</think>``; everything before
            the last ``</think>`` for R1-distill responses that start mid-think).
        answer: the text after the last ``</think>`` ("" when the reasoning never closed).
        closed: whether a ``</think>`` was found.
        opened: whether a ``<think>`` was found.
    """

    reasoning: str
    answer: str
    closed: bool
    opened: bool


def think_visible_spans(text: str) -> tuple[list[tuple[int, int]], int]:
    """The spans of ``text`` outside reasoning blocks, in one linear scan (``envs.markup.scan_markup``).

    Blocks nest (an inner ``</think>`` does not close the outer block). A ``</think>`` that closes no open block
    ends reasoning opened by the chat template (R1-distill), so everything before it is reasoning. Think tags
    inside a hermes tool call's JSON strings (``<tool_call>{"arguments": {"code": "print('</think>')"}}...``)
    open and close nothing: a call ends where its JSON ends.

    Returns:
        ``(spans, depth)``: ``[(start, end), ...]`` non-empty character ranges of visible text in order, and the
        nesting depth at the end of the text (> 0: a block was left open, and the text after its tag is not
        visible).
    """
    from envs.markup import scan_markup

    mk = scan_markup(text)
    return mk.visible, mk.depth


def _last_think_close(text: str, calls: list) -> int:
    """Offset of the last ``</think>`` outside every tool call of ``calls`` (``envs.markup`` extents, in order: a
    tag printed by a call's code closes nothing), or -1. Linear: each backward search starts before the call that
    held the last hit."""
    close = text.rfind(THINK_CLOSE)
    k = len(calls) - 1
    while close >= 0:
        while k >= 0 and calls[k].start > close:
            k -= 1
        if k < 0 or close >= calls[k].end:
            return close
        close = text.rfind(THINK_CLOSE, 0, calls[k].start)
    return close


def split_think(text: str, mode: ThinkMode = "auto") -> ThinkSplit:
    """Split a long-CoT response into reasoning and answer.

    Handles Qwen3 (``<think>...</think>answer``, including an empty think block in non-thinking mode)
    and R1-distill (the chat template already opened ``<think>``, so the response holds only the
    closing tag). The last ``</think>`` outside tool calls wins, provided no block is left open after it: a reopened or nested
    ``<think>`` still open at the end of the text means the answer was never given (no answer).

    Args:
        text: the decoded response.
        mode: ``"auto"`` (no tags at all: the whole text is the answer; an opened but unclosed block:
            no answer), ``"required"`` (no ``</think>``: no answer, for templates that open the block
            themselves), ``"off"`` (tags ignored, the whole text is the answer).
    Returns:
        ThinkSplit.
    """
    if mode == "off":
        return ThinkSplit(reasoning="", answer=text, closed=False, opened=False)
    from envs.markup import TOOL_CALL_START, remove_calls, scan_markup

    # one scan serves all three questions; a tag printed by a call's code opens or closes nothing
    mk = scan_markup(text) if THINK_CLOSE in text or TOOL_CALL_START in text else None
    close = _last_think_close(text, mk.calls) if mk is not None else -1
    opened = THINK_OPEN in (remove_calls(text, mk) if mk is not None else text)
    if close >= 0 and mk.depth > 0:  # a block (re)opened or nested is still open at the end
        o = text.find(THINK_OPEN)
        return ThinkSplit(reasoning=text[o + len(THINK_OPEN) :] if o >= 0 else text, answer="", closed=False,
                          opened=opened)
    if close >= 0:
        head = text[:close]
        o = head.find(THINK_OPEN)
        reasoning = head[o + len(THINK_OPEN) :] if o >= 0 else head
        return ThinkSplit(reasoning=reasoning, answer=text[close + len(THINK_CLOSE) :], closed=True, opened=opened)
    if opened or mode == "required":
        o = text.find(THINK_OPEN)
        reasoning = text[o + len(THINK_OPEN) :] if o >= 0 else text
        return ThinkSplit(reasoning=reasoning, answer="", closed=False, opened=opened)
    return ThinkSplit(reasoning="", answer=text, closed=False, opened=False)
