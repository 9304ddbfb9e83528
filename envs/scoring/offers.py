"""What an answer offers: the values of a chain of relations or alternatives, and the variables it names.

A final answer can offer more than one value: ``5 = 7``, ``\\frac{10}{2} = 5``, ``5 \\to 7``, ``5 \\Rightarrow 7``,
``5 \\approx 7``, ``5 \\text{ or } 7``, ``5 \\lor 7``, ``5 (\\text{or } 7)``, ``5 \\text{ (or 7)}``, ``either 5 or
7``. Such an answer is a hedge unless every value it offers is the answer, so the scorer compares each value
(``envs.scoring.verify``). The side of a chain that names a variable (``x = 5``, ``a_{n} = 5``, ``\\alpha = 5``,
``f(x) = 5``, ``(x, y) = (1, 2)``) is a label, not a value; when the ground truth is a number, any side with a
variable in it (``x + y = 5``, ``2x = 10``) is part of the question restated, not a value offered.

Left alone (``offers`` returns None, the answer is scored as written): answers without these separators, lists
(a comma, a semicolon or the word "and" outside brackets: ``x = 1, y = 2``, ``(x, y) = (5, 8) \\text{and} (8, 5)``),
and chains that hold any other relation (``<``, ``\\le``, ``\\ne``, ``\\in`` ...: ``x > 2 \\text{ or } x < -1`` is an inequality, not a hedge).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from envs.scoring.normalize import GREEK, strip_wrappers

__all__ = ["Offer", "label_key", "offers", "split_top_level"]

_MAX_LEN = 400
# anything that may make an answer a chain or an alternative; answers without it cost one regex search
_CHAIN_WORDS = (
    "to|rightarrow|Rightarrow|longrightarrow|Longrightarrow|implies|impliedby|leftarrow|Leftarrow|longleftarrow"
    "|Longleftarrow|gets|leftrightarrow|Leftrightarrow|longleftrightarrow|Longleftrightarrow|iff|mapsto|longmapsto"
    "|approx|equiv|sim|simeq|cong|doteq|mid"
)
_HINT_RE = re.compile(
    r"=|\\(?:" + _CHAIN_WORDS + r"|lor|vee)(?![A-Za-z])|->"
    r"|(?<![A-Za-z])(?:or|else|otherwise)(?![A-Za-z])",
    re.I,
)
_TEXT_GROUP_RE = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_PAREN_ALT_RE = re.compile(r"\(\s*(?:or|else)\s+([^()]*?)\s*\)", re.I)
_ALT_RE = re.compile(r"(?<![A-Za-z\\])(?:or|else|otherwise)(?![A-Za-z])|\\(?:lor|vee)(?![A-Za-z])", re.I)
_CHAIN_RE = re.compile(
    r"(?<![<>!:=\\])==?(?!=)|:=|\\(?:" + _CHAIN_WORDS + r")(?![A-Za-z])|->|=>|<-"
)
_OTHER_RELATION_RE = re.compile(
    r"(?<![-=])>|<(?!-)|\\(?:le|ge|leq|geq|leqslant|geqslant|lt|gt|ne|neq|in|notin|subset|subseteq|supset|supseteq"
    r"|propto|perp|parallel)(?![A-Za-z])|!="
)
_FILLER_RE = re.compile(
    r"^(?:(?:either|equivalently|alternatively|possibly|perhaps|maybe|simply|just|also)(?![A-Za-z])\s*,?\s*)+", re.I
)
_GREEK = GREEK
_SIMPLE_NAME = r"(?:[A-Za-z]|\\(?:" + _GREEK + r"))(?![A-Za-z])(?:_(?:\{[^{}]*\}|[A-Za-z0-9]))?'*"
# a name (x, a_{n}, \alpha, f(x)) or a tuple of names ((x, y), (a_1, a_2, a_3))
_NAME_RE = re.compile(
    _SIMPLE_NAME + r"(?:\([^()=]*\))?|\(\s*" + _SIMPLE_NAME + r"(?:\s*,\s*" + _SIMPLE_NAME + r")+\s*\)"
)
_LIST_SEP_RE = re.compile(r"[,;]|(?<![A-Za-z\\])and(?![A-Za-z])", re.I)
_LETTER_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]|\\(?:" + _GREEK + r")(?![A-Za-z])")
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_CONSTANTS = {"e", "i", "\\pi", "\\infty"}


@dataclass(frozen=True)
class Offer:
    """The values an answer offers and the variables it names.

    Attributes:
        labels: the names on the left of the chains (``x = 5`` -> ``{"x"}``), spelled by :func:`label_key`.
        values: the values offered, in order, each once (raw text).
        alternatives: whether the values are alternatives (``or`` words, ``\\lor``) rather than one chain.
    """

    labels: frozenset
    values: tuple
    alternatives: bool


def label_key(name: str) -> str:
    """One spelling of a variable name: no spaces, single-character subscripts without braces (``a_{n}`` -> ``a_n``)."""
    s = re.sub(r"\s+", "", name)
    return re.sub(r"_\{(.)\}", r"_\1", s)


def _top_level(s: str, pattern: re.Pattern) -> list[re.Match]:
    """Matches of ``pattern`` in ``s`` outside brackets (``{}``, ``()``, ``[]``, ``\\{\\}``)."""
    depth = [0] * (len(s) + 1)
    d = 0
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            d += 1 if s[i + 1] == "{" else -1
            depth[i] = depth[i + 1] = max(d, 0)
            i += 2
            continue
        if c in "{([":
            d += 1
        elif c in "})]":
            d -= 1
        depth[i] = max(d, 0) if c not in "})]" else max(d + 1, 0)
        i += 1
    return [m for m in pattern.finditer(s) if depth[m.start()] == 0]


def split_top_level(s: str, pattern: re.Pattern) -> list[str]:
    """``s`` split at the matches of ``pattern`` outside brackets (``{}``, ``()``, ``[]``, ``\\{\\}``): ``"(1, 2), 3"``
    split at commas is ``["(1, 2)", " 3"]``. Linear in ``len(s)`` plus the pattern's search."""
    parts, last = [], 0
    for m in _top_level(s, pattern):
        parts.append(s[last : m.start()])
        last = m.end()
    parts.append(s[last:])
    return parts


