"""math-verify worker process (run as ``python -m envs.scoring._mv_worker``).

Protocol: one JSON object per line on stdin, one JSON object per line on stdout.

Request: ``{"pairs": [[gold, pred], ...], "budget_s": float}`` (candidate LaTeX strings without ``$``, tried
in order; the answer is equal when any pair verifies; ``budget_s`` is the CPU time, in seconds, that the whole
request may use, default 5).
Reply: ``{"equal": bool}`` (a verdict), ``{"timeout": true}`` (the budget ran out before a verdict) or
``{"error": str}`` (the request or math-verify failed). On start the worker warms math-verify up (its first
parse builds grammars and regexes) and then prints ``{"ready": true}``.

Time: the budget counts this process's CPU time (``ITIMER_PROF``, and the CPU clock read again when the check
ends: the alarm fires only on a kernel tick while this process runs), not wall-clock time, so a verdict does
not depend on how loaded the machine is. When it runs out, the work is abandoned by an exception that
math-verify does not swallow (its own signal-based limits are switched off), so nothing half-done is
remembered: only parses that finished are cached. The parent kills the process when even the CPU budget
does not fire (time spent in C code that checks no signal) or the machine is too overloaded to give the
worker its CPU time (a wall-clock backstop). The worker exits on EOF of stdin, and, even while busy (importing
sympy takes seconds on a loaded machine), within half a second of the end of its parent (a watchdog thread; the
parent passes its pid in ``STARE_MV_PARENT_PID``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections import OrderedDict

DEFAULT_BUDGET_S = 5.0
_CACHE_MAX = 4096


class OutOfBudget(BaseException):
    """The request's CPU budget ran out (a BaseException: math-verify's ``except Exception`` lets it through)."""


class CpuTimer:
    """A CPU-time alarm that raises ``OutOfBudget`` in the main thread once armed time is used up, and again
    every 50 ms of CPU after that until disarmed (library code that swallows one exception gets the next).

    Creating one installs its SIGPROF handler (main thread only: ``ValueError`` elsewhere); the worker's main loop
    and the verifier's inline check in ``envs.scoring.verify`` use it."""

    def __init__(self) -> None:
        self.armed = False
        signal.signal(signal.SIGPROF, self._fire)

    def _fire(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if self.armed:
            raise OutOfBudget

    def arm(self, seconds: float) -> None:
        """Start the alarm: ``OutOfBudget`` after ``seconds`` of this process's CPU time."""
        self.armed = True
        signal.setitimer(signal.ITIMER_PROF, max(1e-4, float(seconds)), 0.05)

    def disarm(self) -> None:
        """Stop the alarm (no ``OutOfBudget`` after this)."""
        self.armed = False
        signal.setitimer(signal.ITIMER_PROF, 0)


TINY = 1e-4  # below this magnitude math-verify's absolute tolerance makes any two values equal
TINY_REL_TOL = 1e-2  # how far apart (relative) two tiny values may be and still be one answer (rounding)


def tiny_values_differ(gold, pred) -> bool:
    """True when ``gold`` and ``pred`` (math-verify's parsed sympy values) are numbers below ``TINY`` in magnitude
    that differ by more than ``TINY_REL_TOL`` relative to the larger: math-verify compares numbers within an
    absolute tolerance, so ``1/1001!`` and ``1/1002!``, ``10^{-3333}`` and ``10^{-3334}`` or ``pi/200!`` and
    ``2pi/200!`` would all be equal. Evaluated with sympy at 30 significant digits (arbitrary exponent range);
    False for anything that is not a pair of numbers (sets, intervals, equations, symbols)."""
    import sympy

    if not (isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr) and gold.is_number and pred.is_number):
        return False
    # a value sympy cannot tell from zero (``sin(pi)`` unevaluated gives ``0.e-152``, a Float of no precision that
    # no comparison accepts) is zero
    a, b = (v if v.is_comparable else sympy.Integer(0) for v in (sympy.N(gold, 30), sympy.N(pred, 30)))
    if not (a.is_finite and b.is_finite):
        return False
    scale = sympy.Max(abs(a), abs(b))
    if scale == 0 or bool(scale >= TINY):
        return False
    return bool(abs(a - b) > TINY_REL_TOL * scale)


# the commands whose first brace group is set under or over what follows (a script, as ``_{..}`` and ``^{..}``)
_SCRIPT_COMMANDS = frozenset({"underset", "overset", "stackrel", "substack"})
_COMMAND_RE = re.compile(r"\\(?:[A-Za-z]+|.)", re.S)


def binds_index(text: str) -> bool:
    """True when a sub- or superscript of ``text`` holds an ``=`` (an operator's bound index: ``\\sum_{k=1}``,
    ``\\int_{x=0}``, ``\\operatorname*{argmax}_{x=0}``, ``\\mathop{\\sum}_{k=1}``, ``\\sum_{{k=1}}``,
    ``\\sum_{\\substack{k=1\\\\k\\ne 3}}``), or the first argument of ``\\underset``, ``\\overset`` or ``\\stackrel``
    does (``\\underset{x=3}{\\operatorname{argmin}}``, ``\\stackrel{x=1}{=}``): whatever the operator, such a relation
    binds a name, it is never the answer's value. One linear scan of the brace groups."""
    if "=" not in text:
        return False
    groups: list[bool] = []  # per open brace group: whether it is a script
    scripts = 0  # open script groups around the current position
    pending = False  # the next brace group is a script
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            m = _COMMAND_RE.match(text, i)
            if m is None:  # a lone backslash at the end
                break
            pending = m.group(0)[1:] in _SCRIPT_COMMANDS
            i = m.end()
            continue
        if c in "_^":
            pending = True
        elif c == "{":
            groups.append(pending)
            scripts += pending
            pending = False
        elif c == "}":
            if groups:
                scripts -= groups.pop()
        elif c == "=" and scripts:
            return True
        elif not c.isspace():
            pending = False
        i += 1
    return False


