"""Small helpers shared by the backends: capped output capture, spawning and process-tree killing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

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


class FdReader:
    """Reads a pipe's file descriptor into an ``asyncio.StreamReader`` through ``loop.add_reader``; owns the
    descriptor and closes it exactly once (at EOF, on :meth:`close`, or when collected).

    Why not ``loop.connect_read_pipe``: under uvloop (which Ray runs verl's agent-loop workers on) the transport's
    close closes the descriptor twice, once in libuv and once through the file object it was given (uvloop issue
    763). When another thread opens a descriptor between the two closes, the number is reused and that thread's
    descriptor is closed under it: a training run's agent-loop worker died this way (SIGABRT in ZeroMQ's
    signaler, "Bad file descriptor", its eventfd closed by a sandbox call's pipe), and the trainer waited for its
    episodes forever. ``add_reader`` only watches the descriptor, on either event loop.

    Flow control is the ``StreamReader``'s own (it calls :meth:`pause_reading` / :meth:`resume_reading` on its
    transport above ``2 * limit`` buffered bytes and below ``limit``).
    """

    def __init__(self, fd: int, limit: int = 2**16, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._fd = fd
        self._watching = False
        os.set_blocking(fd, False)
        self.reader = asyncio.StreamReader(limit=limit, loop=self._loop)
        self.reader.set_transport(self)  # pause_reading / resume_reading below
        self.resume_reading()

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # EIO and the like: the stream ends with that error
            self.reader.set_exception(exc)
            self.close()
            return
        if data:
            self.reader.feed_data(data)
        else:
            self.reader.feed_eof()
            self.close()

    def pause_reading(self) -> None:
        """Stop reading (the ``StreamReader``'s buffer is full); the writer blocks on the full pipe meanwhile."""
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def resume_reading(self) -> None:
        """Read again (the buffer drained)."""
        if self._fd >= 0 and not self._watching:
            self._loop.add_reader(self._fd, self._on_readable)
            self._watching = True

    def is_closing(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Stop watching and close the descriptor (idempotent; a pending read then sees EOF)."""
        if self._fd < 0:
            return
        self.pause_reading()
        fd, self._fd = self._fd, -1
        os.close(fd)
        if not self.reader.at_eof():
            self.reader.feed_eof()

    def __del__(self) -> None:  # collected unclosed: no longer watched (a watched one is referenced by the loop)
        if getattr(self, "_fd", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


class FdWriter:
    """The part of ``asyncio.StreamWriter`` the backends use (``write``, ``drain``, ``close``) over a pipe's file
    descriptor, written through ``loop.add_writer``; owns the descriptor and closes it exactly once (see
    :class:`FdReader` for why not ``connect_write_pipe``). A write after the reader went away raises
    ``BrokenPipeError`` from ``drain``, as asyncio's."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._fd = fd
        os.set_blocking(fd, False)
        self._buf = bytearray()
        self._error: OSError | None = None
        self._closing = False
        self._watching = False
        self._drained: list[asyncio.Future] = []

    def write(self, data: bytes) -> None:
        """Queue ``data`` and write what the pipe takes now; the rest goes as it drains."""
        if self._closing:
            raise RuntimeError("write to a closed pipe")
        if self._error is None:
            self._buf += data
            self._flush()

    def _flush(self) -> None:
        while self._buf and self._fd >= 0:
            try:
                n = os.write(self._fd, self._buf)
            except (BlockingIOError, InterruptedError):
                if not self._watching:
                    self._loop.add_writer(self._fd, self._flush)
                    self._watching = True
                return
            except OSError as exc:  # EPIPE: the process is gone or closed its stdin
                self._error = exc
                self._buf.clear()
                break
            del self._buf[:n]
        if self._watching:
            self._loop.remove_writer(self._fd)
            self._watching = False
        for fut in self._drained:
            if not fut.done():
                fut.set_result(None)
        self._drained.clear()
        if self._closing:
            self._close_fd()

    async def drain(self) -> None:
        """Wait until everything written so far is in the pipe. Raises the write's ``OSError`` (e.g.
        ``BrokenPipeError``) when the pipe broke."""
        if self._buf and self._fd >= 0:
            fut = self._loop.create_future()
            self._drained.append(fut)
            await fut
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Close once the queued bytes are written (at once when none are)."""
        self._closing = True
        if not self._buf:
            self._close_fd()

    def abort(self) -> None:
        """Drop what is queued and close now."""
        self._buf.clear()
        self._closing = True
        self._close_fd()
        for fut in self._drained:
            if not fut.done():
                fut.set_result(None)
        self._drained.clear()

    def is_closing(self) -> bool:
        return self._closing

    def _close_fd(self) -> None:
        if self._fd < 0:
            return
        if self._watching:
            self._loop.remove_writer(self._fd)
            self._watching = False
        fd, self._fd = self._fd, -1
        os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


class PipeProcess:
    """A started sandbox process with asyncio pipes: the part of ``asyncio.subprocess.Process`` the backends use
    (``pid``, ``returncode``, ``stdin`` / ``stdout`` / ``stderr`` streams, ``wait``, ``kill``), over a
    ``subprocess.Popen`` made by :func:`spawn`. ``wait`` returns when the process has exited (its pipes may still
    hold output: read them to EOF); ``close_pipes`` closes our ends (each descriptor once)."""

    def __init__(self, popen: subprocess.Popen, stdin: FdWriter, stdout: FdReader, stderr: FdReader) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._ends = (stdin, stdout, stderr)
        self.stdin, self.stdout, self.stderr = stdin, stdout.reader, stderr.reader

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal), else None."""
        return self._popen.poll()

    def kill(self) -> None:
        """SIGKILL the process (ProcessLookupError once it is gone and reaped, as asyncio's)."""
        if self._popen.poll() is not None:
            raise ProcessLookupError(self.pid)
        self._popen.kill()

    async def wait(self) -> int:
        """Wait until the process exits (a pidfd on the event loop; a thread where pidfds are unavailable)."""
        if self._popen.poll() is not None:
            return self._popen.returncode
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd (old kernel or Python): one thread per wait
            return await asyncio.to_thread(self._popen.wait)
        exited = loop.create_future()
        loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
        try:
            if self._popen.poll() is None:  # it may have ended between the check above and add_reader
                await exited
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        return self._popen.wait()

    def close_pipes(self) -> None:
        """Close our ends of the three pipes (pending reads see EOF; unwritten stdin bytes are dropped)."""
        stdin, stdout, stderr = self._ends
        stdin.abort()
        stdout.close()
        stderr.close()


async def spawn(argv: Sequence[str], *, limit: int = 2**16, **popen_kwargs: Any) -> PipeProcess:
    """Start ``argv`` with piped stdin / stdout / stderr in a new session, as ``asyncio.create_subprocess_exec``
    would, but through ``subprocess.Popen``, whose child never runs Python code between fork and exec, and with
    pipes read and written through ``add_reader`` / ``add_writer`` (:class:`FdReader`, :class:`FdWriter`), each
    descriptor owned and closed by one object.

    Why not ``create_subprocess_exec``: under uvloop (verl's agent-loop workers run on it) the event loop forks with
    libuv and runs ``PyOS_AfterFork_Child`` in the child, which takes the interpreter's thread-state lock; when
    another thread of the worker held that lock at the fork (thread pools, Ray, the transfer queue), the child
    blocks forever before exec and the parent's loop blocks with it, reading the exec pipe: a training step that
    never ends (seen once in ~1100 tool calls, 17 steps into a run). ``Popen`` spawns in C (vfork or fork, then only
    async-signal-safe calls). It runs in the loop's thread and takes a few milliseconds. Why not
    ``connect_read_pipe`` / ``connect_write_pipe`` for the pipes: see :class:`FdReader`.

    Args:
        argv: program and arguments.
        limit: buffer limit of the stdout / stderr stream readers (bytes), as ``create_subprocess_exec``'s.
        popen_kwargs: more ``subprocess.Popen`` arguments (``env``, ``cwd``, ``pass_fds``, ...).
    Returns:
        the :class:`PipeProcess`.
    Raises:
        OSError: the program cannot be started (as ``Popen``).
    """
    loop = asyncio.get_running_loop()
    ours: list[int] = []  # parent ends: stdin's write end, stdout's and stderr's read ends
    theirs: list[int] = []  # the child's ends, closed here once it has them
    try:
        for child_reads in (True, False, False):  # stdin, stdout, stderr
            r, w = os.pipe()  # close-on-exec in this process; Popen dup2s the child's end onto 0 / 1 / 2
            ours.append(w if child_reads else r)
            theirs.append(r if child_reads else w)
        popen = subprocess.Popen(list(argv), stdin=theirs[0], stdout=theirs[1], stderr=theirs[2],
                                 start_new_session=True, **popen_kwargs)  # fmt: skip
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    stdin = FdWriter(ours[0], loop)
    stdout = FdReader(ours[1], limit, loop)
    stderr = FdReader(ours[2], limit, loop)
    return PipeProcess(popen, stdin, stdout, stderr)


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


async def kill_tree(proc: PipeProcess, uid: int | None = None, grace_s: float = 3.0) -> None:
    """SIGKILL a launched sandbox: its direct children (the sandbox's PID-namespace init), its process
    group and, when given, every process of the slot's ``uid``; then wait until they are gone (at most
    ``grace_s``). Safe to call on a finished process. Callers keep reading stdout/stderr meanwhile; when the
    process has not exited after ``grace_s``, our ends of its pipes are closed and it gets ``grace_s`` more."""
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
        proc.close_pipes()
        with contextlib.suppress(asyncio.TimeoutError):  # unkillable (e.g. stuck in the kernel): left to the reaper
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