def _has_variable(s: str) -> bool:
    """Whether ``s`` holds a letter that is no constant (``e``, ``i``, ``\\pi``) outside command names."""
    return any(m.group(0) not in _CONSTANTS for m in _LETTER_RE.finditer(_TEXT_GROUP_RE.sub(" ", s)))


@lru_cache(maxsize=16384)
def offers(answer: str, numeric_gold: bool = False) -> Offer | None:
    """The values and labels of a chain or an alternative (module docstring), or None for anything else.

    Args:
        answer: an extracted answer or a ground truth (raw; wrappers such as ``$`` and ``\\boxed{}`` are removed).
        numeric_gold: the ground truth is a number, so sides with a variable in them are no values.
    Returns:
        Offer, or None when the answer is no chain, no alternative and no assignment. Never raises.
    """
    if not answer or len(answer) > _MAX_LEN or _HINT_RE.search(answer) is None:
        return None
    s = strip_wrappers(answer)
    prev = None
    while prev != s:  # \text{ or } -> " or ", \textbf{(or 7)} -> " (or 7) "
        prev, s = s, _TEXT_GROUP_RE.sub(lambda m: " " + m.group(1) + " ", s)
    s = _PAREN_ALT_RE.sub(lambda m: " or " + m.group(1), s)  # 5 (or 7): an alternative in parentheses
    s = s.strip().rstrip(".").strip()
    if _top_level(s, _LIST_SEP_RE) or _top_level(s, _OTHER_RELATION_RE):
        return None  # a list, or a relation other than equality: scored as written
    alts = [_FILLER_RE.sub("", a.strip()).strip() for a in split_top_level(s, _ALT_RE)]
    labels: set[str] = set()
    values: list[str] = []
    chained = False
    for alt in alts:
        sides = [x.strip() for x in split_top_level(alt, _CHAIN_RE)]
        if any(not x for x in sides):
            return None  # "= 5", "x =": malformed, scored as written
        chained = chained or len(sides) > 1
        if len(sides) > 1 and _NAME_RE.fullmatch(sides[0]) and sides[0] not in _CONSTANTS:
            labels.add(label_key(sides[0]))
            sides = sides[1:]
        for x in sides:
            if numeric_gold and len(sides) > 1 and _has_variable(x):
                continue  # x + y = 5 against a number: the question restated
            values.append(x)
    if len(alts) == 1 and not chained:
        return None
    return Offer(labels=frozenset(labels), values=tuple(dict.fromkeys(values)), alternatives=len(alts) > 1)
