"""Fast exact evaluation of plain numeric answers (the scorer's fast path before math-verify).

Most math answers are integers, fractions, decimals or simple radicals. ``evaluate`` reads that
subset of (normalised) LaTeX with a small recursive-descent parser and returns its value, exactly
(``fractions.Fraction``) where the expression has no irrational part, else as a float. Anything outside
the subset (variables, ``\\pi``, sets, intervals, text, ...) gives None and is left to math-verify.

Grammar (after ``normalize_answer``)::

    expr   := term (('+'|'-') term)*
    term   := unary (('*'|'/'|'\\cdot'|'\\times'|'\\div') unary | <implicit> sqrt)*
    unary  := ('-'|'+') unary | power
    power  := postfix ('^' (digit | '{' expr '}'))?
    postfix:= atom '!'?                       (factorial of an exact integer 0..1000)
    atom   := integer '\\frac{' integer '}{' integer '}'   (a mixed number: whole plus fraction)
              | number | '\\frac{' expr '}{' expr '}' | sqrt | '(' expr ')' | '{' expr '}'
    sqrt   := '\\sqrt' ('[' expr ']')? '{' expr '}'

The fast path is never more lenient than math-verify, which compares floats within a tolerance:

- exact values (integers, fractions, powers, factorials, decimals) stay exact ``Fraction``s, so two
  different values are different however tiny or huge (``10^{-30}`` vs ``10^{-31}``, ``\\frac{1}{20!}``
  vs ``\\frac{1}{21!}``); the work is bounded by the size of the numbers (numerator and denominator at most
  ``_MAX_BITS`` bits, about 3,000 digits, checked before a power or factorial is computed), not by the size
  of an exponent;
- an integer written right before a fraction of integers is a mixed number (``2\\frac{1}{2}`` = 5/2, as
  math-verify reads it), never a product; other juxtapositions (``2(3)``, ``\\frac{1}{2}2``,
  ``2\\frac{x}{2}``) are left to math-verify; implicit multiplication is only read before ``\\sqrt``;
- irrational values are floats, compared relatively; a float that under- or overflows, or a sum that
  cancels (where floats lose their relative precision), is left to math-verify.

Scientific notation (Python's ``3.0e+08``, ``2.5e-07``) arrives here as ``3.0\\times10^{8}`` (see
``normalize_answer``): a decimal, exact.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

__all__ = ["NumValue", "evaluate", "numeric_equal"]

_MAX_LEN = 200
_MAX_BITS = 10_000  # numerator and denominator of an exact value: at most this many bits (~3,010 digits)
_MAX_FACTORIAL = 1000  # 1000! has 2,568 digits
_MAX_ROOT = 64
_FLOAT_RANGE = (1e-200, 1e200)  # nonzero inexact values outside this range are left to math-verify
_CANCEL = 1e-6  # an inexact sum this much smaller than its terms has lost its precision
_TOKEN_RE = re.compile(r"\d+\.\d*|\.\d+|\d+|\\frac|\\sqrt|\\cdot|\\times|\\div|[-+*/^(){}\[\]!]")
_SINGLE_DECIMAL_RE = re.compile(r"[-+]?(?:\d+\.(?P<a>\d*)|\.(?P<b>\d+))(?:\\times10\^\{(?P<e>[-+]?\d+)\})?")


@dataclass(frozen=True)
class NumValue:
    """Value of a numeric answer.

    Attributes:
        value: exact ``Fraction`` when ``exact`` else ``float``.
        exact: True when no irrational operation (non-square root) was involved.
        decimal: True when the text held a decimal point (the writer may have rounded).
        places: when the whole answer is one decimal number (``0.25``, ``-2.5\times10^{-7}``), the power of
            ten of its last written digit, negated (``0.25`` -> 2, ``2.5\times10^{-7}`` -> 8,
            ``3.0\times10^{8}`` -> -7); else None.
    """

    value: Fraction | float
    exact: bool
    decimal: bool
    places: int | None = None


class _Fail(Exception):
    pass


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


class _Parser:
    def __init__(self, tokens: list[str]):
        self.t = tokens
        self.i = 0
        self.decimal = False

    def peek(self, ahead: int = 0) -> str | None:
        j = self.i + ahead
        return self.t[j] if j < len(self.t) else None

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
            elif p == "\\sqrt":
                v = _mul(v, self.unary())  # implicit multiplication: 2\sqrt{3}
            elif p is not None and (p[0].isdigit() or p[0] == "." or p in ("\\frac", "(", "{")):
                raise _Fail  # 2(3), \frac{1}{2}2, 2.5\frac{1}{2}: read differently by different readers
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
        base = self.postfix()
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

    def postfix(self):
        v = self.atom()
        if self.peek() == "!":
            self.take()
            if self.peek() == "!":
                raise _Fail  # double factorial
            v = _factorial(v)
        return v

    def _simple_frac_ahead(self) -> bool:
        """The next tokens are \\frac{<integer>}{<integer>}."""
        return (
            self.peek() == "\\frac" and self.peek(1) == "{" and (self.peek(2) or "").isdigit()
            and self.peek(3) == "}" and self.peek(4) == "{" and (self.peek(5) or "").isdigit() and self.peek(6) == "}"
        )

    def atom(self):
        tok = self.take()
        if tok[0].isdigit() or tok[0] == ".":
            if "." in tok:
                self.decimal = True
            elif self.peek() == "\\frac":
                if not self._simple_frac_ahead():
                    raise _Fail  # 2\frac{x}{2}, 2\frac{-1}{2}: math-verify's reading differs case by case
                whole, num, den = int(tok), int(self.t[self.i + 2]), int(self.t[self.i + 5])
                self.i += 7
                if den == 0 or self.peek() in ("^", "!"):
                    raise _Fail  # 2\frac{1}{2}^2 is read as a product by math-verify
                return _check((whole + Fraction(num, den), True))  # a mixed number
            return _check((Fraction(tok), True))
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
    """An exact value within ``_MAX_BITS``; an inexact one finite and, unless 0, within ``_FLOAT_RANGE``."""
    x, exact = v
    if exact:
        if _bits(x) > _MAX_BITS:
            raise _Fail
        return v
    if not math.isfinite(x) or (x != 0 and not _FLOAT_RANGE[0] <= abs(x) <= _FLOAT_RANGE[1]):
        raise _Fail
    return v


def _float(x) -> float:
    try:
        f = float(x)
    except OverflowError as err:
        raise _Fail from err
    if x != 0 and not _FLOAT_RANGE[0] <= abs(f) <= _FLOAT_RANGE[1]:
        raise _Fail  # the float lost the value (underflow to 0, overflow): leave it to math-verify
    return f


def _neg(a):
    return (-a[0], a[1])


def _add(a, b):
    if a[1] and b[1]:
        return _check((a[0] + b[0], True))
    x, y = _float(a[0]), _float(b[0])
    r = x + y
    if abs(r) < _CANCEL * max(abs(x), abs(y)):
        raise _Fail  # cancellation: the float sum has no relative precision left (\sqrt{8}-2\sqrt{2})
    return _check((r, False))


def _mul(a, b):
    if a[1] and b[1]:
        return _check((a[0] * b[0], True))  # both within _MAX_BITS: the product has at most twice that
    return _check((_float(a[0]) * _float(b[0]), False))


def _div(a, b):
    if b[0] == 0:
        raise _Fail
    if a[1] and b[1]:
        return _check((a[0] / b[0], True))
    return _check((_float(a[0]) / _float(b[0]), False))


def _pow(a, e):
    ev = e[0]
    if not e[1] or Fraction(ev).denominator != 1:
        raise _Fail  # non-integer exponents: math-verify decides
    k = int(ev)
    if a[0] == 0:
        if k <= 0:
            raise _Fail  # 0^0 and 0^-k: leave to math-verify
        return (Fraction(0), True) if a[1] else (0.0, False)
    if a[1]:
        x = Fraction(a[0])
        if abs(x) == 1:
            return (x ** (k % 2), True)
        if (_bits(x) - 1) * abs(k) > _MAX_BITS:
            raise _Fail  # the result would have more than _MAX_BITS bits: known before computing it
        return _check((x**k, True))
    if abs(k) > 4096:
        raise _Fail
    try:
        return _check((_float(a[0]) ** k, False))
    except (OverflowError, ZeroDivisionError) as err:
        raise _Fail from err


def _factorial(a):
    x, exact = a
    if not exact or Fraction(x).denominator != 1 or not 0 <= x <= _MAX_FACTORIAL:
        raise _Fail  # factorial of a non-integer, a negative or a huge number: math-verify decides
    return _check((Fraction(math.factorial(int(x))), True))


def _iroot(n: int, k: int) -> int | None:
    """Exact integer k-th root of n >= 0, or None."""
    if n < 0:
        return None
    if n.bit_length() > _MAX_BITS:
        return None
    r = math.isqrt(n) if k == 2 else round(n ** (1.0 / k)) if n < 2**1000 else None
    if r is None:
        return None
    for c in (r - 1, r, r + 1):
        if c >= 0 and c**k == n:
            return c
    return None


def _root(a, n):
    if not n[1] or Fraction(n[0]).denominator != 1 or not (2 <= n[0] <= _MAX_ROOT):
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
    return _check((_float(x) ** (1.0 / k), False))


def _places(text: str) -> int | None:
    m = _SINGLE_DECIMAL_RE.fullmatch(text)
    if m is None:
        return None
    digits = m.group("a") if m.group("a") is not None else m.group("b")
    return len(digits) - int(m.group("e") or 0)


@lru_cache(maxsize=65536)
def evaluate(text: str) -> NumValue | None:
    """Value of a normalised numeric answer, or None when it is outside the supported subset.

    Args:
        text: a normalised answer (see ``normalize_answer``), e.g. ``"\\frac{3}{4}"``, ``"2\\sqrt{3}"``,
            ``"-0.5"``, ``"2\\frac{1}{2}"`` (5/2), ``"\\frac{1}{20!}"``.
    Returns:
        NumValue or None. Never raises; bounded work (module docstring).
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
    except (_Fail, ZeroDivisionError, OverflowError, ValueError, RecursionError):
        return None
    if not exact and not math.isfinite(val):
        return None
    return NumValue(value=val, exact=exact, decimal=p.decimal, places=_places(text) if p.decimal else None)


