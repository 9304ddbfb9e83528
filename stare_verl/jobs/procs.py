"""Processes of a ``main_ppo`` run on the CPU backend: its environment, and finding/killing what it left.

Ray's daemons and workers inherit the environment of the process that started them, even when they start
their own sessions, so a run tagged with ``STARE_VERL_RUN_TAG=<tag>`` can be cleaned up completely without
touching anyone else's processes.
"""

from __future__ import annotations

import os
import signal
import time

RUN_TAG_ENV = "STARE_VERL_RUN_TAG"


def cpu_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus what ``main_ppo`` on the CPU backend needs (``VERL_PLATFORM=cpu``,
    offline Hugging Face, unbuffered output), plus ``extra``."""
    env = dict(os.environ)
    env.update(
        {
            "VERL_PLATFORM": "cpu",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "RAY_DEDUP_LOGS": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        }
    )
    env.update(extra or {})
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, OSError):
        return False


def tagged_processes(tag: str, prefix: bool = False) -> list[int]:
    """PIDs of live processes (not this one) whose environment has ``STARE_VERL_RUN_TAG=<tag>``
    (``prefix=True``: a value starting with ``tag``)."""
    needle = f"{RUN_TAG_ENV}={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        hit = any(v.startswith(needle) for v in env) if prefix else needle in env
        if hit and _alive(int(entry)):
            pids.append(int(entry))
    return pids


def kill_processes(pids: list[int], timeout: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL, the given PIDs; returns those still alive afterwards."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout / 2
        while time.time() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def kill_tagged(tag: str, rounds: int = 5, timeout: float = 10.0) -> list[int]:
    """Kill every process tagged ``tag`` (see :func:`tagged_processes`), scanning again after each round: a Ray
    worker can be forked between a scan and the kills, so one scan is not enough. Returns the PIDs still alive
    after ``rounds`` rounds (normally none)."""
    left: list[int] = []
    for _ in range(rounds):
        pids = tagged_processes(tag)
        if not pids:
            return []
        left = kill_processes(pids, timeout)
        time.sleep(0.5)  # let a parent that was mid-fork finish, so the next scan sees its child
    return tagged_processes(tag) or left


SHM_DIR = "/dev/shm"
# POSIX shared memory a run's engines make: Python's SharedMemory default names (vLLM's message queues), verl's
# weight-transfer buckets, multiprocessing's named semaphores.
RUN_SHM_PREFIXES = ("psm_", "verl_weights_", "sem.mp-")


def _mapped_shm(shm_dir: str) -> tuple[set[str], set[int]]:
    """Names under ``shm_dir`` that some live process maps, and the inode numbers of every mapping of a file under
    ``shm_dir`` (read from ``/proc/<pid>/maps``). The inodes matter for named semaphores: glibc's ``sem_open``
    creates and maps a temporary ``sem.XXXXXX``, links it to ``sem.<name>`` and unlinks the temporary name, so a
    live semaphore shows in ``maps`` as ``sem.XXXXXX (deleted)``, never under its own name."""
    names: set[str] = set()
    inodes: set[int] = set()
    prefix = shm_dir.rstrip("/") + "/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(prefix)
                    if i >= 0:
                        names.add(line[i + len(prefix):].split()[0])
                        fields = line[:i].split()  # address perms offset dev inode
                        if len(fields) >= 5 and fields[4].isdigit():
                            inodes.add(int(fields[4]))
        except OSError:  # gone, or not ours to read
            continue
    return names, inodes


def remove_orphan_shm(since: float, shm_dir: str = SHM_DIR, prefixes: tuple[str, ...] = RUN_SHM_PREFIXES) -> list[str]:
    """Remove the shared-memory segments a finished run left: names starting with one of ``prefixes``, created
    (changed) at or after ``since`` (``time.time()`` seconds) and mapped by no live process. Ray kills the vLLM
    server's processes with SIGKILL at shutdown, so vLLM never unlinks its message queues' segments (160-240 MB
    each in a tiny run). Segments of a run still going are mapped by its processes and kept, named semaphores
    (``sem.mp-*``) included, which are mapped under a deleted temporary name (found by inode, see
    :func:`_mapped_shm`): without that, a run's clean-up removed the live semaphores of a vLLM engine starting
    beside it, whose spawned workers then failed (``SemLock._rebuild``: FileNotFoundError).

    Returns:
        the names removed (sorted); nothing is raised for a segment that vanished or cannot be removed.
    """
    try:
        entries = os.listdir(shm_dir)
    except OSError:
        return []
    candidates: dict[str, int] = {}  # name -> inode
    for name in entries:
        if not name.startswith(prefixes):
            continue
        try:
            st = os.stat(os.path.join(shm_dir, name))
        except OSError:
            continue
        if st.st_ctime >= since:
            candidates[name] = st.st_ino
    if not candidates:
        return []
    mapped, mapped_inodes = _mapped_shm(shm_dir)
    removed = []
    for name in sorted(candidates):
        if name in mapped or candidates[name] in mapped_inodes:  # a live named semaphore: mapped under another name
            continue
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except OSError:
            continue
    return removed


def describe(pids: list[int]) -> list[str]:
    """``"<pid> <state> <command line>"`` of each PID (for error messages about leftover processes)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            cmd, state = "?", "gone"
        out.append(f"{pid} {state} {cmd[:200]}")
    return out


def leftover_processes(tag: str, prefix: bool = False, grace_s: float = 0.0) -> list[str]:
    """Processes tagged ``tag`` (see :func:`tagged_processes`) still alive after waiting up to ``grace_s``
    seconds for them to go (a killed process can take a moment to leave /proc), :func:`describe`-d."""
    deadline = time.time() + grace_s
    while (pids := tagged_processes(tag, prefix)) and time.time() < deadline:
        time.sleep(0.5)
    return describe(pids)


TERMINATION_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals a driver treats as Ctrl-C: Ctrl-C itself (and ``kill -INT``), ``kill``, ``timeout``, a job scheduler, a
closed terminal or ssh session."""


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def interrupt_on_termination() -> None:
    """Make SIGINT, SIGTERM and SIGHUP raise ``KeyboardInterrupt`` in this (main-thread) driver, so that all three run
    the same clean-up as Ctrl-C: ``main_ppo``'s process group and every process tagged with the run's tag are
    stopped (``run_main_ppo``: SIGTERM, then SIGKILL after 20 s, then every tagged process).

    SIGINT is installed explicitly, whatever the inherited disposition: a job started with ``&`` from a
    non-interactive shell (nohup, CI runners, ``make ... &``) inherits SIGINT as *ignored*, and Python keeps an
    ignored SIGINT ignored, so without this a Ctrl-C or ``kill -INT`` of such a driver did nothing while
    ``main_ppo`` trained on. Without the SIGTERM/SIGHUP handlers the driver dies at once and the run's Ray cluster
    keeps training, detached (``main_ppo`` runs in its own session).

    Raises:
        ValueError: called outside the main thread (Python installs signal handlers only there).
    """
    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, _raise_interrupt)
