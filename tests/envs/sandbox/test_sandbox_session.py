"""Persistent sessions: globals survive between calls of one key, the same limits and kill-on-timeout
apply, and a session that timed out or crashed restarts cleanly."""

from __future__ import annotations

import asyncio
import os

import pytest

from envs.sandbox import ExecLimits, LocalSandbox, SandboxConfig, probe_backend

pytestmark = pytest.mark.integration

KINDS = [
    pytest.param(k, marks=pytest.mark.skipif(probe_backend(k) is not None, reason=f"{k} unusable here"))
    for k in ("bwrap", "unshare")
]


def _live_with_marker(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] not in "ZX" and marker in cmd:
            found.append(int(name))
    return found


FINISH_S = 60.0  # the deadline of calls meant to finish: never reached, however loaded the machine


def _sandbox(kind: str, **limits) -> LocalSandbox:
    return LocalSandbox(kind, SandboxConfig(limits=ExecLimits(**limits), max_sessions=2, allow_unsafe=True))


@pytest.mark.parametrize("kind", KINDS)
def test_session_keeps_globals_and_restarts_cleanly_after_a_timeout(kind):
    sb = _sandbox(kind, timeout_s=FINISH_S)  # only the loop has a deadline it reaches

    async def go():
        out = [await sb.run_in_session("a", "x = 41\ndef f(v):\n    return v + 1")]
        out.append(await sb.run_in_session("a", "print(f(x))"))
        out.append(await sb.run_in_session("b", "print('x' in globals())"))  # other key, other globals
        out.append(await sb.run_in_session("a", "while True: pass", ExecLimits(timeout_s=4)))
        out.append(await sb.run_in_session("a", "print('x' in globals())"))
        out.append(await sb.run_in_session("a", "y = 2; print(y)"))
        out.append(await sb.run_in_session("a", "print(y * 21)"))
        await sb.aclose()
        return out

    r = asyncio.run(go())
    assert r[0].exit_code == 0 and not r[0].session_restarted
    assert r[1].stdout == "42\n" and r[1].exit_code == 0
    assert r[2].stdout == "False\n"
    assert r[3].timed_out and 4 <= r[3].duration_s < 30  # the limit, and no hang
    assert r[4].stdout == "False\n" and r[4].session_restarted  # fresh interpreter, reported
    assert r[5].stdout == "2\n" and r[6].stdout == "42\n" and not r[6].session_restarted
    assert sb.session_keys == []


@pytest.mark.parametrize("kind", KINDS)
def test_session_hostile_calls(kind):
    sb = _sandbox(kind, timeout_s=FINISH_S, memory_mb=512, max_output_bytes=1000)  # no call is meant to time out
    marker = "654.321"

    async def go():
        out = {}
        out["input"] = await sb.run_in_session("s", "v = 1\ninput('? ')")
        out["stdin"] = await sb.run_in_session("s", "import sys; print(repr(sys.stdin.read()), v)")
        out["oom"] = await sb.run_in_session("s", "big = bytearray(8 << 30)")
        out["after_oom"] = await sb.run_in_session("s", "print(v)")
        out["child"] = await sb.run_in_session(
            "s", f"import subprocess; subprocess.Popen(['sleep', '{marker}'], start_new_session=True); print('ok')"
        )
        out["leftover"] = _live_with_marker(marker)
        out["exit"] = await sb.run_in_session("s", "import sys; sys.exit(5)")
        out["after_exit"] = await sb.run_in_session("s", "print(v)")
        out["flood"] = await sb.run_in_session("s", "print('z' * 10**8)")
        out["stream_hijack"] = await sb.run_in_session("s", "import sys, os; sys.stdout = open(os.devnull, 'w'); os.close(2)")
        out["after_hijack"] = await sb.run_in_session("s", "print('visible')")
        out["segv"] = await sb.run_in_session("s", "import ctypes; ctypes.string_at(0)")
        out["after_segv"] = await sb.run_in_session("s", "print('back')")
        await sb.aclose()
        return out

    r = asyncio.run(go())
    assert r["input"].exit_code == 1 and "EOFError" in r["input"].stderr
    assert r["stdin"].stdout == "'' 1\n"
    assert r["oom"].oom and r["after_oom"].stdout == "1\n"  # a MemoryError does not end the session
    assert r["child"].stdout == "ok\n" and r["leftover"] == []  # children die with their call
    assert r["exit"].exit_code == 5 and r["after_exit"].stdout == "1\n"
    assert r["flood"].truncated and "bytes truncated" in r["flood"].stdout
    assert r["after_hijack"].stdout == "visible\n"
    assert r["segv"].exit_code == 128 + 11
    assert r["after_segv"].stdout == "back\n" and r["after_segv"].session_restarted


