"""Fast exact evaluation of plain numeric answers (the scorer's fast path before math-verify).

Most math answers are integers, fractions, decimals or simple radicals. ``evaluate`` reads that
subset of (normalised) LaTeX with a small recursive-descent parser and returns its value, exactly
(``fractions.Fraction``) where the expression has no irrational part, else as a float. Anything outside
the subset (variables, ``\\pi``, sets, intervals, text, ...) gives None and is left to math-verify.

Grammar (after ``normalize_answer``)::

    expr   := term (('+'|'-') term)*
    term   := unary (('*'|'/'|'\\cdot'|'\\times'|'\\div'|implicit) unary)*
    unary  := ('-'|'+') unary | power
    power  := atom ('^' (atom | '{' expr '}'))?
    atom   := number | '\\frac{' expr '}{' expr '}' | '\\sqrt' ('[' expr ']')? '{' expr '}'
              | '(' expr ')' | '{' expr '}'

Work is bounded: input length <= 200 characters, integer exponents with |e| <= 64 and results with
magnitude < 1e60, so no input can make it slow.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

__all__ = ["NumValue", "evaluate", "numeric_equal"]

_MAX_LEN = 200
_MAX_EXP = 64
_MAX_MAG = 10**60
_TOKEN_RE = re.compile(r"\d+\.\d*|\.\d+|\d+|\\frac|\\sqrt|\\cdot|\\times|\\div|[-+*/^(){}\[\]]")


@dataclass(frozen=True)
class NumValue:
    """Value of a numeric answer.

    Attributes:
        value: exact ``Fraction`` when ``exact`` else ``float``.
        exact: True when no irrational operation (non-square root) was involved.
        decimal: True when the text held a decimal point (the writer may have rounded).
    """

    value: Fraction | float
    exact: bool
    decimal: bool


class _Fail(Exception):
    pass


class _Parser:
    def __init__(self, tokens: list[str]):
        self.t = tokens
        self.i = 0
        self.decimal = False

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, tok: str | None = None) -> str:
        cur = self.peek()
        if cur is None or (tok is not None and cur != tok):
            raise _Fail
        self.i += 1
        return cur

    def expr(self):
        v = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            w = self.term()
            v = _add(v, w) if op == "+" else _add(v, _neg(w))
        return v

    def term(self):
        v = self.unary()
        while True:
            p = self.peek()
            if p in ("*", "\\cdot", "\\times"):
                self.take()
                v = _mul(v, self.unary())
            elif p in ("/", "\\div"):
                self.take()
                v = _div(v, self.unary())
            elif p is not None and (p[0].isdigit() or p[0] == "." or p in ("\\frac", "\\sqrt", "(")):
                v = _mul(v, self.unary())  # implicit multiplication: 2\sqrt{3}
            else:
                return v

    def unary(self):
        p = self.peek()
        if p == "-":
            self.take()
            return _neg(self.unary())
        if p == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek() == "^":
            self.take()
            if self.peek() == "{":
                self.take("{")
                e = self.expr()
                self.take("}")
            else:
                tok = self.take()
                if not tok.isdigit() or len(tok) != 1:
                    raise _Fail  # LaTeX x^23 means x^2 * 3: keep the grammar honest, defer
                e = (Fraction(int(tok)), True)
            return _pow(base, e)
        return base

    def atom(self):
        tok = self.take()
        if tok[0].isdigit() or tok[0] == ".":
            if "." in tok:
                self.decimal = True
            return (Fraction(tok), True)
        if tok == "\\frac":
            self.take("{")
            a = self.expr()
            self.take("}")
            self.take("{")
            b = self.expr()
            self.take("}")
            return _div(a, b)
        if tok == "\\sqrt":
            n = (Fraction(2), True)
            if self.peek() == "[":
                self.take("[")
                n = self.expr()
                self.take("]")
            self.take("{")
            a = self.expr()
            self.take("}")
            return _root(a, n)
        if tok == "(":
            v = self.expr()
            self.take(")")
            return v
        if tok == "{":
            v = self.expr()
            self.take("}")
            return v
        raise _Fail


def _check(v):
    if abs(v[0]) >= _MAX_MAG:
        raise _Fail
    return v


def _neg(a):
    return (-a[0], a[1])


def _add(a, b):
    if a[1] and b[1]:
        return _check((a[0] + b[0], True))
    return _check((float(a[0]) + float(b[0]), False))


def _mul(a, b):
    if a[1] and b[1]:
        return _check((a[0] * b[0], True))
    return _check((float(a[0]) * float(b[0]), False))


def _div(a, b):
    if b[0] == 0:
        raise _Fail
    if a[1] and b[1]:
        return _check((a[0] / b[0], True))
    return _check((float(a[0]) / float(b[0]), False))


def _pow(a, e):
    ev = e[0]
    if not e[1] or Fraction(ev).denominator != 1 or abs(ev) > _MAX_EXP:
        raise _Fail  # non-integer or huge exponents: math-verify decides
    k = int(ev)
    if a[0] == 0:
        if k <= 0:
            raise _Fail  # 0^0 and 0^-k: leave to math-verify
        return (Fraction(0), True) if a[1] else (0.0, False)
    if a[1]:
        if a[0] != 0 and abs(math.log10(abs(float(a[0])) or 1e-300)) * abs(k) > 60:
            raise _Fail
        return _check((Fraction(a[0]) ** k, True))
    try:
        return _check((float(a[0]) ** k, False))
    except (OverflowError, ZeroDivisionError) as err:
        raise _Fail from err


def _iroot(n: int, k: int) -> int | None:
    """Exact integer k-th root of n >= 0, or None."""
    if n < 0:
        return None
    r = round(n ** (1.0 / k)) if n < 2**1000 else None
    if r is None:
        return None
    for c in (r - 1, r, r + 1):
        if c >= 0 and c**k == n:
            return c
    return None


def _root(a, n):
    if not n[1] or Fraction(n[0]).denominator != 1 or not (2 <= n[0] <= _MAX_EXP):
        raise _Fail
    k = int(n[0])
    x = a[0]
    if x < 0:
        if k % 2 == 0:
            raise _Fail  # complex: leave to math-verify
        v = _root((-x, a[1]), n)
        return (-v[0], v[1])
    if a[1]:
        fx = Fraction(x)
        p, q = _iroot(fx.numerator, k), _iroot(fx.denominator, k)
        if p is not None and q is not None:
            return (Fraction(p, q), True)
    return (float(x) ** (1.0 / k), False)


@lru_cache(maxsize=65536)
def evaluate(text: str) -> NumValue | None:
    """Value of a normalised numeric answer, or None when it is outside the supported subset.

    Args:
        text: a normalised answer (see ``normalize_answer``), e.g. ``"\\frac{3}{4}"``, ``"2\\sqrt{3}"``,
            ``"-0.5"``.
    Returns:
        NumValue or None. Never raises.
    """
    if not text or len(text) > _MAX_LEN:
        return None
    if _TOKEN_RE.sub("", text).strip():
        return None  # characters outside the grammar (letters, \pi, commas, ...)
    toks = _TOKEN_RE.findall(text)
    p = _Parser(toks)
    try:
        val, exact = p.expr()
        if p.i != len(toks):
            return None
    except (_Fail, ZeroDivisionError, OverflowError, ValueError):
        return None
    if not exact and not math.isfinite(val):
        return None
    return NumValue(value=val, exact=exact, decimal=p.decimal)


def numeric_equal(a: NumValue, b: NumValue, rel_tol: float = 1e-9) -> bool | None:
    """Compare two numeric answers; None when the answer needs math-verify's judgement.

    Exact values compare exactly. A value written with a decimal point that is not exactly equal is
    undecided (math-verify applies its own rounding rules to decimals). Irrational values (radicals)
    compare by float value with relative tolerance ``rel_tol``: two different radical expressions of
    this small grammar cannot agree to 9 significant digits.

    Returns:
        True (equal), False (different) or None (undecided).
    """
    if a.exact and b.exact:
        if a.value == b.value:
            return True
        return None if (a.decimal or b.decimal) else False
    x, y = float(a.value), float(b.value)
    close = abs(x - y) <= rel_tol * max(1.0, abs(x), abs(y))
    if close:
        return True
    return None if (a.decimal or b.decimal) else False
