"""What a program printed before it was stopped reaches the result: a wall-clock deadline, the CPU limit (the timer's
SIGPROF and the kernel's RLIMIT_CPU kill), the memory limit, a crash (segfault, ``os._exit``, abort), an exception,
output without a trailing newline, stderr, a Python child of the program, and large output (cut by the usual rules),
in cold calls and in persistent sessions, on every local backend."""

from __future__ import annotations

import asyncio

import pytest

from envs.sandbox import ExecLimits, ExecResult, LocalSandbox, SandboxConfig, probe_backend
from envs.sandbox._io import TRUNCATION_MARKER

pytestmark = pytest.mark.integration

KINDS = [
    pytest.param(k, marks=pytest.mark.skipif(probe_backend(k) is not None, reason=f"{k} unusable here"))
    for k in ("bwrap", "unshare")
]
ALL_KINDS = [*KINDS, "subprocess"]
TIMEOUT_S = 3.0  # deadline of the calls that sleep past it
LONG_S = 30.0  # deadline of the others (they end by themselves, well before it)

# name -> (code, per-call overrides). Every program prints to stdout (once without a newline) and to stderr, then is
# stopped; nothing is flushed by the program itself.
CASES = {
    "deadline": (
        "import sys, time\nprint('step 1 done')\nprint('hit 17', end='')\nprint('warn', file=sys.stderr, end='')\n"
        "time.sleep(60)",
        {"timeout_s": TIMEOUT_S},
    ),
    "cpu_timer": (
        "import sys\nprint('step 1 done')\nprint('hit 17', end='')\nprint('warn', file=sys.stderr, end='')\n"
        "while True:\n    pass",
        {},
    ),
    "cpu_rlimit": (  # the timer's signal ignored: the kernel's RLIMIT_CPU kill
        "import signal, sys\nsignal.signal(signal.SIGPROF, signal.SIG_IGN)\nprint('step 1 done')\n"
        "print('hit 17', end='')\nprint('warn', file=sys.stderr, end='')\nwhile True:\n    pass",
        {},
    ),
    "memory": (
        "import sys\nprint('step 1 done')\nprint('hit 17', end='')\nprint('warn', file=sys.stderr, end='')\n"
        "x = bytearray(8 << 30)",
        {},
    ),
    "segfault": (
        "import ctypes, sys\nprint('step 1 done')\nprint('hit 17', end='')\nprint('warn', file=sys.stderr, end='')\n"
        "ctypes.string_at(0)",
        {},
    ),
    "os_exit": (
        "import os, sys\nprint('step 1 done')\nprint('hit 17', end='')\nprint('warn', file=sys.stderr, end='')\n"
        "os._exit(3)",
        {},
    ),
    "abort": (
        "import os, sys\nprint('step 1 done')\nprint('hit 17', end='')\nprint('warn', file=sys.stderr, end='')\n"
        "os.abort()",
        {},
    ),
    "exception": (
        "import sys\nprint('step 1 done')\nprint('hit 17', end='')\nprint('warn', file=sys.stderr, end='')\n"
        "raise ValueError('bad step')",
        {},
    ),
}


def _check(name: str, r: ExecResult) -> None:
    assert r.sandbox_error is None, (name, r)
    assert r.stdout == "step 1 done\nhit 17", (name, r)
    assert r.stderr.startswith("warn"), (name, r)
    expect = {
        "deadline": lambda: r.timed_out and r.exit_code is None and r.stderr == "warn",
        "cpu_timer": lambda: r.exit_code == 128 + 27,  # SIGPROF
        "cpu_rlimit": lambda: r.exit_code in (128 + 24, 128 + 9),  # SIGXCPU, or SIGKILL at the hard limit
        "memory": lambda: r.exit_code == 1 and r.oom and "MemoryError" in r.stderr,
        "segfault": lambda: r.exit_code == 128 + 11,
        "os_exit": lambda: r.exit_code == 3 and r.stderr == "warn",
        "abort": lambda: r.exit_code == 128 + 6,
        "exception": lambda: r.exit_code == 1 and r.stderr.rstrip().endswith("ValueError: bad step"),
    }[name]
    assert expect(), (name, r)
    assert name == "deadline" or not r.timed_out, (name, r)


