"""Small helpers shared by the backends: capped output capture and process-tree killing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time

TRUNCATION_MARKER = "\n[... {omitted} bytes truncated ...]\n"


class OutputCapture:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest.

    ``feed`` costs O(len(chunk)); memory stays O(limit) whatever the stream's size.
    """

    def __init__(self, limit: int):
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                del self.tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        """Decoded text (UTF-8, invalid bytes replaced), with a visible marker where bytes were cut."""
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if not self.truncated:
            return head + tail
        omitted = self.total - len(self.head) - len(self.tail)
        return head + TRUNCATION_MARKER.format(omitted=omitted) + tail


_OOM_LINE = re.compile(r"^(MemoryError\b|.*\[Errno 12\] Cannot allocate memory)")


def looks_like_oom(stderr: str) -> bool:
    """True when the last non-empty line of ``stderr`` is a MemoryError / ENOMEM report."""
    for line in reversed(stderr.splitlines()):
        if line.strip():
            return bool(_OOM_LINE.match(line.strip()))
    return False


def normalize_status(returncode: int | None) -> int | None:
    """asyncio's negative 'killed by signal N' becomes the shell's 128 + N."""
    if returncode is not None and returncode < 0:
        return 128 - returncode
    return returncode


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


def _alive(pid: int) -> bool:
    """False once ``pid`` is gone or a zombie (a PID-namespace init only turns zombie after its namespace
    is empty, so this also waits for the sandbox's other processes)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


async def kill_tree(proc: asyncio.subprocess.Process, uid: int | None = None, grace_s: float = 3.0) -> None:
    """SIGKILL a launched sandbox: its direct children (the sandbox's PID-namespace init), its process
    group and, when given, every process of the slot's ``uid``; then wait until they are gone (at most
    ``grace_s``). Safe to call on a finished process. Callers keep reading stdout/stderr meanwhile (in
    Python 3.11 ``Process.wait`` only returns once the pipes are closed); pipes still open after
    ``grace_s`` are closed from our side."""
    kids = _children(proc.pid) if proc.returncode is None else []
    for pid in kids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    if uid is not None:
        kill_uid(uid)
    try:
        await asyncio.wait_for(proc.wait(), timeout=grace_s)
    except asyncio.TimeoutError:
        transport = getattr(proc, "_transport", None)  # no public way to close a Process's pipes
        for fd in (0, 1, 2):
            pipe = transport.get_pipe_transport(fd) if transport is not None else None
            if pipe is not None:
                pipe.close()
        await asyncio.wait_for(proc.wait(), timeout=grace_s)
    deadline = time.monotonic() + grace_s
    while any(_alive(pid) for pid in kids) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


def kill_uid(uid: int) -> int:
    """SIGKILL every live (non-zombie) process owned by ``uid`` (a uid reserved for one sandbox slot), once (see
    :func:`clear_uid` for until none is left). Returns how many were found."""
    pids = uid_pids(uid)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


CLEAN_LISTINGS = 2
"""How many listings in a row must find nothing alive before a kill loop stops. One is not enough: a listing reads
the pid list first and each process's state after, so a process forked by one that then exits (a double fork)
can be missing from the pid list while its parent is already dead when its state is read; it is in the next
listing, whose pid list is read after that parent's death."""


async def clear_uid(uid: int, grace_s: float = 3.0) -> None:
    """Kill the processes of a slot's ``uid`` until :data:`CLEAN_LISTINGS` listings in a row find none alive (at
    most ``grace_s``), so the slot is handed back empty: nothing outlives its call and RLIMIT_NPROC starts from zero
    for the next one."""
    await kill_pids_until_gone(lambda: uid_pids(uid), grace_s)


# ---------------------------------------------------------------------------------------------------- from outside
# What the host reads about a running sandbox, from /proc (never from the sandboxed interpreter, whose code the model
# controls): its processes, their CPU time, the threads of one of them, the bytes of its private tmpfs mounts.

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def all_children(pid: int) -> list[int]:
    """The children of ``pid``, whichever of its threads started them ([] when it is gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return kids


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (breadth first). Orphans of a PID namespace are reparented to its init,
    which is below ``pid`` for the namespaced backends, so they are found too."""
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop(0)
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        todo.extend(all_children(p))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system, every thread) of ``pids`` and of their children that have been waited for."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime (fields 14-17 of proc(5))
    return total / _CLK_TCK


def thread_count(pid: int) -> int:
    """Threads of ``pid`` (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


async def kill_pids_until_gone(pids, grace_s: float = 3.0) -> None:
    """SIGKILL ``pids()`` (a function listing what must die) until :data:`CLEAN_LISTINGS` calls in a row list nothing
    alive (at most ``grace_s``)."""
    deadline = time.monotonic() + grace_s
    clean = 0
    while True:
        live = [p for p in pids() if _alive(p)]
        clean = 0 if live else clean + 1
        if clean >= CLEAN_LISTINGS or time.monotonic() > deadline:
            return
        for p in live:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        await asyncio.sleep(0.002)


def tmpfs_bytes(pid: int, mounts: tuple[str, ...] = ("tmp", "dev/shm")) -> int:
    """Bytes used in the given mounts as process ``pid`` sees them (its own mount namespace, through
    /proc/PID/root); 0 for a mount that cannot be read."""
    used = 0
    for mount in mounts:
        try:
            st = os.statvfs(f"/proc/{pid}/root/{mount}")
        except OSError:
            continue
        used += (st.f_blocks - st.f_bfree) * st.f_frsize
    return used


def uid_pids(uid: int) -> list[int]:
    """Live processes owned by ``uid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid and _alive(int(name)):
                out.append(int(name))
        except OSError:
            continue
    return out
