"""Normalisation of extracted answers: the formats naive string scorers get wrong.

``normalize_answer`` maps surface variants of the same answer to one string, so that the fast path
(string equality) already accepts them and math-verify sees clean LaTeX:

- ``\\dfrac``/``\\tfrac`` -> ``\\frac``; ``\\frac34`` -> ``\\frac{3}{4}``; ``\\sqrt2`` -> ``\\sqrt{2}``
- ``\\boxed{..}``/``\\fbox{..}`` wrappers, ``$``, ``\\left``/``\\right``, ``\\displaystyle``, spacing
  commands (``\\,`` ``\\;`` ``\\:`` ``\\ `` ``~``) and whitespace removed
- units: a trailing ``\\text{ cm}``/``\\mbox{..}``/``\\mathrm{..}`` after a number, and plain unit
  words (cm, meters, dollars, degrees, ...) after a number
- ``\\!`` (a negative thin space, ``16,\\!386``) removed without a trace
- ``\\%``, ``%``, degrees (``^\\circ``, ``°``, ``^{o}`` after a digit), currency (``\\$``) removed
- an operator's typography: ``\\limits``, ``\\nolimits``, ``\\textstyle`` (and the other styles) removed,
  ``\\mathop{\\sum}`` -> ``\\sum``, a script in double braces ``_{{k=1}}`` -> ``_{k=1}``
- thousands separators: ``1,000``, ``1{,}000``, ``12,345.5`` -> digits only (only when the whole answer
  is such a number, so tuples such as ``(1,2)`` are untouched; a comma followed by whitespace separates list
  items, so ``12, 345`` (two adjacent boxes) stays a list); digit groups separated by spaces
  (``1 000 000``, ``1\\,000``) are joined only when they are thousands groups (first group 1-3 digits,
  the others 3); a whole answer of other space-separated integers is a list (``1 2`` -> ``1,2``: never 12,
  and not 3 as math-verify would read it); other digits separated by a space (``x^2 3``) keep one space
- Python/C float literals from tool output (``3.0e+08``, ``2.5e-07``, ``1e-05``, ``6.02E23``) ->
  ``3.0\\times10^{8}``: a mantissa with a decimal point and any exponent, or an integer mantissa with a
  signed exponent of two or more digits (``2e+1``, ``2e10`` stay: ``e`` may be Euler's number)
- an assignment ``x=5``, ``x_1=5``, ``\\alpha=5``, ``(x,y)=(1,2)`` (a name, a name with a simple subscript, a Greek
  letter or a tuple of names on the left) -> ``5`` (``envs.scoring.verify`` compares the names first when both sides
  name one); an operator's bounds are never a name (``\\sum_{k=1}^{n}k^2`` stays as written)
- ``and`` between list items (``(5,8) \\text{and} (8,5)``) -> a comma
- notations read by :func:`read_notations` first: full-width punctuation, repeating decimals, degrees inside
  trigonometric functions
- a command written with parentheses instead of braces is read as the command, as math-verify's own LaTeX
  normalisation reads ``\\sqrt(3)``: ``\\sqrt(3)`` -> ``\\sqrt{3}``, ``\\sqrt[3](8)`` -> ``\\sqrt[3]{8}``,
  ``\\frac(1)(2)``, ``\\frac{1}(2)``, ``\\frac(1){2}`` -> ``\\frac{1}{2}``, ``\\binom(4)(2)`` -> ``\\binom{4}{2}``
  (unbalanced parentheses are left as written: ``envs.scoring.verify`` does not score them)
- ``\\left``/``\\right`` go, never the start of ``\\rightarrow``, ``\\leftarrow`` or ``\\leftrightarrow``
- a unit that is also a letter (``m``, ``g``, ``in``, ``m^2``) goes only when the caller's ``keep`` names none of
  its letters: ``normalize_answer("2m", keep=frozenset("m"))`` is ``2m`` (the ground truth has a variable m)
- a whole-answer ``\\text{Monday}`` -> ``Monday``; a trailing full stop removed

The rules are applied to both the prediction and the ground truth.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

__all__ = [
    "LETTER_UNITS",
    "clear_normalize_cache",
    "dotted_repeating",
    "normalize_answer",
    "read_notations",
    "rewrite_paren_commands",
    "strip_wrappers",
]

_MAX_LEN = 2000  # answers longer than this are not normalised further (math-verify decides)

_UNIT_WORDS = (
    "square units|sq units|units?|cm\\^?2?|mm|km|m\\^?2?|meters?|metres?|centimeters?|millimeters?|kilometers?|"
    "inches|inch|in|feet|foot|ft|yards?|miles?|mph|km/h|hours?|hrs?|minutes?|mins?|seconds?|secs?|days?|"
    "weeks?|months?|years?|dollars?|cents?|euros?|pounds?|lbs?|kg|grams?|g|degrees?|deg|percent|"
    "liters?|litres?|ml|gallons?|ounces?|oz|people|students|ways|points|sq\\.? ?ft"
)
_TRAILING_UNIT_RE = re.compile(r"^(?P<num>[-+]?[\d.,/{}\\a-z]*\d[\d.,}]*)\s*(?:" + _UNIT_WORDS + r")\.?$", re.I)
_TEXT_CMD_RE = re.compile(r"\\(?:mbox|textbf|textrm|textit|mathrm|mathbf|operatorname|textnormal|mathit)\s*\{")
_TRAILING_TEXT_RE = re.compile(r"^(?P<body>.*?[\d}])\s*(?:\\text\{[^{}]*\}(?:\^\{?\d\}?)?)+\s*$")
LETTER_UNITS = frozenset({"m", "g", "in"})  # units that read as variables too (2m, 7g, 2in = 2*i*n)
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_PAREN_CMD_RE = re.compile(r"\\(sqrt|frac|binom|dbinom|tbinom)(?![A-Za-z])\s*(\[[^\[\]]*\]\s*)?(?=[({])")
_SHORT = 200  # unit-stripping regexes backtrack; only run them on short answers
_CHOICE_RE = re.compile(r"^\(([A-Za-z])\)$")
_WHOLE_TEXT_RE = re.compile(r"^\\text\{([^{}]*)\}$")
_THOUSANDS_RE = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_COMMA_SPACE_RE = re.compile(r"(?<=\d),\s+(?=\d)")  # a comma then whitespace between digits separates items
GREEK = (
    "alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma|tau"
    "|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega"
)
# a name: a letter or a Greek letter, with at most a simple subscript (x_1, x_{12}, a_n); never another command
_NAME = r"(?:[A-Za-z]|\\(?:" + GREEK + r"))(?![A-Za-z])(?:_(?:[A-Za-z0-9]|\{[A-Za-z0-9]+\}))?'*"
_ASSIGN_RE = re.compile(
    r"^(?:" + _NAME + r"|\(\s*" + _NAME + r"(?:\s*,\s*" + _NAME + r")+\s*\))\s*=\s*(?P<rhs>[^=<>]+)$"
)
_AND_RE = re.compile(r"\s*,?\s*(?:\\text\{\s*and\s*\}|(?<![A-Za-z\\])and(?![A-Za-z]))\s*")
_FRAC_SHORT_RE = re.compile(r"\\frac(?![A-Za-z])\s*([0-9A-Za-z])\s*([0-9A-Za-z])")
_FRAC_HALF_SHORT_RE = re.compile(r"\\frac(?![A-Za-z])\s*\{([^{}]*)\}\s*(\d)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(?![A-Za-z])\s*([0-9A-Za-z])")
# typographic forms of an operator: its limits' placement and the math style change nothing
_OPERATOR_STYLE_RE = re.compile(r"\\(?:no)?limits(?![A-Za-z])|\\(?:display|text|script|scriptscript)style(?![A-Za-z])")
_MATHOP_RE = re.compile(r"\\mathop\s*\{\s*(\\[A-Za-z]+)\s*\}")  # \mathop{\sum} is \sum
_SCRIPT_DOUBLE_BRACE_RE = re.compile(r"([_^])\s*\{\s*\{([^{}]*)\}\s*\}")  # _{{k=1}} is _{k=1}
_SPACING_RE = re.compile(r"\\[,;:> ]|~|\\quad|\\qquad")
_DEGREE_RE = re.compile(
    r"(?<=[\d}.])\s*\^\s*\{?\s*\\circ\s*\}?|(?<=[\d}.])\s*\\circ(?![A-Za-z])"
    r"|(?<=\d)\s*\^\s*(?:\{\s*o\s*\}|o(?![A-Za-z]))"  # 30^{o}: a degree sign written as a letter o
)
_WS_RE = re.compile(r"(\\[A-Za-z]+)?\s+(?=(.?))", re.S)
_WRAPPER_RE = re.compile(r"^\\(?:boxed|fbox)\s*\{(.*)\}$", re.S)
_FLOAT_LITERAL_RE = re.compile(r"(?<![\w.\\])(?P<m>\d+\.\d*|\.\d+|\d+)[eE](?P<e>[-+]?\d+)(?![\w.])")
# any whitespace between digits (newlines, no-break and thin spaces included) is a digit-group gap
_DIGIT_RUN_RE = re.compile(r"(?<![\d.])\d+(?:\.\d+)?(?:\s+\d+(?:\.\d+)?)+(?![\d.])")
_THOUSANDS_SPACED_RE = re.compile(r"\d{1,3}(?:\s+\d{3})+(?:\.\d+)?")
_KEPT_SPACE = "\ue000"  # a space between digits that whitespace removal must keep (restored at the end)
_SPACED_LIST_RE = re.compile("[-+]?\\d+(?:" + _KEPT_SPACE + "\\d+)+")


def strip_wrappers(s: str) -> str:
    """Remove surrounding ``$..$``, ``\\(..\\)``, ``\\[..\\]`` and ``\\boxed{}``/``\\fbox{}`` wrappers."""
    prev = None
    while prev != s:
        prev = s
        s = s.strip()
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$")
        if s.startswith("\\(") and s.endswith("\\)"):
            s = s[2:-2]
        if s.startswith("\\[") and s.endswith("\\]"):
            s = s[2:-2]
        m = _WRAPPER_RE.match(s)
        if m and _balanced(m.group(1)):
            s = m.group(1)
    return s


# Full-width forms (U+FF01..U+FF5E) are ASCII shifted by 0xFEE0; a full-width or ideographic comma separates
# list items (never thousands), so it becomes ", " (see the thousands rule)
_FULL_WIDTH = {c: chr(c - 0xFEE0) for c in range(0xFF01, 0xFF5F)}
_FULL_WIDTH.update({0xFF0C: ", ", 0x3001: ", ", 0x3000: " ", 0x3002: ".", 0x2212: "-"})
_DIGITS = r"(?P<int>\d*)\.(?P<pre>\d*)"
_REPEAT_RE = re.compile(
    r"(?<![\d.\w])" + _DIGITS + r"(?:"
    r"\\(?:overline|bar)\s*(?:\{\s*(?P<bar>\d+)\s*\}|(?P<bar1>\d))"  # 0.1\overline{6}, 0.\bar{3}, 0.\bar3
    r"|\((?P<par>\d+)\)"  # 0.(3), 0.1(6)
    r"|\\dot\s*\{?\s*(?P<d1>\d)\s*\}?(?:(?P<mid>\d*)\\dot\s*\{?\s*(?P<d2>\d)\s*\}?)?"  # 0.\dot{3}, 0.\dot{1}2\dot{3}
    r")(?![\d.\w(])"
)
_TRIG_DEGREE_RE = re.compile(
    r"\\(?P<f>sin|cos|tan|cot|sec|csc)(?![A-Za-z])\s*(?P<pow>\^\s*(?:\{\s*-?\d+\s*\}|\d))?\s*"
    r"(?:(?P<o>\\left\s*\(|\(|\{)\s*)?(?P<n>[-+]?\d+(?:\.\d+)?)\s*"
    r"(?:\^\s*\{?\s*\\circ\s*\}?|\\circ(?![A-Za-z])|°|\\degree(?![A-Za-z])|\^\s*(?:\{\s*o\s*\}|o(?![A-Za-z])))"
    r"(?(o)\s*(?:\\right\s*\)|\)|\}))"
)


_MAX_PERIOD_DIGITS = 200  # a repeating decimal with more digits than this is left as written
# a whole answer that is a decimal ending in repeated digits and an ellipsis: 0.333..., 0.1666\ldots, 0.1212\dots
_DOTTED_REPEAT_RE = re.compile(
    r"\s*(?P<sign>[-+]?)\s*(?P<int>\d*)\.(?P<frac>\d+)\s*"
    r"(?:\.\s*\.\s*\.|…|\\(?:[lc]?dots[cb]?|mathellipsis|textellipsis)(?![A-Za-z])\s*(?:\{\s*\})?)\s*"
)


def _fraction_text(whole: str, pre: str, rep: str) -> str | None:
    """``whole.pre(rep)(rep)...`` as ``\\frac{p}{q}`` (or an integer); None when it has too many digits."""
    if len(whole) + len(pre) + len(rep) > _MAX_PERIOD_DIGITS:
        return None
    den = 10 ** len(pre) * (10 ** len(rep) - 1)
    num = int(whole or "0") * den + int(pre or "0") * (10 ** len(rep) - 1) + int(rep)
    val = Fraction(num, den)
    return str(val.numerator) if val.denominator == 1 else f"\\frac{{{val.numerator}}}{{{val.denominator}}}"


def _repeating(m: re.Match) -> str:
    if m.group("d1") is not None:
        rep = m.group("d1") + ((m.group("mid") or "") + m.group("d2") if m.group("d2") is not None else "")
    else:
        rep = m.group("bar") or m.group("bar1") or m.group("par")
    return _fraction_text(m.group("int"), m.group("pre"), rep) or m.group(0)


def _period(frac: str) -> int:
    """Length of the period the decimal digits ``frac`` end with: one digit written at least three times
    (``3333``, ``1666``) or a block of two or more written at least twice (``1212``, ``142857142857``); 0 for
    none (``14159``, ``33``)."""
    for size in range(1, len(frac) // 2 + 1):
        times = 3 if size == 1 else 2
        if len(frac) >= size * times and frac[-size * times :] == frac[-size:] * times:
            return size
    return 0


def dotted_repeating(s: str) -> str | None:
    """A whole answer written as a decimal whose digits end in a repetition and then an ellipsis (``0.333...``,
    ``0.3333\\dots``, ``0.1666\\ldots``, ``-0.1212…``) as the exact fraction it repeats (``\\frac{1}{3}``,
    ``\\frac{1}{6}``, ``-\\frac{4}{33}``); None for anything else: a decimal without a repetition (``3.14159...``: no
    number, the ellipsis rule of ``envs.scoring.verify`` compares it as written), a list with an ellipsis
    (``0.1, 0.2, \\ldots``), text around the number."""
    m = _DOTTED_REPEAT_RE.fullmatch(s) if len(s) <= _MAX_PERIOD_DIGITS else None
    if m is None:
        return None
    frac = m.group("frac")
    size = _period(frac)
    if not size:
        return None
    pre = frac[: len(frac) - size]
    while len(pre) >= size and pre[-size:] == frac[-size:]:  # 0.3333: pre "", period "3"
        pre = pre[:-size]
    val = _fraction_text(m.group("int"), pre, frac[-size:])
    if val is None:
        return None
    return ("-" if m.group("sign") == "-" else "") + val


def _trig_degrees(m: re.Match) -> str:
    return f"\\{m.group('f')}{m.group('pow') or ''}(\\frac{{{m.group('n')}\\pi}}{{180}})"


def read_notations(s: str) -> str:
    """Rewrite notations that math-verify and the numeric path do not read into ones they do.

    - full-width punctuation and letters (``１，２``, ``（１，２）``, ``３．５``, ``１：２``, ``－３``) -> ASCII; a
      full-width or ideographic comma (``，`` ``、``) -> ``", "`` (a list separator, never thousands); the
      ideographic full stop and the minus sign U+2212 -> ``.`` and ``-``
    - repeating decimals -> an exact fraction: ``0.\\overline{3}``, ``0.\\bar{3}``, ``0.(3)``, ``0.\\dot{3}`` ->
      ``\\frac{1}{3}``; ``0.1\\overline{6}`` -> ``\\frac{1}{6}``; ``0.\\dot{1}2\\dot{3}`` (dots over the first and
      last repeated digit) -> ``\\frac{41}{333}``; a whole answer that ends its digits in a repetition and then an
      ellipsis (``0.333...``, ``0.1666\\ldots``; :func:`dotted_repeating`) too. More than ``_MAX_PERIOD_DIGITS``
      digits: left as written. (``envs.scoring.verify`` also tries ``0.5(2)`` as math-verify reads it, a product.)
    - degrees inside a trigonometric function (``^\\circ``, ``°``, ``\\degree`` or ``^{o}``) -> radians: ``\\sin 30^\\circ``, ``\\cos(60°)``,
      ``\\tan^2{45^{\\circ}}`` -> ``\\sin(\\frac{30\\pi}{180})`` ... (without a degree mark the argument is radians)

    Args:
        s: an answer or ground truth (raw LaTeX).
    Returns:
        the rewritten string (``s`` itself when none applies). Never raises; linear-time regexes only.
    """
    if not s.isascii():
        s = s.translate(_FULL_WIDTH)
    if "." in s or "…" in s:
        dotted = dotted_repeating(s)
        if dotted is not None:
            return dotted
        if "\\" in s or "(" in s:
            s = _REPEAT_RE.sub(_repeating, s)
    if "\\" in s and ("^" in s or "°" in s or "degree" in s):
        s = _TRIG_DEGREE_RE.sub(_trig_degrees, s)
    return s


def _balanced(s: str) -> bool:
    depth = 0
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return False
        i += 1
    return depth == 0


def _group_end(s: str, i: int) -> int:
    """Index after the bracket group opening at ``s[i]`` (``(`` or ``{``, nesting counted), or -1 if unclosed."""
    pairs = {"(": ")", "{": "}"}
    stack = []
    j = i
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")}":
            if not stack or stack.pop() != c:
                return -1
            if not stack:
                return j + 1
        j += 1
    return -1


def rewrite_paren_commands(s: str) -> str:
    """``\\sqrt(3)`` -> ``\\sqrt{3}``, ``\\frac(1)(2)`` -> ``\\frac{1}{2}`` and the like (module docstring); a
    command whose parenthesised argument is unbalanced is left as written. Linear in practice."""
    if "(" not in s or "\\" not in s:
        return s
    out: list[str] = []
    pos = 0
    for m in _PAREN_CMD_RE.finditer(s):
        if m.start() < pos:
            continue
        n_args = 1 if m.group(1) == "sqrt" else 2
        j = m.end()
        args: list[str] = []
        for k in range(n_args):
            while k and j < len(s) and s[j] == " ":
                j += 1
            if j >= len(s) or s[j] not in "({":
                break
            end = _group_end(s, j)
            if end < 0:
                break
            args.append(s[j + 1 : end - 1])
            j = end
        if len(args) != n_args or s[m.end()] == "{" and (n_args == 1 or "(" not in s[m.end() : j]):
            continue  # unbalanced, or already braces only
        out.append(s[pos : m.end()] + "".join("{" + a + "}" for a in args))
        pos = j
    return "".join(out) + s[pos:] if out else s


def _unit_is_variable(unit: str, keep: frozenset) -> bool:
    """Whether a trailing unit word is one of ``LETTER_UNITS`` with a letter in ``keep`` (a variable, not a unit)."""
    letters = re.sub(r"\^\{?\d\}?|[^A-Za-z]", "", unit)
    return letters in LETTER_UNITS and not keep.isdisjoint(letters)


def _float_literal(m: re.Match) -> str:
    mant, exp = m.group("m"), m.group("e")
    if "." not in mant and not (exp[0] in "+-" and len(exp) >= 3):
        return m.group(0)  # 2e+1, 2e10: Euler's number times something, or a float: math-verify decides
    if mant.startswith("."):
        mant = "0" + mant
    if mant.endswith("."):
        mant += "0"
    return f"{mant}\\times10^{{{int(exp)}}}"


def _digit_run(m: re.Match) -> str:
    run = m.group(0)
    if _THOUSANDS_SPACED_RE.fullmatch(run):
        return re.sub(r"\s+", "", run)
    return re.sub(r"\s+", _KEPT_SPACE, run)


def _drop_space(m: re.Match) -> str:
    """Whitespace goes, except one space between a command and a letter (``\\pi r`` is not ``\\pir``)."""
    cmd = m.group(1) or ""
    return cmd + " " if cmd and m.group(2).isalpha() else cmd


@lru_cache(maxsize=65536)
def _normalize_cached(s: str, keep: frozenset) -> str:
    return _normalize(s, keep)


def clear_normalize_cache() -> None:
    """Forget the memoised normalisations of :func:`normalize_answer` (benchmarks, tests)."""
    _normalize_cached.cache_clear()


_NO_KEEP: frozenset = frozenset()


def normalize_answer(ans: str | None, keep: frozenset = _NO_KEEP) -> str:
    """Canonical string for an extracted answer (see the module docstring for the rules).

    Args:
        ans: extracted answer (box content) or ground truth; None gives "".
        keep: letters that are variables of the ground truth: a trailing ``LETTER_UNITS`` word made of them is kept
            (``2m`` stays ``2m`` when ``"m"`` is in ``keep``). Default: none, every unit word goes.
    Returns:
        normalised string ("" for an empty answer). Never raises; linear-time regexes only.
    """
    if ans is None:
        return ""
    return _normalize_cached(str(ans), keep)


def _normalize(s: str, keep: frozenset = _NO_KEEP) -> str:
    if len(s) > _MAX_LEN:
        return s.strip()
    s = strip_wrappers(read_notations(s))
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    s = _LEFT_RIGHT_RE.sub("", s)
    if "\\" in s:
        s = _OPERATOR_STYLE_RE.sub("", s)
        s = _MATHOP_RE.sub(r"\1 ", s)
    if "{{" in s:
        s = _SCRIPT_DOUBLE_BRACE_RE.sub(r"\1{\2}", s)
    s = rewrite_paren_commands(s)
    s = s.replace("\\bigl", "").replace("\\bigr", "").replace("\\Bigl", "").replace("\\Bigr", "")
    s = _TEXT_CMD_RE.sub("\\\\text{", s)
    s = s.replace("{,}", ",").replace("\\!", "")
    s = _SPACING_RE.sub(" ", s)
    # degrees, percent, currency
    s = _DEGREE_RE.sub("", s).replace("°", "")
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "")
    if s.startswith("$") and not s.endswith("$"):
        s = s[1:]
    s = s.strip()
    if "e" in s or "E" in s:
        s = _FLOAT_LITERAL_RE.sub(_float_literal, s)
    s = _DIGIT_RUN_RE.sub(_digit_run, s)
    if _SPACED_LIST_RE.fullmatch(s):  # "1 2": a list of numbers (math-verify would add them up), never 12
        s = s.replace(_KEPT_SPACE, ",")
    # a whole-answer \text{...}
    m = _WHOLE_TEXT_RE.match(s)
    if m:
        s = m.group(1).strip()
    # trailing unit in \text{..} after a number-like body
    if len(s) < _SHORT:
        m = _TRAILING_TEXT_RE.match(s)
        if m and not m.group("body").endswith("\\text{"):
            s = m.group("body")
        m = _TRAILING_UNIT_RE.match(s)
        if m and not (keep and _unit_is_variable(s[m.end("num") :], keep)):
            s = m.group("num")
    s = s.strip().rstrip(".").strip()
    if "and" in s:
        s = _AND_RE.sub(", ", s)
    m = _ASSIGN_RE.match(s)
    if m:
        s = m.group("rhs").strip()
    s = _FRAC_HALF_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    listed = _COMMA_SPACE_RE.search(s) is not None
    s = _WS_RE.sub(_drop_space, s).replace(_KEPT_SPACE, " ")
    if _THOUSANDS_RE.match(s):
        # "12, 345" (two adjacent boxes) is a list, never 12345: keep ", " so math-verify reads a set too (it
        # reads "12,345" as 12345)
        s = s.replace(",", ", ") if listed else s.replace(",", "")
    s = s.rstrip(".")
    m = _CHOICE_RE.match(s)
    if m:
        s = m.group(1)
    # \text{} left empty by unit stripping, and redundant outer braces {5} -> 5
    s = s.replace("\\text{}", "")
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _balanced(s[1:-1]):
        s = s[1:-1]
    return s
