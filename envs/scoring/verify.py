"""Answer equivalence: fast paths first, math-verify in a killable worker process when needed.

``answers_equal(pred, gold)`` first reads what the answer offers (``envs.scoring.offers``): a chain of relations or
alternatives (``5 = 7``, ``5 \\to 7``, ``5 \\text{ or } 7``, ``5 (\\text{or } 7)``) is equal only when every value
it offers is equal to the ground truth (a hedge scores 0; against a list ground truth, alternatives are read as
that list: ``x = 5 \\text{ or } x = 7`` against ``5, 7``); when both name a variable (``x = 5`` against ``y = 5``),
the names must agree (method ``"label"``). A LaTeX command left with an unbalanced parenthesis after
normalisation (``2\\sqrt(3``) is no answer (method ``"malformed"``), never the number before it, and neither is a
notation left unfinished or doubled (``0.\\overline{}``, ``0.(``, ``\\sin 30^\\circ^\\circ``); a ground truth
that is a choice letter accepts an answer that starts with that letter as a choice (``\\textbf{(B) } 5``,
``(B) 5``, ``**(B)** 5``). Single letters after a number (``2m``, ``7g``, ``2in``) are units only when the ground
truth has no variable of that name. Both sides are first read by ``normalize.read_notations`` (full-width
punctuation, repeating decimals, degrees inside trigonometric functions); a decimal with digits in parentheses after
its decimal digits (``0.5(2)``) is also read as math-verify reads it, a product, and equal when either reading is. An answer with an ellipsis on either side
(``\\ldots``, ``\\dots``, ``\\cdots``, ``...``, ``…``) is never read as a number: lists are compared term by term
with the ellipses at the same places, anything else by its normalised string (method ``"ellipsis"``). Each value
is then decided in three steps:

1. normalised strings are equal (``normalize_answer``) -> equal;
2. both sides are plain numbers/fractions/radicals (``numeric.evaluate``) -> compared exactly;
3. otherwise math-verify (``parse`` + ``verify``) decides, in a worker process from a small pool
   (``MathVerifyPool``); definite verdicts are remembered per (gold, pred) pair, since the samples of a
   group often repeat an answer.

Time limits: the caller's ``timeout_s`` is a budget of the worker's *CPU time* for the check (see
``_mv_worker``), so the verdict does not depend on the machine's load; a worker that has not answered after
``wall_factor * timeout_s + wall_margin_s`` seconds of wall-clock time (C code that checks no signal, or a
machine too loaded to give it its CPU time) is killed (SIGKILL) and replaced on demand. This holds in any
thread, where math-verify's own ``signal.alarm`` limits cannot work.

A check that did not reach a verdict (budget used up, worker killed or crashed, checker error) is never
remembered, neither in the worker (its parse cache only holds finished parses) nor here: the same pair is
checked afresh next time, and its verdict is ``equal=None`` with method ``"timeout"`` or ``"error"``, which
``envs.reward`` counts as ``timed_out``.

Environment: ``STARE_MATH_VERIFY_WORKERS`` (default ``min(4, cpu_count)``) caps the pool size.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from envs.scoring.normalize import normalize_answer, read_notations, strip_wrappers
from envs.scoring.numeric import evaluate, numeric_equal
from envs.scoring.offers import _has_variable, offers, split_top_level

__all__ = ["MathVerifyPool", "Verdict", "answers_equal", "clear_verdict_cache", "get_pool", "prewarm"]

logger = logging.getLogger(__name__)

_PKG_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the ``envs`` package


@dataclass(frozen=True)
class Verdict:
    """Outcome of one equivalence check.

    Attributes:
        equal: True / False, or None when undecided (time limit hit or the checker failed).
        method: ``"exact"`` (normalised strings equal), ``"numeric"`` (fast numeric path),
            ``"math_verify"``, ``"hedge"`` (a value of a chain or alternative differs), ``"label"`` (the variables
            named differ), ``"malformed"`` (a command with an unbalanced parenthesis, a repeating decimal without
            digits or unclosed, a double sub- or superscript), ``"choice"`` (a choice letter
            read from the answer's start), ``"ellipsis"`` (an answer with an ellipsis, compared term by term),
            ``"empty"`` (no prediction), ``"no_ground_truth"`` (the gold is empty
            after normalisation), ``"timeout"`` (the checker's time ran out) or ``"error"`` (the checker failed).
    """

    @property
    def failed(self) -> bool:
        """True when the checker gave no verdict (``timeout``/``error``): not an answer, never cached."""
        return self.method in ("timeout", "error")

    equal: bool | None
    method: str


class _Worker:
    """One math-verify worker subprocess and its line-based pipe protocol."""

    def __init__(self, command: list[str] | None = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = _PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["STARE_MV_PARENT_PID"] = str(os.getpid())  # the worker exits when this process is gone
        self.proc = subprocess.Popen(
            command or [sys.executable, "-m", "envs.scoring._mv_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self.started = time.monotonic()
        self.ready = False
        self._buf = b""

    def _readline(self, deadline: float) -> bytes | None:
        """One reply line, or None if ``deadline`` passes first. Raises EOFError if the worker died."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            r, _, _ = select.select([fd], [], [], remaining)
            if not r:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("math-verify worker exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def wait_ready(self, deadline: float) -> bool:
        if self.ready:
            return True
        line = self._readline(deadline)
        if line is None:
            return False
        self.ready = json.loads(line).get("ready", False)
        return self.ready

    def ask(self, req: dict, deadline: float) -> dict | None:
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        line = self._readline(deadline)
        return None if line is None else json.loads(line)

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=2)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except Exception:  # noqa: BLE001
                pass


class MathVerifyPool:
    """A pool of math-verify worker processes with a hard per-call wall-clock limit.

    Thread-safe; workers start lazily (startup, i.e. importing sympy and a warm-up parse, takes ~1-2 s and
    counts as queueing, not against a check's limit). After ``os.fork`` the child starts its own workers.

    Args:
        max_workers: cap on concurrent workers (default env ``STARE_MATH_VERIFY_WORKERS`` or
            ``min(4, os.cpu_count())``).
        startup_timeout_s: a worker that is not ready after this long is killed.
        worker_command: argv of the worker process (default ``python -m envs.scoring._mv_worker``;
            tests substitute a worker that hangs).
        wall_factor, wall_margin_s: a check whose CPU budget is ``timeout_s`` is killed after
            ``wall_factor * timeout_s + wall_margin_s`` seconds of wall-clock time.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        startup_timeout_s: float = 120.0,
        worker_command: list[str] | None = None,
        wall_factor: float = 3.0,
        wall_margin_s: float = 1.0,
    ) -> None:
        if max_workers is None:
            max_workers = int(os.environ.get("STARE_MATH_VERIFY_WORKERS", min(4, os.cpu_count() or 1)))
        self.max_workers = max(1, max_workers)
        self.startup_timeout_s = startup_timeout_s
        self.worker_command = worker_command
        self.wall_factor = max(1.0, float(wall_factor))
        self.wall_margin_s = max(0.0, float(wall_margin_s))
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._pid = os.getpid()
        self.kills = 0  # workers killed for exceeding a deadline (for tests and logging)
        self.failures = 0  # checks that gave no verdict: timeouts, errors, dead workers (for tests and logging)

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:  # forked child: the parent's workers are not ours
            self._idle, self._all, self._pid = [], set(), os.getpid()

    def _acquire(self, deadline: float) -> _Worker | None:
        with self._cond:
            self._check_fork()
            while True:
                if self._idle:
                    return self._idle.pop()
                if len(self._all) < self.max_workers:
                    w = _Worker(self.worker_command)
                    self._all.add(w)
                    return w
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def _release(self, w: _Worker, dead: bool = False) -> None:
        if dead:
            w.kill()
        with self._cond:
            if dead:
                self._all.discard(w)
            elif w in self._all:
                self._idle.append(w)
            self._cond.notify()

    def prewarm(self, n: int = 1, wait_s: float = 0.0) -> bool:
        """Start up to ``n`` workers now; optionally wait up to ``wait_s`` for them. True if all ready."""
        ws = []
        deadline = time.monotonic() + wait_s
        for _ in range(min(n, self.max_workers)):
            w = self._acquire(time.monotonic())
            if w is None:
                break
            ws.append(w)
        ok = True
        for w in ws:
            try:
                ok = w.wait_ready(deadline) and ok
                self._release(w)
            except (EOFError, OSError, ValueError):
                self._release(w, dead=True)
                ok = False
        return ok

    def equivalent(
        self, pairs: list[tuple[str, str]], timeout_s: float, queue_timeout_s: float | None = None
    ) -> Verdict:
        """math-verify's verdict on whether, for any ``(gold, pred)`` pair, pred equals gold.

        Args:
            pairs: candidate ``(gold, pred)`` LaTeX strings (no ``$``), tried in order.
            timeout_s: CPU-time budget in seconds for the check itself (math-verify's parse and verify in the
                worker); the worker is killed when the check takes longer than ``wall_factor * timeout_s +
                wall_margin_s`` seconds of wall-clock time, counted from the moment a ready worker takes it.
            queue_timeout_s: bound on waiting for a free, ready worker (default ``max(30, 10 *
                timeout_s)``), so that a burst of calls from many threads queues instead of timing out.
                A call never takes longer than ``queue_timeout_s`` plus that wall-clock limit.
        Returns:
            Verdict with method ``"math_verify"``, ``"timeout"`` or ``"error"``. Never raises.
        """
        v = self._equivalent(pairs, timeout_s, queue_timeout_s)
        if v.failed:
            with self._cond:
                self.failures += 1
        return v

    def _equivalent(self, pairs: list[tuple[str, str]], timeout_s: float, queue_timeout_s: float | None) -> Verdict:
        timeout_s = max(0.0, timeout_s)
        if queue_timeout_s is None:
            queue_timeout_s = max(30.0, 10.0 * timeout_s)
        qdeadline = time.monotonic() + queue_timeout_s
        try:
            w = self._acquire(qdeadline)
        except OSError:
            return _inline_verify(pairs, timeout_s)
        if w is None:
            return Verdict(None, "timeout")
        try:
            if not w.ready:
                if not w.wait_ready(min(qdeadline, w.started + self.startup_timeout_s)):
                    starting = time.monotonic() < w.started + self.startup_timeout_s
                    if not starting:
                        logger.warning("math-verify worker not ready after %.0f s; killed", self.startup_timeout_s)
                    self._release(w, dead=not starting)
                    return Verdict(None, "timeout" if starting else "error")
            deadline = time.monotonic() + self.wall_factor * timeout_s + self.wall_margin_s
            reply = w.ask({"pairs": [list(p) for p in pairs], "budget_s": timeout_s}, deadline)
        except (EOFError, OSError, ValueError) as err:
            logger.warning("math-verify worker failed (%s: %s); it is replaced on the next call", type(err).__name__, err)
            self._release(w, dead=True)
            return Verdict(None, "error")
        if reply is None:
            self.kills += 1
            self._release(w, dead=True)
            return Verdict(None, "timeout")
        self._release(w)
        if "equal" in reply:
            return Verdict(bool(reply["equal"]), "math_verify")
        if reply.get("timeout"):
            return Verdict(None, "timeout")
        logger.warning("math-verify check failed: %s", str(reply.get("error"))[:200])
        return Verdict(None, "error")

    def close(self) -> None:
        """Kill all workers (idle and busy)."""
        with self._cond:
            ws = list(self._all) if os.getpid() == self._pid else []
            self._idle, self._all = [], set()
        for w in ws:
            w.kill()


_INLINE_CHECK = None


def _inline_verify(pairs: list[tuple[str, str]], timeout_s: float) -> Verdict:
    """Fallback when no worker process can be started: the worker's check in this process, with the same
    CPU-time budget (a SIGPROF alarm, so only in the main thread; elsewhere undecided)."""
    global _INLINE_CHECK
    if threading.current_thread() is not threading.main_thread():
        return Verdict(None, "error")
    import signal

    from envs.scoring import _mv_worker

    old = signal.getsignal(signal.SIGPROF)
    try:
        if _INLINE_CHECK is None:
            _INLINE_CHECK = _mv_worker.make_checker()
        request = json.dumps({"pairs": [list(p) for p in pairs], "budget_s": timeout_s})
        reply = _mv_worker.answer(request, _INLINE_CHECK, _mv_worker.CpuTimer())
    except Exception:  # noqa: BLE001
        return Verdict(None, "error")
    finally:
        signal.signal(signal.SIGPROF, old)
    if "equal" in reply:
        return Verdict(bool(reply["equal"]), "math_verify")
    return Verdict(None, "timeout" if reply.get("timeout") else "error")


_VERDICTS: OrderedDict[tuple, Verdict] = OrderedDict()  # math-verify verdicts of identical answer pairs
_VERDICTS_LOCK = threading.Lock()
_VERDICTS_MAX = 65536


def clear_verdict_cache() -> None:
    """Forget remembered math-verify verdicts (benchmarks, tests)."""
    with _VERDICTS_LOCK:
        _VERDICTS.clear()


_POOL: MathVerifyPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> MathVerifyPool:
    """The process-wide worker pool (created on first use, closed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = MathVerifyPool()
            atexit.register(_POOL.close)
        return _POOL


def prewarm(wait_s: float = 0.0) -> bool:
    """Start one math-verify worker now (e.g. at trainer start-up); see ``MathVerifyPool.prewarm``."""
    return get_pool().prewarm(1, wait_s)


def _casefold_words(s: str) -> str | None:
    return s.casefold() if s.replace(" ", "").isalpha() else None


def answers_equal(pred: str | None, gold: str, timeout_s: float = 5.0, pool: MathVerifyPool | None = None) -> Verdict:
    """Whether the extracted prediction ``pred`` is equivalent to the ground truth ``gold``.

    Args:
        pred: extracted answer (box content), None when there was none.
        gold: ground-truth answer (plain or LaTeX; a ``\\boxed{}`` wrapper is removed).
        timeout_s: CPU-time budget (seconds) of the math-verify check, with a wall-clock backstop (see
            ``MathVerifyPool.equivalent``; waiting for a free worker is bounded separately); the fast paths
            are bounded by input size and take microseconds.
        pool: worker pool (default: the process-wide one).
    Returns:
        Verdict. Never raises. ``Verdict(None, "timeout" | "error")`` (``.failed``) when the checker gave no
        verdict; such a result is not remembered.
    """
    try:
        if pred is None:
            return Verdict(False, "empty")
        pred, gold = str(pred), str(gold)
        if _MALFORMED_NOTATION_RE.search(pred):
            return Verdict(False, "malformed")  # 0.\overline{}, 0.(, \sin 30^\circ^\circ: no number
        verdict = _answers_equal(pred, gold, timeout_s, pool)
        if verdict.equal is False and "(" in pred + gold:
            # 0.5(2): a repeating decimal, or the product math-verify reads; either reading may be the answer
            p2, g2 = _PAREN_PRODUCT_RE.sub(_as_product, pred), _PAREN_PRODUCT_RE.sub(_as_product, gold)
            if (p2, g2) != (pred, gold):
                product = _answers_equal(p2, g2, timeout_s, pool)
                if product.equal:
                    return product
        return verdict
    except Exception:  # noqa: BLE001 - a scorer must never crash a training run
        return Verdict(None, "error")


# a notation left unfinished or doubled: a repeating block without digits (0.\overline{}, 0.\bar{a}), an unclosed one
# (0.(, 0.(33), a double sub- or superscript (\sin 30^\circ^\circ, 10^{100}^\circ: an error in LaTeX)
_MALFORMED_NOTATION_RE = re.compile(
    r"\d\.\s*\\(?:overline|bar|dot)(?![A-Za-z])\s*(?:\{[^{}\d]*\}|$)"
    r"|\d\.\(\s*\d*\s*$"
    r"|(?<!\\)([_^])\s*(?:\{[^{}]*\}|\\[A-Za-z]+|[^\s{}\\_^])\s*\1"
)
# a decimal with digits after its point, then digits in parentheses: 0.5(2), which read_notations reads as 0.5222...
_PAREN_PRODUCT_RE = re.compile(r"(?<![\d.\w])(\d*\.\d+)\((\d+)\)(?![\d.\w(])")


def _as_product(m: re.Match) -> str:
    return m.group(1) + "\\cdot(" + m.group(2) + ")"


def _answers_equal(pred: str, gold: str, timeout_s: float, pool: MathVerifyPool | None) -> Verdict:
    """:func:`answers_equal` once the notation is checked: notations read, then ellipses, chains and alternatives."""
    pred, gold = read_notations(pred), read_notations(gold)
    if _ELLIPSIS_RE.search(pred) or _ELLIPSIS_RE.search(gold):
        return _ellipsis_equal(pred, gold, timeout_s, pool)
    g_off = offers(gold)
    g_val = gold
    if g_off is not None:
        if len(g_off.values) != 1 or g_off.alternatives:
            return _equal_one(pred, gold, timeout_s, pool)  # the ground truth is itself a relation: as written
        g_val = g_off.values[0]
    gn_val = normalize_answer(g_val)
    p_off = offers(pred, numeric_gold=bool(gn_val) and not _has_variable(gn_val))
    if p_off is None:
        return _equal_one(pred, gold, timeout_s, pool)
    if p_off.labels and g_off is not None and g_off.labels and p_off.labels != g_off.labels:
        return Verdict(False, "label")  # x = 5 against y = 5: another variable
    if not p_off.values:
        return Verdict(False, "hedge")  # only the question restated (x + y = z): no value offered
    if p_off.alternatives and len(p_off.values) > 1 and _LIST_RE.search(normalize_answer(g_val)):
        return _equal_one(", ".join(p_off.values), g_val, timeout_s, pool)  # x = 5 or x = 7: a list of roots
    verdict = Verdict(None, "error")
    undecided = None
    for value in p_off.values:  # every value offered must be the answer
        verdict = _equal_one(value, g_val, timeout_s, pool)
        if verdict.equal is False:
            return Verdict(False, "hedge") if len(p_off.values) > 1 else verdict
        if verdict.equal is None and undecided is None:
            undecided = verdict
    return undecided if undecided is not None else verdict


_ELLIPSIS_RE = re.compile(
    r"\\(?:[lcvda]?dots[cbmio]?|ldotp|cdotp\s*\\cdotp\s*\\cdotp)(?![A-Za-z])|\.\s*\.\s*\.|…|⋯|(?:\\cdot\s*){3}"
)
_DOTS = "\\dots"
_TERM_SEP_RE = re.compile(r",")


def _ellipsis_equal(pred: str, gold: str, timeout_s: float, pool: MathVerifyPool | None) -> Verdict:
    """An answer with an ellipsis on either side (``1, 3, 5, \\ldots, 2n-1``, ``a_1 < \\cdots < a_n``): never read as a
    number. Every ellipsis (``\\ldots`` ``\\dots`` ``\\cdots`` ``...`` ``…``) is one token; lists (commas outside
    brackets) are compared term by term, the ellipses at the same places and every other term equal; anything else
    only by its normalised string."""
    p = normalize_answer(_ELLIPSIS_RE.sub(lambda _: " " + _DOTS + " ", pred))
    g = normalize_answer(_ELLIPSIS_RE.sub(lambda _: " " + _DOTS + " ", gold))
    if not p:
        return Verdict(False, "empty")
    if p == g:
        return Verdict(True, "exact")
    pt = [t.strip() for t in split_top_level(p, _TERM_SEP_RE)]
    gt = [t.strip() for t in split_top_level(g, _TERM_SEP_RE)]
    if len(pt) != len(gt) or len(pt) < 2:
        return Verdict(False, "ellipsis")
    undecided = None
    for a, b in zip(pt, gt, strict=True):
        if a == b:
            continue
        if _DOTS in a or _DOTS in b or not a or not b:
            return Verdict(False, "ellipsis")
        v = _equal_one(a, b, timeout_s, pool)
        if v.equal is False:
            return Verdict(False, "ellipsis")
        if v.equal is None and undecided is None:
            undecided = v
    return undecided if undecided is not None else Verdict(True, "ellipsis")


_LIST_RE = re.compile(r",")
_CHOICE_START_RE = re.compile(
    r"^\s*(?:\*\*|__)?\s*(?:\\(?:textbf|mathbf|text|mathrm|textrm|bf|boldsymbol|textit)\s*\{\s*)?(?:\*\*|__)?\s*"
    r"(?:\(([A-Z])\)|([A-Z])[).:])"
)
_CHOICE_MARK_RE = re.compile(r"\(([A-Z])\)")
_MALFORMED_RE = re.compile(r"\\(?:sqrt|frac|binom)(?![A-Za-z])\s*(?:\[[^\]]*\]\s*)?\(")
_UNIT_TAIL_RE = re.compile(r"\d\s*(?:m|g|in)\s*(?:\^\s*\{?\s*\d\s*\}?)?\s*\.?\s*$")


def _choice(pred: str, letter: str) -> Verdict | None:
    """The verdict on an answer that starts with a choice letter (``\\textbf{(B) } 5``, ``(B) 5``, ``B) 5``), when the
    ground truth is the choice ``letter``; None when the answer does not start with one, or names another choice
    later (``(B) 5 (C) 6``: two choices)."""
    s = strip_wrappers(pred)
    m = _CHOICE_START_RE.match(s)
    if m is None:
        return None
    picked = m.group(1) or m.group(2)
    if any(c != picked for c in _CHOICE_MARK_RE.findall(s[m.end() :])):
        return None
    return Verdict(picked == letter, "choice")


_LETTER_TAIL_RE = re.compile(r"(?<=[\d}])(m|g|in)((?:\^\{?\d\}?)?)$")


def _product(m: re.Match) -> str:
    return "".join("{" + c + "}" for c in m.group(1)) + m.group(2)  # 2{m}: math-verify reads 2*m, not 2 metres


def _gold_variables(gold: str) -> frozenset:
    """Letters of ``normalize.LETTER_UNITS`` that are variables of the ground truth (outside ``\\text{}`` and command names)."""
    g = normalize_answer(gold, keep=frozenset("mgin"))  # its own letter units read as variables
    g = re.sub(r"\\text\{[^{}]*\}|\\[A-Za-z]+", " ", g)
    return frozenset(c for c in "mgin" if c in g)


def _equal_one(pred: str, gold: str, timeout_s: float, pool: MathVerifyPool | None) -> Verdict:
    """One value against one ground truth (the three steps of the module docstring)."""
    try:
        keep = frozenset()
        if _UNIT_TAIL_RE.search(pred) or _UNIT_TAIL_RE.search(gold):
            keep = _gold_variables(gold)
        pn, gn = normalize_answer(pred, keep), normalize_answer(gold, keep)
        if not pn:
            return Verdict(False, "empty")
        if not gn:
            return Verdict(None, "no_ground_truth")
        if pn == gn:
            return Verdict(True, "exact")
        if _MALFORMED_RE.search(pn):
            return Verdict(False, "malformed")  # 2\sqrt(3: not the 2 in front of it
        if len(gn) == 1 and "A" <= gn <= "Z":
            v = _choice(pred, gn)
            if v is not None:
                return v
        cp, cg = _casefold_words(pn), _casefold_words(gn)
        if cp is not None and cg is not None:
            return Verdict(cp == cg, "exact")
        a, b = evaluate(pn), evaluate(gn)
        if a is not None and b is not None:
            r = numeric_equal(a, b)
            if r is not None:
                return Verdict(r, "numeric")
        # normalised forms first; the raw forms once more only if normalisation changed something
        if keep:  # 2m with m a variable: a product for math-verify, whose unit removal would drop the m
            pn, gn = _LETTER_TAIL_RE.sub(_product, pn), _LETTER_TAIL_RE.sub(_product, gn)
        pairs = [(gn, pn)]
        raw = (_clean(strip_wrappers(str(gold))), _clean(strip_wrappers(str(pred))))
        # (not when digits are parted by spaces: math-verify adds "1 2" up to 3; normalisation decided those; not
        # when a command has parentheses for braces, which math-verify reads as the number before it; not when a
        # letter after a number is a variable, which math-verify would remove as a unit)
        if (
            raw != pairs[0] and all(raw) and not keep
            and not any(_SPACED_DIGITS_RE.search(r) or _MALFORMED_RE.search(r) for r in raw)
        ):  # fmt: skip
            pairs.append(raw)
        key = tuple(pairs)
        with _VERDICTS_LOCK:
            hit = _VERDICTS.get(key)
            if hit is not None:
                _VERDICTS.move_to_end(key)
                return hit
        v = (pool or get_pool()).equivalent(pairs, timeout_s)
        if not v.failed and v.equal is not None:  # only verdicts are remembered (never timeouts or errors)
            with _VERDICTS_LOCK:
                _VERDICTS[key] = v
                if len(_VERDICTS) > _VERDICTS_MAX:
                    _VERDICTS.popitem(last=False)
        return v
    except Exception:  # noqa: BLE001 - a scorer must never crash a training run
        return Verdict(None, "error")


_SPACED_DIGITS_RE = re.compile(r"\d(?:\s|\\[,;: ]|~)+\d")


def _clean(x: str) -> str:
    return x.replace("$", "").strip()
