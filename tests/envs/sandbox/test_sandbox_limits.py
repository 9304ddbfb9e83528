"""Limits the model's code cannot lift and nothing that outlives a call, in cold calls and persistent sessions,
on every local backend (bwrap, unshare, and the unisolated subprocess fallback); idle sessions' tmpfs counted.

The driver in front of the model's code runs in the same interpreter, so the code can replace any of it: these
tests replace its clean-up hooks, cancel its CPU timer, raise limits, and leave threads, timers and processes
behind, and check that the host (which looks from outside, through /proc) still holds the line.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import pytest

from envs.sandbox import ExecLimits, LocalSandbox, SandboxConfig, probe_backend
from envs.sandbox.local import _IDLE_CPU_SLACK_S
from tests.envs.sandbox.test_sandbox import live_pids

pytestmark = pytest.mark.integration

KINDS = [
    pytest.param(k, marks=pytest.mark.skipif(probe_backend(k) is not None, reason=f"{k} unusable here"))
    for k in ("bwrap", "unshare")
]
ALL_KINDS = [*KINDS, "subprocess"]
MIB = 1 << 20


def _sandbox(kind: str, **limits) -> LocalSandbox:
    return LocalSandbox(kind, SandboxConfig(limits=ExecLimits(**limits), max_sessions=4, allow_unsafe=True))


def _go(sb: LocalSandbox, body):
    """Run ``body(sb)`` and close every session, whatever happens."""

    async def main():
        try:
            return await body(sb)
        finally:
            await sb.aclose()

    return asyncio.run(main())


# --------------------------------------------------------------------------------------------- item 5: hard limits

_READ_LIMITS = """
import resource
names = ["RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_NPROC"]
raised = []
for n in names:
    soft, hard = resource.getrlimit(getattr(resource, n))
    print(n, soft, hard)
    if hard != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(getattr(resource, n), (hard, hard + 1))
            raised.append(n)
        except (ValueError, OSError):
            pass
print("raised", raised)
"""


def _limits_table(stdout: str) -> dict[str, tuple[int, int]]:
    rows = [line.split() for line in stdout.splitlines() if line.startswith("RLIMIT_")]
    return {name: (int(soft), int(hard)) for name, soft, hard in rows}


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_limit_is_soft_equals_hard_and_cannot_be_raised_cold_and_in_sessions(kind):
    sb = _sandbox(kind, cpu_s=3, session_cpu_s=7, memory_mb=700, file_size_mb=5, open_files=40, max_processes=30)

    async def body(sb):
        return await sb.run(_READ_LIMITS), await sb.run_in_session("s", _READ_LIMITS)

    cold, session = _go(sb, body)
    expect = {"RLIMIT_AS": 700 * MIB, "RLIMIT_FSIZE": 5 * MIB, "RLIMIT_NOFILE": 40, "RLIMIT_CORE": 0}
    if sb.separate_uids:
        expect["RLIMIT_NPROC"] = 30
    for result, cpu in ((cold, 3 + 1), (session, 7)):  # cold: the kernel's kill 1 s after the 3 s timer
        assert result.exit_code == 0, result.stderr
        table = _limits_table(result.stdout)
        assert table["RLIMIT_CPU"] == (cpu, cpu)
        for name, value in expect.items():
            assert table[name] == (value, value), name
        assert "raised []" in result.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_cold_cpu_limit_holds_when_the_code_cancels_or_ignores_the_timer(kind):
    sb = _sandbox(kind, cpu_s=1, timeout_s=30)
    cancel = "import signal\nsignal.setitimer(signal.ITIMER_PROF, 0)\nwhile True: pass"
    ignore = "import signal\nsignal.signal(signal.SIGPROF, signal.SIG_IGN)\nwhile True: pass"
    lift = "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\nwhile True: pass"

    async def body(sb):
        return [await sb.run(c) for c in (cancel, ignore, lift)]

    cancelled, ignored, lifted = _go(sb, body)
    for r in (cancelled, ignored):  # RLIMIT_CPU (soft = hard = cpu_s + 1) kills: the deadline is not reached
        assert not r.timed_out and r.exit_code == 128 + 9 and r.duration_s < 25
    assert lifted.exit_code == 1 and "not allowed to raise maximum limit" in lifted.stderr


_SPIN_THREAD = """
import resource, threading
try:
    resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
