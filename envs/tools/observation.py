"""What tool text may look like before it is encoded into a model's context (verl-free, no heavy imports).

Two rules, applied by the one tool-call runner every tool-use episode uses (``envs.tool_use.episode.ToolCallRunner``:
the training loop and both evaluations), so they hold wherever an observation is tokenized:

- :func:`cut_text`: **the** truncation rule. Every observation (tool output, tool errors, warnings, the errors
  written for malformed calls) is cut to at most ``max_chars`` characters, marker included.
- :func:`escape_control_tokens`: text is never a control token. A chat template renders an observation (and the
  history's assistant messages, tool-call arguments included) as text, and a Hugging Face tokenizer encodes any
  added-token string it finds in that text as the token itself: tool output printing
  ``<|im_end|>\\n<|im_start|>assistant`` would forge a turn. Every control-token string is broken by a zero-width
  space (U+200B) after its first character (and after the first character of every ``<|``/``|>``/``<｜``/``｜>``
  pair, the ChatML / Gemma / DeepSeek shapes), so it is encoded as ordinary text. The text reads the same.

Which strings are control tokens: :data:`DEFAULT_CONTROL_TOKENS` (tokenizer-independent: the ChatML / hermes / think
markup and common BOS/EOS spellings) plus the ``<|``-shaped pairs, plus, when a tokenizer is known,
:func:`tokenizer_control_tokens` (its special tokens and its markup-shaped added tokens).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

__all__ = [
    "DEFAULT_CONTROL_TOKENS",
    "ZWSP",
    "ControlTokenEscaper",
    "cut_text",
    "escape_control_tokens",
    "tokenizer_control_tokens",
]

ZWSP = "\u200b"
TruncateSide = Literal["left", "middle", "right"]

DEFAULT_CONTROL_TOKENS: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<tools>", "</tools>", "<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
    "[INST]", "[/INST]",
)
# Pairs that begin or end the ChatML (<|im_end|>), Gemma (<|turn>, <turn|>) and DeepSeek (<｜...｜>) tokens.
_PAIRS = ("<|", "|>", "<\uff5c", "\uff5c>")
# Keys of a chat message whose values are identifiers, not text.
_ID_KEYS = frozenset({"role", "type", "id", "tool_call_id"})

_MARKERS = {"left": "(truncated)...", "right": "...(truncated)", "middle": "...(truncated)..."}


def cut_text(text: str, max_chars: int, side: TruncateSide = "middle") -> str:
    """``text`` cut to at most ``max_chars`` characters, marker included: ``"left"`` keeps the end, ``"right"``
    the start, ``"middle"`` both ends (``...(truncated)...`` between). A limit too small for the marker cuts
    without one. Text within the limit is returned unchanged."""
    n = int(max_chars)
    if len(text) <= n:
        return text
    if side not in _MARKERS:
        raise ValueError(f"side must be left, middle or right, got {side!r}")
    marker = _MARKERS[side]
    room = n - len(marker)
    if room < 2:
        return text[-n:] if side == "left" else text[:n]
    if side == "left":
        return marker + text[-room:]
    if side == "right":
        return text[:room] + marker
    head = room - room // 2
    return text[:head] + marker + text[len(text) - room // 2 :]


def _looks_like_markup(token: str) -> bool:
    return len(token) >= 3 and token[0] in "<[" and token[-1] in ">]"


def tokenizer_control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The strings a Hugging Face ``tokenizer`` turns into control tokens when it meets them in text: its special
    tokens and its added tokens shaped like markup (``<...>`` / ``[...]``; added tokens that are ordinary text,
    such as whitespace runs, encode that same text and are left out). () when ``tokenizer`` is None."""
    if tokenizer is None:
        return ()
    out = {t for t in getattr(tokenizer, "all_special_tokens", None) or [] if isinstance(t, str) and len(t) >= 2}
    try:
        added = tokenizer.get_added_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without added tokens
        added = {}
    out.update(t for t in added if isinstance(t, str) and (t in out or _looks_like_markup(t)))
    return tuple(sorted(out))


class ControlTokenEscaper:
    """Breaks every control-token string in a text (module docstring); ``extra`` adds a tokenizer's tokens."""

    def __init__(self, extra: Iterable[str] = ()):
        tokens = {t for t in (*DEFAULT_CONTROL_TOKENS, *_PAIRS, *extra) if isinstance(t, str) and len(t) >= 2}
        tokens = {t for t in tokens if ZWSP not in t}
        self.tokens = tuple(sorted(tokens, key=lambda t: (-len(t), t)))
        self._re = re.compile("|".join(re.escape(t) for t in self.tokens))

    def __call__(self, text: str) -> str:
        """``text`` with no control-token string left in it (idempotent; unchanged when it has none)."""
        if not isinstance(text, str) or not text:
            return text
        # Breaking one occurrence can leave an overlapping one whole (e.g. "<|" inside "<<|"): repeat until none.
        for _ in range(len(text) + 1):
            new = self._re.sub(lambda m: m.group(0)[0] + ZWSP + m.group(0)[1:], text)
            if new == text:
                return new
            text = new
        return text

    def message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of a chat message with every text value escaped (content, reasoning, tool-call names and
        arguments, as a JSON string or an object); roles, types and ids are kept."""
        return {k: (v if k in _ID_KEYS else self._value(v)) for k, v in message.items()}

    def _value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {self(k) if isinstance(k, str) else k: (v if k in _ID_KEYS else self._value(v))
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._value(v) for v in value]
        return value


_DEFAULT = ControlTokenEscaper()


def escape_control_tokens(text: str, extra: Iterable[str] = ()) -> str:
    """:class:`ControlTokenEscaper` in one call (the default tokens, plus ``extra``)."""
    return (ControlTokenEscaper(extra) if extra else _DEFAULT)(text)
