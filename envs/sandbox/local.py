"""Local sandbox backends: bubblewrap, ``unshare`` and a plain subprocess, cold calls and persistent sessions.

Every call runs ``python -I -u`` (isolated from user site-packages and PYTHON* variables, unbuffered output) with
a cleared environment and stdin from /dev/null, under rlimits set by ``_driver.py`` before the model's code runs;
the code is module ``__main__``. At the deadline the sandbox's whole process tree is SIGKILLed
(``_io.kill_tree``); what it printed until then is read to the end of the pipes and returned.

When the host process is root, each slot (concurrent call or session) runs under its own unprivileged
uid, from a range of uids that this sandbox alone holds among the machine's live processes (``_UidPool``: a
lock file per range), so RLIMIT_NPROC is enforced (it is not for root) and a sandbox escape lands on a uid
that owns nothing. Inside bwrap the code sees uid 65534.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import tempfile
import time
import weakref
from collections import OrderedDict
from pathlib import Path

from . import _io
from ._io import (
    OutputCapture,
    PipeProcess,
    clear_uid,
    cpu_seconds,
    descendants,
    kill_pids_until_gone,
    kill_tree,
    looks_like_oom,
    normalize_status,
    spawn,
    thread_count,
    tmpfs_bytes,
    uid_pids,
)
from .config import (
    UID_BASE_MAX,
    UID_BASE_MIN,
    UID_SLOT_SIZE,
    UID_SLOTS,
    ExecLimits,
    ExecResult,
    SandboxConfig,
)
from .interpreter import resolve_python, venv_root

DRIVER_SOURCE = Path(__file__).with_name("_driver.py").read_text()
_ROOT = Path(__file__).resolve().parents[2]
_PROJECT_ROOT = str(_ROOT) if (_ROOT / "pyproject.toml").exists() else "/"  # source checkout: hide it
_PATH = "/usr/local/bin:/usr/bin:/bin"
# The environment model-written code sees (besides PATH and HOME): matplotlib draws headless (Agg: plt.show()
# returns at once), numerical libraries start one thread each (OpenBLAS/OpenMP would start one per host
# core, which RLIMIT_NPROC and RLIMIT_AS cannot afford on a large machine), and Python programs the code starts
# write unbuffered, as the code itself does (-u), so their output up to a kill is kept too.
SANDBOX_ENV = {
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "MPLBACKEND": "Agg",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_READ_CHUNK = 1 << 16
# Output beyond this many times max_output_bytes (at least 4 MiB) kills the call: a print loop must not
# keep the host's event loop busy pumping data until the deadline.
_FLOOD_FACTOR = 64
_FLOOD_MIN = 4 << 20
# A session's processes may use this much CPU between two calls (clock-tick granularity, exit bookkeeping of
# the processes killed after a call); more means something kept running after its call ended.
_IDLE_CPU_SLACK_S = 0.25
# After the sandbox's processes are killed (deadline, flood, crash), what they wrote before dying is still in the
# pipes: it is read up to EOF, for at most this long (a writer that escaped the kill must not hold the call).
_DRAIN_S = 1.0


async def _drain(pumps: asyncio.Future, timeout: float = _DRAIN_S) -> None:
    """Let ``pumps`` (the stdout/stderr readers) read to EOF for at most ``timeout`` seconds, then stop them."""
    with contextlib.suppress(Exception):  # the time ran out, or a read failed (EIO): what was read is kept
        await asyncio.wait_for(asyncio.shield(pumps), timeout)
    pumps.cancel()
    await asyncio.gather(pumps, return_exceptions=True)


def _partial_marker_at(buf: bytes, marker: bytes) -> int:
    """Where the longest suffix of ``buf`` that is a proper prefix of ``marker`` starts (``len(buf)`` if none):
    bytes from there on may be the start of a marker split across two reads, the rest is output."""
    for i in range(max(0, len(buf) - len(marker) + 1), len(buf)):
        if marker.startswith(buf[i:]):
            return i
    return len(buf)



def _code_bytes(code: str) -> bytes:
    """UTF-8 bytes of model-written code. Lone surrogates (e.g. a JSON ``"\\ud800"`` escape) cannot be UTF-8:
    they are passed through as their 3-byte forms, so Python in the sandbox reports a SyntaxError instead of
    the runner raising."""
    try:
        return code.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return code.encode("utf-8", "surrogatepass")

class SandboxUnavailable(RuntimeError):
    """The requested backend cannot run on this machine (or is refused by the configuration)."""


UID_LOCK_DIR = "/run/stare-verl-sandbox-uids"
"""Where the uid blocks' lock files live (``$STARE_SANDBOX_UID_LOCK_DIR`` overrides it)."""
UID_BLOCK = UID_SLOT_SIZE
"""The machine's uid space is cut into blocks of this many uids (block ``b``: uids ``[b * UID_BLOCK, (b + 1) *
UID_BLOCK)``), each with one lock file ``uids-<b>.lock``: a range is claimed by locking every block it touches, so
two ranges that share a uid share a lock whatever ``uid_base`` each pool was given."""