def _sandbox(kind: str) -> LocalSandbox:
    limits = ExecLimits(timeout_s=LONG_S, cpu_s=1, session_cpu_s=2, memory_mb=512, max_output_bytes=1000)
    return LocalSandbox(kind, SandboxConfig(limits=limits, max_concurrency=8, max_sessions=16, allow_unsafe=True))


def _limits(sb: LocalSandbox, overrides: dict) -> ExecLimits:
    return sb.config.limits.model_copy(update=overrides)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_cold_calls_keep_what_was_printed_before_the_stop(kind):
    sb = _sandbox(kind)

    async def go():
        return await asyncio.gather(*(sb.run(code, _limits(sb, over)) for code, over in CASES.values()))

    for name, r in zip(CASES, asyncio.run(go()), strict=True):
        _check(name, r)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_session_calls_keep_what_was_printed_before_the_stop(kind):
    sb = _sandbox(kind)

    async def one(name: str, code: str, over: dict) -> tuple[ExecResult, ExecResult, ExecResult]:
        first = await sb.run_in_session(name, "x = 5\nprint('ready')")
        stopped = await sb.run_in_session(name, code, _limits(sb, over))
        after = await sb.run_in_session(name, "print('x' in globals())")
        return first, stopped, after

    async def go():
        try:
            return await asyncio.gather(*(one(name, code, over) for name, (code, over) in CASES.items()))
        finally:
            await sb.aclose()

    for name, (first, stopped, after) in zip(CASES, asyncio.run(go()), strict=True):
        assert first.stdout == "ready\n", (name, first)
        _check(name, stopped)
        # The stop's output does not leak into the next call; a call that ended the interpreter says so.
        lost = name not in ("memory", "exception")
        assert after.stdout == f"{not lost}\n" and after.stderr == "", (name, after)
        assert after.session_restarted == lost, (name, after)


@pytest.mark.parametrize("kind", KINDS)
def test_a_python_child_of_the_program_is_unbuffered_too(kind):
    sb = _sandbox(kind)
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', \"print('child', end=''); import time; time.sleep(60)\"])\n"
        "time.sleep(60)"
    )
    r = asyncio.run(sb.run(code, _limits(sb, {"timeout_s": 3.0})))
    assert r.timed_out and r.stdout == "child", r


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_large_output_before_a_stop_is_cut_by_the_usual_rules(kind):
    """20000 lines, then a sleep past the deadline (or a crash): the head and the tail (the last lines printed) are
    kept, with the marker between and the count of bytes cut."""
    sb = _sandbox(kind)
    lines = "".join(f"line {i}\n" for i in range(20000))
    head, tail = lines.encode()[:500].decode(), lines.encode()[-500:].decode()
    cut = len(lines) - 1000
    prints = "for i in range(20000):\n    print(f'line {i}')\n"

    async def go():
        cold = await sb.run(prints + "import time\ntime.sleep(60)", _limits(sb, {"timeout_s": 4.0}))
        crash = await sb.run(prints + "import os\nos._exit(2)")
        sess = await sb.run_in_session("s", prints + "import time\ntime.sleep(60)", _limits(sb, {"timeout_s": 4.0}))
        await sb.aclose()
        return cold, crash, sess

    cold, crash, sess = asyncio.run(go())
    assert cold.timed_out and sess.timed_out and crash.exit_code == 2
    for r in (cold, crash, sess):
        assert r.truncated and r.stdout == head + TRUNCATION_MARKER.format(omitted=cut) + tail, r.stdout[-300:]


def test_the_drivers_output_streams_are_unbuffered():
    """The interpreter runs with -u (isolated mode ignores PYTHONUNBUFFERED) and programs it starts get
    PYTHONUNBUFFERED=1."""
    sb = LocalSandbox("subprocess", SandboxConfig(allow_unsafe=True))
    code = (
        "import os, sys\n"
        "print(type(sys.stdout.buffer).__name__, sys.stdout.write_through, sys.stderr.write_through, "
        "os.environ.get('PYTHONUNBUFFERED'))"
    )
    r = asyncio.run(sb.run(code))
    assert r.stdout == "FileIO True True 1\n", r  # no buffer between print and the pipe