def lost_operator(text: str, parsed: list) -> bool:
    """True when ``text`` binds an index in a script (:func:`binds_index`) but math-verify's parse ``parsed`` holds
    no sum, product, integral or limit: the parse read the script's ``k=1`` as an equation and kept a piece of it
    (``\\int_{x=0}^{1} x\\,dx`` parsed as 0, ``\\max_{i=1} a_i`` as 1, ``\\operatorname*{argmax}_{x=0} f(x)`` as 0), so
    it is no reading of the answer."""
    if not parsed or not binds_index(text):
        return False
    import sympy

    expr = parsed[0]
    kinds = (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit)
    return not (isinstance(expr, sympy.Basic) and expr.has(*kinds))


def make_checker():
    """``check(pairs) -> bool``: math-verify's verdict over candidate ``(gold, pred)`` pairs, with a parse
    cache that only ever holds finished parses. Raises ``OutOfBudget`` (from the timer) and anything
    unexpected; math-verify's own time limits are off (``None``), the caller bounds the time."""
    import math_verify.grader
    import math_verify.parser
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # math-verify warns once that its own limits are off; ours (the CPU budget) bound the time
    math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    cache: OrderedDict[str, list] = OrderedDict()
    added: list[str] = []  # parses cached since the last ``check.begin()``

    def parsed(s: str) -> list:
        hit = cache.get(s)
        if hit is not None:
            cache.move_to_end(s)
            return hit
        res = parse("$" + s + "$", extraction_config=configs, parsing_timeout=None)
        if lost_operator(s, res):
            res = []
        cache[s] = res  # only reached when the parse finished: an interrupted parse raised past this line
        added.append(s)
        if len(cache) > _CACHE_MAX:
            cache.popitem(last=False)
        return res

    def check(pairs) -> bool:
        for g, p in pairs:
            gp = parsed(str(g))
            pp = parsed(str(p)) if gp else None
            if gp and pp and verify(gp, pp, timeout_seconds=None) and not tiny_values_differ(gp[0], pp[0]):
                return True
        return False

    def begin() -> None:
        added.clear()

    def forget() -> None:
        """Drop the parses cached since ``begin()``: a request that ran out of budget leaves the cache as it was."""
        for key in added:
            cache.pop(key, None)
        added.clear()

    check.cache = cache  # for tests
    check.begin, check.forget = begin, forget
    return check


def answer(line: str, check, timer: CpuTimer) -> dict:
    """The reply to one request line. Never raises (bar KeyboardInterrupt/SystemExit) and always leaves the
    timer disarmed. A request answered ``{"timeout": true}`` leaves ``check``'s parse cache as it found it (with
    a checker of :func:`make_checker`), so whether the alarm fired mid-parse or the CPU clock was over budget at
    the end, the next request sees the same cache."""
    begin = getattr(check, "begin", None)
    if begin is not None:
        begin()
    try:
        req = json.loads(line)
        budget = float(req.get("budget_s", DEFAULT_BUDGET_S))
        pairs = [(str(g), str(p)) for g, p in req["pairs"]]
        used0 = time.process_time()
        timer.arm(budget)
        reply = {"equal": bool(check(pairs))}
        # The alarm is checked on the kernel's ticks while this process runs, so a check preempted between ticks
        # can finish over budget without it firing (a check of about 3 ms of CPU scored under a 0.1 ms budget at load 7);
        # the CPU clock itself is exact, so the budget holds whatever the load.
        if time.process_time() - used0 > budget:
            reply = {"timeout": True}
    except OutOfBudget:
        reply = {"timeout": True}
    except Exception as err:  # noqa: BLE001 - a worker must answer every request
        reply = {"error": f"{type(err).__name__}: {err}"[:300]}
    while True:  # the alarm may fire once more between the work's end and the disarm
        try:
            timer.disarm()
            break
        except OutOfBudget:
            reply = {"timeout": True}
    forget = getattr(check, "forget", None)
    if reply.get("timeout") and forget is not None:
        forget()
    return reply


def _exit_with_parent(ppid: int, period_s: float = 0.5) -> None:
    """Exit at once (status 0) when the parent is gone, whatever the main thread is doing (importing sympy on
    a loaded machine takes seconds before stdin's EOF is ever read)."""
    while True:
        time.sleep(period_s)
        if os.getppid() != ppid:
            os._exit(0)


def main() -> int:
    """Serve requests until stdin closes or the parent process is gone. Returns the exit status."""
    parent = os.environ.get("STARE_MV_PARENT_PID", "")  # the pool's pid: the parent may be gone already
    ppid = int(parent) if parent.isdigit() else os.getppid()
    threading.Thread(target=_exit_with_parent, args=(ppid,), daemon=True, name="exit-with-parent").start()
    logging.disable(logging.CRITICAL)  # math-verify warns that its own time limits are off; the parent reports
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the reply stream
    check = make_checker()
    timer = CpuTimer()
    check([(r"\frac{1}{2}", "0.5"), ("x^2+1", "(x+1)^2"), (r"\{1,2\}", "[1,2]")])  # warm-up, no budget
    check.cache.clear()
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        out.write(json.dumps(answer(line, check, timer)) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