class _UidPool:
    """Unprivileged uids, one per live slot of a :class:`LocalSandbox`; empty (None handed out) unless the host
    runs as root.

    The pool owns the ``size`` uids from ``base + slot * UID_SLOT_SIZE``, claimed by holding an exclusive ``flock``
    on the lock file of every block of the machine's uid space that they touch (``<lock dir>/uids-<uid //
    UID_BLOCK>.lock``, :data:`UID_BLOCK`) for the pool's life. The locks name absolute uids, not slot numbers, so two
    live pools, in one process or in any processes of the machine and whatever ``base`` each was given, never share
    a uid (they could otherwise kill each other's sandboxed programs: a slot's uid is cleared of processes after
    each call), and a range frees itself when its holder ends, however it ends (the kernel drops a lock with the
    last descriptor of its file). Slots are tried in order, from a preferred one (``$STARE_SANDBOX_UID_SLOT``, else
    the pid modulo :data:`UID_SLOTS`) around to the one before it. A forked child that takes a uid first claims a
    range of its own (the parent's stays the parent's).

    Raises:
        ValueError: ``size`` above :data:`UID_SLOT_SIZE`, ``base`` below :data:`~envs.sandbox.config.UID_BASE_MIN`
            (ranges would cover ordinary users' uids, whose processes the clean-up kills) or past
            :data:`~envs.sandbox.config.UID_BASE_MAX`, or a bad ``$STARE_SANDBOX_UID_SLOT``.
        SandboxUnavailable: every slot is held, or the lock directory cannot be created.
    """

    def __init__(self, base: int, size: int, enabled: bool):
        if size > UID_SLOT_SIZE:
            raise ValueError(f"{size} uids per sandbox asked for; a uid range holds {UID_SLOT_SIZE}")
        if not UID_BASE_MIN <= base <= UID_BASE_MAX:
            raise ValueError(f"uid_base {base} is outside [{UID_BASE_MIN}, {UID_BASE_MAX}]: the sandbox's uid ranges "
                             "must stay clear of ordinary users' uids and below 2**31")
        self.enabled = enabled and os.geteuid() == 0
        self.base, self.size = base, size
        self.slot: int | None = None  # the claimed slot (None when disabled)
        self.start: int | None = None  # its first uid
        self._free: list[int] = []
        self._lock_fd: int | None = None
        self._finalizer: weakref.finalize | None = None
        self._pid = os.getpid()
        if self.enabled:
            self._claim()

    @staticmethod
    def _preferred_slot() -> int:
        forced = os.environ.get("STARE_SANDBOX_UID_SLOT", "").strip()
        if not forced:
            return os.getpid() % UID_SLOTS
        if not forced.isdigit() or int(forced) >= UID_SLOTS:
            raise ValueError(f"STARE_SANDBOX_UID_SLOT must be an integer in [0, {UID_SLOTS}), got {forced!r}")
        return int(forced)

    def _claim(self) -> None:
        self.release()  # a forked child's inherited descriptor: closed, the parent keeps its lock
        lock_dir = os.environ.get("STARE_SANDBOX_UID_LOCK_DIR", "").strip() or UID_LOCK_DIR
        try:
            os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot create the sandbox uid lock directory {lock_dir}: {exc}") from exc
        first = self._preferred_slot()
        for i in range(UID_SLOTS):
            slot = (first + i) % UID_SLOTS
            start = self.base + slot * UID_SLOT_SIZE
            fds = _lock_blocks(lock_dir, start, max(1, self.size))
            if fds is None:  # a block held by a live pool
                continue
            self._lock_fd, self._pid = fds[0], os.getpid()
            self._finalizer = weakref.finalize(self, _close_all_quietly, tuple(fds))
            self.slot, self.start = slot, start
            self._free = list(range(self.start, self.start + self.size))
            return
        raise SandboxUnavailable(f"all {UID_SLOTS} sandbox uid ranges are held by live processes (locks in {lock_dir})")

    @property
    def uids(self) -> range:
        """Every uid of the claimed range (empty when disabled)."""
        return range(self.start, self.start + self.size) if self.start is not None else range(0)

    def take(self) -> int | None:
        """A free uid of the range (None when disabled)."""
        if not self.enabled:
            return None
        if os.getpid() != self._pid:  # forked: the parent's range is the parent's
            self._claim()
        return self._free.pop()

    def give(self, uid: int | None) -> None:
        """Hand ``uid`` back (None is ignored; a uid of a range this process no longer holds too)."""
        if uid is not None and uid in self.uids:
            self._free.append(uid)

    def release(self) -> None:
        """Give the range back (its lock closed; idempotent). Only once no sandbox of the pool runs."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._lock_fd, self.slot, self.start, self._free = None, None, None, []


def _lock_blocks(lock_dir: str, start: int, size: int) -> list[int] | None:
    """Exclusive ``flock`` s on the lock files of every :data:`UID_BLOCK` block that uids ``[start, start + size)``
    touch (each file then names this process's pid, for a person looking); their descriptors, or None (and nothing
    held) when a live pool holds one of them. Raises SandboxUnavailable when a lock file cannot be opened."""
    fds: list[int] = []
    for block in range(start // UID_BLOCK, (start + size - 1) // UID_BLOCK + 1):
        path = os.path.join(lock_dir, f"uids-{block}.lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            _close_all_quietly(tuple(fds))
            raise SandboxUnavailable(f"cannot open the sandbox uid lock {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a live pool
            os.close(fd)
            _close_all_quietly(tuple(fds))
            return None
        fds.append(fd)
    for fd in fds:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
    return fds


def _close_all_quietly(fds: tuple[int, ...]) -> None:
    """Close a range's lock descriptors. In a forked child they are the inherited copies: closing them leaves the
    parent's locks held (flock is dropped with the last descriptor of the open file, never by closing one copy)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _as_uid(uid: int | None) -> list[str]:
    """Command prefix that drops to ``uid`` (no groups, no capabilities). Done by ``setpriv`` rather than
    Popen's ``user=``: with ``user=`` CPython cannot use vfork, and fork()ing a training process with
    gigabytes of RSS costs hundreds of milliseconds per call."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--"]


class LocalSandbox:
    """A sandbox backend run on this machine.

    Args:
        kind: ``"bwrap"``, ``"unshare"`` or ``"subprocess"``.
        config: the validated :class:`SandboxConfig`.
        separate_uids: when the host runs as root, run each slot under its own unprivileged uid (from a uid range
            that this sandbox alone holds while it lives: see ``_UidPool``).

    Raises:
        SandboxUnavailable: separate uids are used and every uid range of the machine is held by a live sandbox.

    Use :meth:`run` for a cold call (fresh interpreter) and :meth:`run_in_session` for calls that share
    globals under a key (one long-lived sandboxed interpreter per key, at most ``config.max_sessions``;
    the least recently used is closed when a new one is needed, and any unused for
    ``config.session_idle_s`` is closed). Sessions belong to the event loop that started them.
    """

    def __init__(self, kind: str, config: SandboxConfig, separate_uids: bool = True):
        if kind not in ("bwrap", "unshare", "subprocess"):
            raise ValueError(f"unknown local backend {kind!r}")
        self.kind = kind
        self.name = kind
        self.config = config
        self.python = resolve_python(config.python)  # host path of the interpreter ("auto" resolved)
        self.venv = venv_root(self.python)  # its virtualenv, bound read-only into the sandbox; None if none
        self.missing_modules: list[str] | None = None  # of config.expected_modules; set by the start-up probe
        self.network_isolated = kind != "subprocess"
        # separate_uids=False (or a non-root host): the launcher runs under our own uid; bwrap still maps
        # the code to uid 65534 in its user namespace, but RLIMIT_NPROC is then not applied.
        self._uids = _UidPool(config.uid_base, config.max_concurrency + config.max_sessions, separate_uids)
        self.separate_uids = self._uids.enabled
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None
        self._sessions: OrderedDict[str, PythonSession] = OrderedDict()

    # ------------------------------------------------------------------ command lines
    def _python_argv(self, limits: ExecLimits, mode: str, ctl_fd: int | None, uid: int | None) -> list[str]:
        with_nproc = uid is not None
        values = limits.rlimits(with_nproc)
        if mode == "session":
            values["SESSION_CPU"] = limits.session_cpu_budget
        rlimits = ",".join(f"{k}={v}" for k, v in values.items())
        # -u: unbuffered stdout/stderr, so what the code printed before a kill reaches the pipe (see _driver.py)
        argv = [self.python, "-I", "-u", "-c", DRIVER_SOURCE, mode, rlimits]
        if mode == "session":
            argv += [str(ctl_fd), "1" if self.network_isolated else "0"]
        return argv

    def _bwrap_argv(self, limits: ExecLimits) -> list[str]:
        tmp_bytes = str(limits.tmp_size_mb << 20)
        argv = ["bwrap", "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534"]
        argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        binds = (*self.config.ro_binds, *self.config.extra_ro_binds)
        for path in dict.fromkeys(binds):
            if os.path.exists(path):
                argv += ["--ro-bind", path, path]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / name
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir() and str(host) not in self.config.ro_binds:
                argv += ["--ro-bind", str(host), str(host)]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--size", tmp_bytes, "--tmpfs", "/tmp", "--size", tmp_bytes, "--tmpfs", "/dev/shm"]
        if self.venv and os.path.isdir(self.venv):  # after the tmpfs mounts, which would hide a venv under /tmp
            argv += ["--ro-bind", self.venv, self.venv]
        argv += ["--remount-ro", "/"]  # the sandbox's own root tmpfs: only /tmp and /dev/shm stay writable
        argv += ["--chdir", "/tmp", "--clearenv", "--setenv", "PATH", _PATH, "--setenv", "HOME", "/tmp"]
        for key, value in SANDBOX_ENV.items():
            argv += ["--setenv", key, value]
        argv += ["--"]
        return argv

    def _unshare_argv(self, limits: ExecLimits, uid: int | None) -> list[str]:
        system = ("/usr", "/bin", "/sbin", "/lib", "/etc", "/proc", "/dev", "/sys", "/tmp")
        hide = [
            p for p in (*self.config.hide_paths, _PROJECT_ROOT, os.getcwd())
            if p != "/" and not any(p == d or p.startswith(d + "/") for d in system)
        ]
        tmp_kb = limits.tmp_size_mb << 10
        lines = ["set -e"]
        venv = self.venv if self.venv and "'" not in self.venv else None
        if venv:  # held at a stage in a private /dev/shm while /tmp and the paths above it are hidden (the venv
            # itself may live under /tmp), then moved back, read-only; /dev/shm gets a fresh tmpfs below
            lines.append("mount -t tmpfs -o size=64k,mode=0700 none /dev/shm")
            lines.append(f"mkdir /dev/shm/.venv-stage && mount --bind '{venv}' /dev/shm/.venv-stage")
        lines.append(f"mount -t tmpfs -o size={tmp_kb}k,mode=1777 none /tmp")
        for path in dict.fromkeys(hide):
            lines.append(f"if [ -d '{path}' ]; then mount -t tmpfs -o size=4k,mode=0555 none '{path}'; fi")
        if venv:
            lines.append(f"mkdir -p '{venv}' && mount --move /dev/shm/.venv-stage '{venv}'")
            lines.append(f"mount -o remount,bind,ro '{venv}' && umount /dev/shm")
        lines.append(f"if [ -d /dev/shm ]; then mount -t tmpfs -o size={tmp_kb}k,mode=1777 none /dev/shm; fi")
        lines.append("cd /tmp")
        env = ["env", "-i", f"PATH={_PATH}", "HOME=/tmp", *(f"{k}={v}" for k, v in SANDBOX_ENV.items())]
        if uid is not None:  # host is root: drop to the slot's uid, no capabilities, no new privileges
            drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
            drop += ["--bounding-set=-all", "--no-new-privs", "--"]
        else:
            drop = []
        # The unprivileged shell stays as the namespace's init and waits for Python, so a death by signal
        # comes back as status 128 + N (unshare itself cannot re-raise it here).
        lines.append("exec " + " ".join(drop + env) + ' /bin/sh -c \'"$@"; exit $?\' sandbox-init "$@"')
        argv = ["unshare"]
        if os.geteuid() != 0:
            argv += ["--user", "--map-root-user"]
        argv += ["--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
        argv += ["--propagation", "private", "--", "/bin/sh", "-c", "\n".join(lines), "sandbox-sh"]
        return argv

    def _launch_spec(
        self, limits: ExecLimits, mode: str, uid: int | None, ctl_fd: int | None = None
    ) -> tuple[list[str], dict, str | None]:
        """(argv, extra Popen kwargs, temporary working dir to delete afterwards)."""
        py = self._python_argv(limits, mode, ctl_fd, uid)
        # The launcher itself gets a minimal environment too: bwrap's PID-1 process inside the sandbox
        # keeps the environment it was started with, readable through /proc/1/environ.
        launcher_env = {"PATH": _PATH, "LANG": "C.UTF-8"}
        if self.kind == "bwrap":
            return _as_uid(uid) + self._bwrap_argv(limits) + py, {"env": launcher_env}, None
        if self.kind == "unshare":
            return self._unshare_argv(limits, uid) + py, {"env": launcher_env}, None
        # subprocess: `timeout` stands between us and the code, so os.getppid() is not the host process.
        workdir = tempfile.mkdtemp(prefix="sandbox-")
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        env = {"PATH": _PATH, "HOME": workdir, "TMPDIR": workdir, **SANDBOX_ENV}
        wall = 86400 if mode == "session" else int(limits.timeout_s) + 5
        argv = [*_as_uid(uid), "timeout", "-s", "KILL", str(wall), *py]
        return argv, {"cwd": workdir, "env": env}, workdir

    def _kill_uid(self, uid: int | None) -> int | None:
        # Without namespaces, children that left our process group (setsid) still carry the slot's uid.
        return uid if self.kind == "subprocess" else None

    async def _cleanup_slot(self, uid: int | None, workdir: str | None) -> None:
        if uid is not None:
            await clear_uid(uid)
        if workdir is not None:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    # ------------------------------------------------------------------ concurrency
    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem = asyncio.Semaphore(self.config.max_concurrency)
            self._sem_loop = loop
        return self._sem

    # ------------------------------------------------------------------ cold calls
    async def run(self, code: str, limits: ExecLimits | None = None) -> ExecResult:
        """Run ``code`` in a fresh sandboxed interpreter and return its :class:`ExecResult`.

        Never raises for anything the code does; returns within ``limits.timeout_s`` plus process
        start-up and teardown (tens of milliseconds), after waiting for a free slot.
        """
        limits = limits or self.config.limits
        src = _code_bytes(code)
        if len(src) > limits.max_code_bytes:
            return ExecResult(backend=self.name, exit_code=None,
                              sandbox_error=f"code is {len(src)} bytes, above max_code_bytes={limits.max_code_bytes}")
        async with self._semaphore():
            uid = self._uids.take()
            workdir = None
            try:
                argv, kwargs, workdir = self._launch_spec(limits, "cold", uid)
                return await self._run_cold(argv, kwargs, src, limits, uid)
            finally:
                await self._cleanup_slot(uid, workdir)
                self._uids.give(uid)

    async def _run_cold(
        self, argv: list[str], kwargs: dict, src: bytes, limits: ExecLimits, uid: int | None
    ) -> ExecResult:
        t0 = time.monotonic()
        try:
            proc = await spawn(argv, **kwargs)
        except OSError as exc:
            return ExecResult(backend=self.name, sandbox_error=f"could not start the sandbox: {exc}")
        out, err = OutputCapture(limits.max_output_bytes), OutputCapture(limits.max_output_bytes)
        flood_cap = max(_FLOOD_MIN, _FLOOD_FACTOR * limits.max_output_bytes)
        flooded = asyncio.Event()

        async def pump(stream: asyncio.StreamReader, cap: OutputCapture) -> None:
            while chunk := await stream.read(_READ_CHUNK):
                cap.feed(chunk)  # after a flood: keep draining (and discarding) until the kill closes the pipe
                if out.total + err.total > flood_cap:
                    flooded.set()

        async def feed() -> None:
            with contextlib.suppress(ConnectionError, BrokenPipeError):
                proc.stdin.write(src)
                await proc.stdin.drain()
                proc.stdin.close()

        pumps = asyncio.ensure_future(asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err)))

        async def body() -> None:
            await asyncio.gather(feed(), asyncio.shield(pumps))
            await proc.wait()

        timed_out = False
        task = asyncio.ensure_future(body())
        flood_wait = asyncio.ensure_future(flooded.wait())
        try:
            done, _ = await asyncio.wait({task, flood_wait}, timeout=limits.timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            timed_out = not done
        finally:
            # Normal exit, deadline, flood or cancellation of the caller: the tree dies here, then what it
            # printed up to its death is read from the pipes.
            await kill_tree(proc, self._kill_uid(uid))
            await _drain(pumps)
            for t in (task, flood_wait):
                t.cancel()
            await asyncio.gather(task, flood_wait, return_exceptions=True)
            proc.close_pipes()  # already closed after a normal exit (EOF); not after a deadline or a flood
        duration = time.monotonic() - t0
        stdout, stderr = out.text(), err.text()
        status = None if timed_out else normalize_status(proc.returncode)
        truncated = out.truncated or err.truncated or flooded.is_set()
        if flooded.is_set() and not timed_out:
            status = None
            stderr += f"\n[output limit exceeded: killed after {out.total + err.total} bytes]"
        return ExecResult(
            stdout=stdout, stderr=stderr, exit_code=status, timed_out=timed_out,
            oom=bool(status) and looks_like_oom(stderr), truncated=truncated,
            duration_s=duration, backend=self.name,
        )

    # ------------------------------------------------------------------ sessions
    async def run_in_session(self, key: str, code: str, limits: ExecLimits | None = None) -> ExecResult:
        """Run ``code`` in the persistent interpreter of ``key`` (started on first use; restarted cleanly
        after a timeout or crash, which ``ExecResult.session_restarted`` reports on the next call)."""
        now = time.monotonic()
        for old_key, old in list(self._sessions.items()):
            if old_key != key and now - old.last_used > self.config.session_idle_s and not old.busy:
                await self.close_session(old_key)
        session = self._sessions.get(key)
        if session is None:
            # Registered before any await, so concurrent calls with the same key share it.
            session = self._sessions[key] = PythonSession(self, self.config.limits)
            evicted = []
            while len(self._sessions) > self.config.max_sessions:
                idle = [k for k, s in self._sessions.items() if k != key and not s.busy]
                victim = idle[0] if idle else next(k for k in self._sessions if k != key)
                evicted.append(self._sessions.pop(victim))
            for old in evicted:
                await old.close()
        self._sessions.move_to_end(key)
        result = await session.run(code, limits)
        await self._enforce_idle_tmp()
        return result

    async def _enforce_idle_tmp(self) -> None:
        """Close the least recently used idle sessions while the files all idle sessions hold in their tmpfs
        mounts (counted after each of their calls) exceed ``config.idle_tmp_mb``."""
        budget = self.config.idle_tmp_mb << 20
        idle = [(k, s) for k, s in self._sessions.items() if not s.busy]
        held = sum(s.tmp_bytes for _, s in idle)
        for key, session in idle:  # least recently used first
            if held <= budget:
                return
            held -= session.tmp_bytes
            if self._sessions.get(key) is session:
                await self.close_session(key)

    @property
    def idle_tmp_bytes(self) -> int:
        """Bytes the idle sessions' private /tmp and /dev/shm held after their last calls."""
        return sum(s.tmp_bytes for s in self._sessions.values() if not s.busy)

    async def close_session(self, key: str) -> None:
        """Kill the session of ``key`` (no-op when there is none)."""
        session = self._sessions.pop(key, None)
        if session is not None:
            await session.close()

    @property
    def session_keys(self) -> list[str]:
        return list(self._sessions)

    async def aclose(self) -> None:
        """Close every session."""
        for key in list(self._sessions):
            await self.close_session(key)