@pytest.mark.parametrize("kind", KINDS)
def test_least_recently_used_session_is_evicted_and_close_kills_it(kind):
    sb = _sandbox(kind)  # max_sessions=2

    async def go():
        await sb.run_in_session("a", "a = 1")
        await sb.run_in_session("b", "b = 1")
        await sb.run_in_session("a", "a += 1")  # 'b' is now the least recently used
        await sb.run_in_session("c", "c = 1")
        keys = sb.session_keys
        pid = (await sb.run_in_session("a", "import os; print(os.getpid())")).stdout
        proc_pid = sb._sessions["a"]._proc.pid
        await sb.close_session("a")
        after = sb.session_keys
        await sb.aclose()
        return keys, pid, proc_pid, after

    keys, pid, proc_pid, after = asyncio.run(go())
    assert sorted(keys) == ["a", "c"] and pid.strip().isdigit()
    assert not os.path.exists(f"/proc/{proc_pid}") or open(f"/proc/{proc_pid}/stat").read().split()[2] in "ZX"
    assert after == ["c"] and sb.session_keys == []


@pytest.mark.parametrize("kind", KINDS[:1])
def test_idle_sessions_are_closed(kind):
    sb = LocalSandbox(kind, SandboxConfig(session_idle_s=0.3))

    async def go():
        await sb.run_in_session("old", "a = 1")
        await asyncio.sleep(0.5)
        await sb.run_in_session("new", "b = 1")
        keys = sb.session_keys
        await sb.aclose()
        return keys

    assert asyncio.run(go()) == ["new"]


@pytest.mark.parametrize("kind", KINDS)
def test_code_that_tampers_with_the_drivers_descriptors(kind):
    """The code runs in the driver's process and can reach its control pipes (a fresh user's attack: with the
    control input made non-blocking, the driver ended after its reply and the next call was reported as a success
    with exit status 0, its code never run). Non-blocking: made blocking again, the session goes on. Closed or
    replaced: the call fails visibly (no reply), the next one runs in a fresh interpreter. os._exit(0): no success."""
    sb = _sandbox(kind, timeout_s=FINISH_S)
    tamper = {
        "nonblock": "import os\nfor fd in range(3, 12):\n    try: os.set_blocking(fd, False)\n    except OSError: pass",
        "close": "import os\nfor fd in range(3, 12):\n    try: os.close(fd)\n    except OSError: pass",
        "dup2": "import os\nr, w = os.pipe()\nfor fd in range(3, 12):\n    try: os.dup2(w, fd)\n    except OSError: pass",
        "exit0": "import os; os._exit(0)",
    }

    async def go():
        out = {}
        for name, code in tamper.items():
            await sb.run_in_session(name, "y = 41")
            out[name] = (await sb.run_in_session(name, code), await sb.run_in_session(name, "print('y' in globals())"))
        await sb.aclose()
        return out

    r = asyncio.run(go())
    call, after = r["nonblock"]
    assert call.exit_code == 0 and after.stdout == "True\n" and not after.session_restarted
    for name in ("close", "dup2"):  # the driver ends with status 70 before any reply
        assert r[name][0].exit_code == 70, (name, r[name][0])
    assert r["exit0"][0].exit_code is None and "ended before replying (exit status 0)" in r["exit0"][0].stderr
    for name in ("close", "dup2", "exit0"):
        call, after = r[name]
        assert after.exit_code == 0 and after.stdout == "False\n" and after.session_restarted, (name, after)


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_that_closes_or_detaches_the_standard_streams_leaves_the_next_calls_working(kind):
    """``sys.stdout.close()`` closed the session's one stdout object, so every later call failed with "I/O operation
    on closed file" and the session was never restarted: each call now starts with usable streams, globals kept."""
    sb = _sandbox(kind, timeout_s=FINISH_S)
    spoil = {
        "close_out": "sys.stdout.close()",
        "close_both": "sys.stdout.close(); sys.stderr.close()",
        "detach": "sys.stdout.detach()",
        "close_dunder": "sys.__stdout__.close(); sys.stdout = None",
    }

    async def go():
        out = {}
        for name, code in spoil.items():
            await sb.run_in_session(name, "import sys; y = 41")
            out[name] = [await sb.run_in_session(name, code)] + [
                await sb.run_in_session(name, "print('out', y + 1); print('err', file=sys.stderr)") for _ in range(2)
            ]
        await sb.aclose()
        return out

    r = asyncio.run(go())
    for name, (_, *after) in r.items():
        for res in after:
            assert (res.exit_code, res.stdout, res.stderr) == (0, "out 42\n", "err\n"), (name, res)
            assert not res.session_restarted, name
