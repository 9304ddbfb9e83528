"""The sandbox starts its interpreters without forking Python (``envs.sandbox._io.spawn``), so a tool call cannot
hang the agent loop when the event loop is uvloop's (Ray's async actors use it wherever it is installed: GPU
installs, through vLLM or SGLang, and this project's dev install).

The fault: uvloop forks with libuv and runs ``PyOS_AfterFork_Child`` in the child, which takes the interpreter's
thread-state lock; a thread that held it at the fork (any C thread entering Python, as Ray's do) leaves the child
blocked before exec and the event loop blocked reading its exec pipe, for ever. A training run stopped that way
17 steps in (the vLLM virtualenv, the hf rollout). The stress below makes such threads: C threads (pthreads made
through ctypes) that enter Python again and again, each entry creating and deleting a thread state under that
lock. Measured on this machine: ``asyncio.create_subprocess_exec`` under uvloop hung within 500 spawns in 3 of 3
runs (one of them this test's ``spawn`` case with ``spawn`` built on it: it failed at its deadline); ``spawn`` makes
500 in 1.4 s. The ``sandbox`` case is the tool's own path (cold and session interpreters) under the same stress.
Each case runs in a child process with a deadline, so a hang fails the test instead of the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support import REPO

pytestmark = pytest.mark.integration

pytest.importorskip("uvloop")

STRESS = textwrap.dedent('''
    import asyncio, ctypes, sys, threading, time
    import uvloop

    libc = ctypes.CDLL(None)
    START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)

    @START
    def enter_python(arg):  # a foreign thread: each call creates and deletes a Python thread state
        return None

    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, START, ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]

    def churn():
        while True:
            tids = []
            for _ in range(16):
                t = ctypes.c_ulong()
                libc.pthread_create(ctypes.byref(t), None, enter_python, None)
                tids.append(t)
            for t in tids:
                libc.pthread_join(t.value, None)

    async def main(kind, n):
        if kind == "spawn":
            from envs.sandbox._io import spawn
            for _ in range(n):
                p = await spawn(["/bin/sh", "-c", "echo ok"])
                p.stdin.close()
                out = await p.stdout.read()
                await p.stderr.read()
                assert await p.wait() == 0 and out == b"ok\\n", out
                p.close_pipes()
        else:  # the tool: real sandboxed interpreters, cold and in a session
            from envs.sandbox import SandboxConfig, make_sandbox
            sb = make_sandbox(SandboxConfig(backend="auto"))
            for i in range(n):
                r = await sb.run(f"print({i} * 2)")
                assert r.stdout.strip() == str(2 * i), r
            for i in range(3):
                r = await sb.run_in_session("s", f"x = {i}; print(x + 1)")
                assert r.stdout.strip() == str(i + 1), r
            await sb.aclose()
        print(f"{kind}: {n} done", flush=True)

    threading.Thread(target=churn, daemon=True).start()
    uvloop.run(main(sys.argv[1], int(sys.argv[2])))
''')


def _run_stress(tmp_path, source: str, kind: str, n: int, timeout: float) -> str:
    """Run a stress script in a child process with a deadline (a hang fails the test, not the suite); its stdout."""
    script = tmp_path / "stress.py"
    script.write_text(source)
    proc = subprocess.run([sys.executable, str(script), kind, str(n)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.mark.parametrize("kind, n", [("spawn", 500), ("sandbox", 40)])
def test_no_hang_under_uvloop_while_c_threads_enter_python(kind, n, tmp_path):
    out = _run_stress(tmp_path, STRESS, kind, n, timeout=120)
    assert out.endswith(f"{kind}: {n} done")


# ---------------------------------------------------------------------------------------------------------------
# Each pipe descriptor is closed once. uvloop's connect_read_pipe / connect_write_pipe close the descriptor twice
# (libuv, then the file object they were given: uvloop issue 763); a descriptor another thread opened between the
# two closes is closed under it. In a training run that killed an agent-loop worker (ZeroMQ's signaler aborted on
# "Bad file descriptor") and left the trainer waiting for its episodes. The stress: a thread walking a directory
# tree in C (libc's nftw through ctypes, without the GIL), which opens a directory descriptor per level and fails
# with EBADF when one is closed under it. Measured: with the pipes on connect_*_pipe, 2000 spawns under uvloop made
# 30-52 walks fail (3 runs); with FdReader / FdWriter none.

CLOSE_ONCE = textwrap.dedent('''
    import asyncio, ctypes, os, sys, threading
    import uvloop

    libc = ctypes.CDLL(None, use_errno=True)
    callback = ctypes.cast(libc.sched_yield, ctypes.c_void_p)  # a C function returning 0: walk on, no Python
    tree = os.path.dirname(os.__file__).encode()  # the standard library: a few hundred directories
    failures, walks, stop = [], [0], threading.Event()

    def walker():
        while not stop.is_set():
            if libc.nftw(tree, callback, 8, 1) != 0:  # FTW_PHYS
                failures.append(ctypes.get_errno())
            walks[0] += 1

    async def main(kind, n):
        if kind == "spawn":
            from envs.sandbox._io import spawn
            for _ in range(n):
                p = await spawn(["/bin/true"])
                p.stdin.close()
                await p.stdout.read()
                await p.stderr.read()
                assert await p.wait() == 0
                p.close_pipes()
        else:  # the tool: cold interpreters, and sessions started and closed (their control pipe too)
            from envs.sandbox import SandboxConfig, make_sandbox
            sb = make_sandbox(SandboxConfig(backend="auto"))
            for i in range(n):
                r = await sb.run(f"print({i} + 1)")
                assert r.stdout.strip() == str(i + 1), r
                r = await sb.run_in_session(f"s{i}", f"x = {i}; print(x * 3)")
                assert r.stdout.strip() == str(3 * i), r
                await sb.close_session(f"s{i}")
            await sb.aclose()

    t = threading.Thread(target=walker)
    t.start()
    try:
        uvloop.run(main(sys.argv[1], int(sys.argv[2])))
    finally:
        stop.set()
        t.join()
    print(f"walks {walks[0]} failed {len(failures)} errno {sorted(set(failures))}", flush=True)
''')


@pytest.mark.parametrize("kind, n", [("spawn", 2000), ("sandbox", 30)])
def test_pipes_close_each_descriptor_once_under_uvloop(kind, n, tmp_path):
    last = _run_stress(tmp_path, CLOSE_ONCE, kind, n, timeout=180).splitlines()[-1]
    walks = int(last.split()[1])
    assert walks > 0, last  # the walker ran beside the spawns
    assert " failed 0 " in last, f"a descriptor of another thread was closed under it: {last}"