class PythonSession:
    """One long-lived sandboxed interpreter whose globals persist between calls.

    The rlimits are those given at construction (soft = hard; RLIMIT_CPU is the session's budget over all its
    calls, ``ExecLimits.session_cpu_budget``); each call has its own wall-clock deadline (``limits.timeout_s``),
    CPU timer (``cpu_s``) and output cap. A call that times out, floods its output or kills the interpreter
    ends the process; the next call starts a fresh one (state lost, reported).

    Checked by the host after every call, from outside the sandboxed interpreter (whose code the model
    controls, driver included): every process of the sandbox that is not the launcher chain or the
    interpreter is SIGKILLed before the call returns (so nothing a call started outlives it, whatever the code
    did to the driver); a thread still alive, a call whose interpreter used more than ``cpu_s`` + 1 s of CPU, or a
    session whose processes used more than its budget in all, ends the session after the call (a note is added
    to stderr). Before a call, CPU used since the previous call ended (something kept running) restarts it.
    The bytes in the session's private /tmp and /dev/shm are counted after each call (``tmp_bytes``).
    """

    def __init__(self, sandbox: LocalSandbox, limits: ExecLimits):
        self.sandbox = sandbox
        self.limits = limits
        self._proc: PipeProcess | None = None
        self._ctl: asyncio.StreamReader | None = None
        self._ctl_transport: _io.FdReader | None = None
        self._uid: int | None = None
        self._workdir: str | None = None
        self._lock = asyncio.Lock()
        self.started_once = False
        self.last_used = time.monotonic()
        self._chain: list[int] = []  # host pids of the launcher chain, the interpreter last
        self._cpu_idle_mark = 0.0  # the sandbox's CPU seconds when the last call ended
        self.tmp_bytes = 0  # bytes in the private /tmp and /dev/shm after the last call

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def _start(self) -> None:
        sb = self.sandbox
        self._uid = sb._uids.take()
        r, w = os.pipe()
        try:
            argv, kwargs, self._workdir = sb._launch_spec(self.limits, "session", self._uid, ctl_fd=w)
            self._proc = await spawn(argv, pass_fds=(w,), limit=1 << 20, **kwargs)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self._ctl_transport = _io.FdReader(r, limit=1 << 20)  # owns r (not connect_read_pipe: see FdReader)
        self._ctl = self._ctl_transport.reader
        line = await asyncio.wait_for(self._ctl.readline(), timeout=30)
        if not line.startswith(b'{"ready"'):
            err = await asyncio.wait_for(self._proc.stderr.read(4096), timeout=5)
            await self.close()
            raise SandboxUnavailable(f"session failed to start: {err.decode('utf-8', 'replace')[-500:]}")
        # Before any model code ran, the sandbox is one chain: launcher(s), then the interpreter.
        chain = [self._proc.pid]
        while kids := _io.all_children(chain[-1]):
            chain.append(kids[0])
        self._chain = chain
        self._cpu_idle_mark = cpu_seconds(descendants(self._proc.pid))
        self.started_once = True

    # ---------------------------------------------------------------- checks from outside the sandbox
    @property
    def _interpreter_pid(self) -> int | None:
        return self._chain[-1] if self._chain else None

    def _strays(self) -> list[int]:
        """Processes of the sandbox other than the launcher chain and the interpreter."""
        if self._proc is None:
            return []
        known = set(self._chain)
        strays = [p for p in descendants(self._proc.pid) if p not in known]
        if self._uid is not None and self.sandbox.kind == "subprocess":  # no PID namespace: setsid'd orphans
            strays += [p for p in uid_pids(self._uid) if p not in known and p not in strays]
        return strays

    def _session_cpu(self) -> float:
        return cpu_seconds(descendants(self._proc.pid)) if self._proc is not None else 0.0

    @staticmethod
    def _own_cpu(pid: int | None) -> float:
        """CPU seconds of ``pid`` itself (every thread, children not included)."""
        if pid is None:
            return 0.0
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _io._CLK_TCK
        except (OSError, IndexError, ValueError):
            return 0.0

    async def _after_call(self, limits: ExecLimits, cpu_before: float) -> str | None:
        """Kill what outlived the call; return why the session must end now (None: it may go on)."""
        await kill_pids_until_gone(self._strays)
        pid = self._interpreter_pid
        if self.sandbox.kind != "subprocess":
            self.tmp_bytes = tmpfs_bytes(pid) if pid is not None else 0
        threads = thread_count(pid) if pid is not None else 0
        used = self._own_cpu(pid) - cpu_before
        total = self._session_cpu()
        self._cpu_idle_mark = total
        if threads > 1:
            return f"{threads - 1} thread(s) still running after the call"
        if used > limits.cpu_s + 1:
            return f"the call used {used:.1f} s of CPU (limit {limits.cpu_s} s)"
        if total > self.limits.session_cpu_budget:
            return f"the session used {total:.1f} s of CPU (budget {self.limits.session_cpu_budget} s)"
        return None

    async def close(self) -> None:
        """Kill the interpreter (idempotent)."""
        if self._proc is not None:
            await kill_tree(self._proc, self.sandbox._kill_uid(self._uid))
            self._proc.close_pipes()
            self._proc = None
        if self._ctl_transport is not None:
            self._ctl_transport.close()
            self._ctl_transport = None
        await self.sandbox._cleanup_slot(self._uid, self._workdir)
        self.sandbox._uids.give(self._uid)
        self._uid, self._workdir = None, None
        self._chain, self.tmp_bytes = [], 0

    async def run(self, code: str, limits: ExecLimits | None = None) -> ExecResult:
        """Run ``code`` with the session's globals; see the class docstring."""
        limits = limits or self.limits
        name = f"{self.sandbox.name}-session"
        if len(_code_bytes(code)) > limits.max_code_bytes:
            return ExecResult(backend=name, sandbox_error="code is above max_code_bytes")
        async with self._lock:
            self.last_used = time.monotonic()
            restarted = False
            if self.alive and self._session_cpu() - self._cpu_idle_mark > _IDLE_CPU_SLACK_S:
                await self.close()  # something ran between calls (a signal handler, a timer): start over
            if not self.alive:
                restarted = self.started_once  # an earlier interpreter (and its globals) was lost
                if self._proc is not None or self._uid is not None:
                    await self.close()
                t_start = time.monotonic()
                try:
                    await self._start()
                except (OSError, asyncio.TimeoutError, SandboxUnavailable) as exc:
                    await self.close()
                    return ExecResult(backend=name, sandbox_error=f"could not start a session: {exc}",
                                      duration_s=time.monotonic() - t_start)
            async with self.sandbox._semaphore():
                result = await self._call(code, limits, name)
            result.session_restarted = restarted
            self.last_used = time.monotonic()
            return result

    async def _call(self, code: str, limits: ExecLimits, name: str) -> ExecResult:
        proc = self._proc
        nonce = secrets.token_hex(16).encode()
        out, err = OutputCapture(limits.max_output_bytes), OutputCapture(limits.max_output_bytes)
        flood_cap = max(_FLOOD_MIN, _FLOOD_FACTOR * limits.max_output_bytes)
        flooded = False

        async def pump(stream: asyncio.StreamReader, cap: OutputCapture) -> None:
            nonlocal flooded
            pending = b""  # the end of the last read when it may be the start of the nonce
            while True:
                chunk = await stream.read(_READ_CHUNK)
                if not chunk:  # EOF: the interpreter died (a kill, a crash) before the nonce
                    cap.feed(pending)
                    return
                buf = pending + chunk
                idx = buf.find(nonce)
                if idx >= 0:
                    cap.feed(buf[:idx])
                    return
                cut = _partial_marker_at(buf, nonce)
                cap.feed(buf[:cut])
                pending = buf[cut:]
                if out.total + err.total > flood_cap:
                    flooded = True
                    with contextlib.suppress(OSError):
                        os.killpg(proc.pid, signal.SIGKILL)  # ends the control pipe too
                    return

        # The readers run until the nonce or EOF; they outlive a cancelled exchange (deadline) so that, once the
        # interpreter is killed, what it printed before is read to the end of the pipes.
        pumps = asyncio.ensure_future(asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err)))

        async def exchange() -> dict | None:
            request = json.dumps({"code": code, "nonce": nonce.decode()}, ensure_ascii=True) + "\n"
            proc.stdin.write(request.encode())
            await proc.stdin.drain()
            reply = await self._ctl.readline()
            await asyncio.shield(pumps)
            if flooded or not reply:
                return None
            return json.loads(reply)

        t0 = time.monotonic()
        cpu_before = self._own_cpu(self._interpreter_pid)
        timed_out, reply = False, None
        try:
            reply = await asyncio.wait_for(exchange(), timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        except (ConnectionError, BrokenPipeError, ValueError):
            reply = None
        finally:
            if reply is None:  # deadline, flood, crash, garbage on the control pipe: start over next time
                if not timed_out and not flooded:  # crashed: let it report its own status first
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(proc.wait(), timeout=1.0)
                await kill_tree(proc, self.sandbox._kill_uid(self._uid))
                await _drain(pumps)  # what it printed up to the kill
                await self.close()
            else:
                await _drain(pumps, 0)  # already done (the nonce ended both)
        duration = time.monotonic() - t0
        stdout, stderr = out.text(), err.text()
        if timed_out:
            return ExecResult(stdout=stdout, stderr=stderr, timed_out=True, truncated=out.truncated or err.truncated,
                              duration_s=duration, backend=name)
        if reply is None:
            status = normalize_status(proc.returncode)
            if flooded:
                stderr += f"\n[output limit exceeded: killed after {out.total + err.total} bytes]"
            elif not status:  # no reply and no error status: no success, the code may not have run at all
                stderr += (f"\n[the session's interpreter ended before replying (exit status {status}): its state "
                           "is lost; the next call starts a fresh one]")
                status = None  # (a non-zero status, e.g. os._exit(1) or the driver's 70 after tampering, says it)
            return ExecResult(stdout=stdout, stderr=stderr, exit_code=None if flooded else status,
                              truncated=flooded or out.truncated or err.truncated, duration_s=duration,
                              oom=looks_like_oom(stderr), backend=name)
        try:
            status = int(reply.get("exit_code", 1))
        except (AttributeError, TypeError, ValueError):  # the code can forge the reply: only its status is read
            status = 1
        ended = await self._after_call(limits, cpu_before)
        if ended is not None:
            stderr += f"\n[sandbox: {ended}: the session was ended; the next call starts a fresh interpreter]"
            await self.close()
        oom = isinstance(reply, dict) and reply.get("error") == "MemoryError"
        return ExecResult(
            stdout=stdout, stderr=stderr, exit_code=status, oom=oom,
            truncated=out.truncated or err.truncated, duration_s=duration, backend=name,
        )