except ValueError as exc:
    print("refused:", exc)
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
print("left a thread")
"""

_SPIN_BETWEEN_CALLS = """
import signal, time
def burn(*_):
    t = time.process_time()
    while time.process_time() - t < 0.15:
        pass
signal.signal(signal.SIGALRM, burn)
signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
print("armed")
"""

_CANCEL_TIMER_AND_SPIN = """
import signal, time
signal.setitimer(signal.ITIMER_PROF, 0)
while time.process_time() < 2.6:
    pass
print("spun")
"""


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_session_cpu_is_accounted_across_calls_and_overruns_restart_it(kind):
    sb = _sandbox(kind, cpu_s=1, timeout_s=30)

    async def body(sb):
        out = {}
        await sb.run_in_session("s", "v = 1")
        out["thread"] = await sb.run_in_session("s", _SPIN_THREAD)  # lift refused, a thread left spinning
        out["after_thread"] = await sb.run_in_session("s", "print('v' in globals())")
        await sb.run_in_session("s", "v = 2")
        out["alarm"] = await sb.run_in_session("s", _SPIN_BETWEEN_CALLS)  # burns CPU while idle
        # wait for the work, not for seconds: until the timer has burnt more CPU between calls than the host lets
        # pass (a fixed 1.5 s at load 20 gave it too little CPU, and the next call then hit its wall limit instead)
        session, deadline = sb._sessions["s"], time.monotonic() + 120
        while session._session_cpu() - session._cpu_idle_mark <= 2 * _IDLE_CPU_SLACK_S and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        out["after_alarm"] = await sb.run_in_session("s", "print('v' in globals())")
        await sb.run_in_session("s", "v = 3")
        out["cancel"] = await sb.run_in_session("s", _CANCEL_TIMER_AND_SPIN)  # per-call budget, timer cancelled
        out["after_cancel"] = await sb.run_in_session("s", "print('v' in globals())")
        out["clean1"] = await sb.run_in_session("s", "w = 5")
        out["clean2"] = await sb.run_in_session("s", "print(w)")
        return out

    r = _go(sb, body)
    assert "refused: not allowed to raise maximum limit" in r["thread"].stdout
    assert "thread(s) still running after the call" in r["thread"].stderr
    assert r["after_thread"].session_restarted and r["after_thread"].stdout == "False\n"
    assert r["alarm"].stdout == "armed\n" and not r["alarm"].session_restarted
    assert r["after_alarm"].session_restarted and r["after_alarm"].stdout == "False\n"
    assert r["cancel"].stdout == "spun\n" and "s of CPU (limit 1 s)" in r["cancel"].stderr
    assert r["after_cancel"].session_restarted and r["after_cancel"].stdout == "False\n"
    # an ordinary session is left alone
    assert r["clean2"].stdout == "5\n" and not r["clean2"].session_restarted and "[sandbox" not in r["clean2"].stderr


@pytest.mark.parametrize("kind", KINDS)
def test_session_total_cpu_budget_is_a_hard_limit(kind):
    sb = _sandbox(kind, cpu_s=1, session_cpu_s=2, timeout_s=30)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8:\n    pass\nprint('ok')"

    async def body(sb):
        return [await sb.run_in_session("s", burn) for _ in range(3)] + [await sb.run_in_session("s", "print(1)")]

    r = _go(sb, body)
    assert r[0].stdout == "ok\n" and r[1].stdout == "ok\n"
    # the third call crosses the 2 s session budget: killed by the kernel (soft = hard) or ended by the host
    assert r[2].exit_code == 128 + 9 or "budget 2 s" in r[2].stderr
    assert r[3].session_restarted and r[3].stdout == "1\n"


# ------------------------------------------------------------------------------ item 6: nothing outlives a call

_PATCH_DRIVER = "import __main__\n__main__._kill_others = lambda: None\n__main__._reap = lambda: None\n"
_LEAVERS = {
    "popen": "import subprocess\nsubprocess.Popen(['sleep', '{m}1'])\n",
    "setsid_popen": "import subprocess\nsubprocess.Popen(['sleep', '{m}2'], start_new_session=True)\n",
    "double_fork": (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execvp('sleep', ['sleep', '{m}3'])\n    os._exit(0)\n"
    ),
    "from_a_thread": (
        "import subprocess, threading\n"
        "t = threading.Thread(target=lambda: subprocess.Popen(['sleep', '{m}4']))\nt.start(); t.join()\n"
    ),
    "ignores_signals": (
        "import os, signal\nif os.fork() == 0:\n    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
        "        signal.signal(s, signal.SIG_IGN)\n    os.execvp('sleep', ['sleep', '{m}5'])\n"
    ),
}


@pytest.mark.parametrize("patched", [False, True], ids=["driver-intact", "driver-hooks-replaced"])
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_no_process_outlives_its_session_call(kind, patched):
    sb = _sandbox(kind, timeout_s=60)  # no call is meant to reach its deadline, however loaded the machine
    marker = "4242.0"

    async def body(sb):
        out = {"calls": [], "left": []}
        await sb.run_in_session("s", "v = 7")
        for name, code in _LEAVERS.items():
            src = (_PATCH_DRIVER if patched else "") + code.format(m=marker) + f"print('{name}')"
            out["calls"].append(await sb.run_in_session("s", src))
            out["left"].append(live_pids(marker=marker))  # right after the call returned
        out["after"] = await sb.run_in_session("s", "print(v)")
        return out

    r = _go(sb, body)
    for (name, _), call, left in zip(_LEAVERS.items(), r["calls"], r["left"], strict=True):
        assert call.exit_code == 0 and call.stdout == f"{name}\n", (name, call.stderr)
        assert left == [], name
    assert r["after"].stdout == "7\n" and not r["after"].session_restarted  # the session itself goes on
    assert live_pids(marker=marker) == []


def test_a_kill_loop_does_not_stop_at_one_listing_that_missed_a_double_forks_grandchild():
    """A listing reads the pid list before each process's state, so a double fork's grandchild can be missing
    from it while its parent is already dead when read (seen once in CI: test above, subprocess kind, hooks
    replaced). Every kill loop (session strays, slot clean-up) stops only after two clean listings in a row."""
    from envs.sandbox import _io

    late = subprocess.Popen(["sleep", "4242.09"])
    listings = iter([[], [late.pid]])
    try:
        # the first listing misses the process, the second has it: it must be killed
        asyncio.run(_io.kill_pids_until_gone(lambda: next(listings, []), grace_s=5.0))
        assert late.wait(timeout=10) == -signal.SIGKILL
    finally:
        if late.poll() is None:
            late.kill()
            late.wait()
    assert _io.CLEAN_LISTINGS >= 2


# ------------------------------------------------------------------------------- item 7: idle sessions' tmpfs

_WRITE = "open('/tmp/a', 'wb').write(b'x' * ({tmp} << 20))\nopen('/dev/shm/b', 'wb').write(b'y' * ({shm} << 20))"


@pytest.mark.parametrize("kind", KINDS)
def test_idle_sessions_tmpfs_is_counted_and_capped(kind):
    sb = LocalSandbox(kind, SandboxConfig(idle_tmp_mb=10, max_sessions=8))

    async def body(sb):
        out = {}
        await sb.run_in_session("a", _WRITE.format(tmp=3, shm=1))
        out["a"] = sb._sessions["a"].tmp_bytes
        await sb.run_in_session("b", _WRITE.format(tmp=4, shm=0))
        out["held_ab"], out["keys_ab"] = sb.idle_tmp_bytes, sb.session_keys
        await sb.run_in_session("c", _WRITE.format(tmp=2, shm=2))  # 4 + 4 + 4 MiB > 10 MiB: 'a' goes
        out["held_abc"], out["keys_abc"] = sb.idle_tmp_bytes, sb.session_keys
        await sb.run_in_session("b", "import os; os.remove('/tmp/a')")  # freed files are no longer counted
        out["b_freed"] = sb._sessions["b"].tmp_bytes
        return out

    r = _go(sb, body)
    assert 4 * MIB <= r["a"] < 4 * MIB + 64 * 1024
    assert r["keys_ab"] == ["a", "b"] and 8 * MIB <= r["held_ab"] < 8 * MIB + 128 * 1024
    assert r["keys_abc"] == ["b", "c"] and 8 * MIB <= r["held_abc"] <= 10 * MIB
    assert r["b_freed"] < 64 * 1024
    assert sb.session_keys == []


def test_the_cpu_timer_is_reported_as_a_cpu_limit():
    from envs.sandbox import ExecResult
    from envs.tools.code_interpreter import format_observation

    text = format_observation(ExecResult(exit_code=128 + 27))
    assert "SIGPROF" in text and "CPU time limit" in text