def _rounds_to(d: NumValue, other: NumValue) -> bool:
    """``d`` (one decimal number) could be ``other`` rounded to ``d``'s last written digit."""
    half_unit = Fraction(1, 2) * Fraction(10) ** (-d.places)
    return abs(Fraction(d.value) - Fraction(other.value)) <= half_unit


def numeric_equal(a: NumValue, b: NumValue, rel_tol: float = 1e-9) -> bool | None:
    """Compare two numeric answers; None when the answer needs math-verify's judgement.

    Exact values compare exactly. When they differ and one is written with a decimal point, the writer may
    have rounded: if that decimal is a single number whose rounding could give it from the other value
    (``0.33`` and ``\\frac{1}{3}``) math-verify decides (None); if no such rounding explains the difference
    (``0.0000001`` and ``0.0000002``, ``2.5\\times10^{-7}`` and ``2.4\\times10^{-7}``) they are different
    (False), never left to math-verify's float tolerance. A decimal inside a larger expression stays
    undecided when unequal. Irrational values (radicals) compare by float value with relative tolerance
    ``rel_tol``: two different radical expressions of this small grammar cannot agree to 9 significant digits.

    Returns:
        True (equal), False (different) or None (undecided).
    """
    if a.exact and b.exact:
        if a.value == b.value:
            return True
        if not (a.decimal or b.decimal):
            return False
        sides = [(d, o) for d, o in ((a, b), (b, a)) if d.decimal]
        if any(d.places is None for d, _ in sides):
            return None  # a decimal inside an expression: math-verify decides
        return None if any(_rounds_to(d, o) for d, o in sides) else False
    try:
        x, y = _float(a.value), _float(b.value)
    except _Fail:
        return False  # an exact value beyond the float range is no inexact value (those are within it, or 0)
    close = abs(x - y) <= rel_tol * max(abs(x), abs(y))
    if close:
        return True
    return None if (a.decimal or b.decimal) else False
