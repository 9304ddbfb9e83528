"""Why verl's ``main_ppo`` failed, read from its log: one line a user can act on instead of a 3,000-character tail.

A run that dies is, in practice, one of a few kinds: Ray's memory monitor killed workers (the node ran out of memory),
the kernel killed a process (SIGKILL, most often its out-of-memory killer), a Ray node or actor died, the disk filled,
a Hydra override or recipe key was wrong, or a Python exception in a worker. :func:`diagnose` names the kind from the
last matching evidence in the log and says what to do; the caller still prints the log's path and the resume clause
(every kind but a configuration error leaves the last checkpoint resumable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnosis:
    """What ended a run: ``kind`` (a short name: ``out_of_memory``, ``killed``, ``node_died``, ``actor_died``,
    ``disk_full``, ``config``, ``exception``), ``message`` (one line for the user: the cause and the remedy) and
    ``resumable`` (whether rerunning the same command may resume from the last checkpoint: false for a
    configuration error, which would fail again the same way)."""

    kind: str
    message: str
    resumable: bool = True


_RAY_OOM = re.compile(r"(\d+) worker\(s\) were killed due to the node running low on memory")
_RAY_OOM_USAGE = re.compile(r"was ([\d.]+)GB used / ([\d.]+)GB limit")
_RAY_OOM_ANY = re.compile(r"killed due to memory pressure \(OOM\)|ray\.exceptions\.OutOfMemoryError"
                          r"|death context type = OOMContext")  # fmt: skip
_RAY_OOM_RAYLET = re.compile(r"Killing (\d+) worker\(s\), kill details: Memory on the node")
_TORCH_OOM = re.compile(r"(torch\.OutOfMemoryError|CUDA out of memory|torch\.cuda\.OutOfMemoryError)[^\n]*")
_NODE_DIED = re.compile(r"NodeDiedError|node [0-9a-f]{8,}\S* (?:has been marked dead|died)|"
                        r"The node with node id:? ?\S+ .*(?:has been marked dead|died)", re.IGNORECASE)  # fmt: skip
_ACTOR_DIED = re.compile(r"ActorDiedError|The actor died unexpectedly|worker died or was killed", re.IGNORECASE)
_SIGKILL = re.compile(r"SIGKILL|exit code -9\b|exited with -9\b|Killed\s*$", re.MULTILINE)
_DISK = re.compile(r"No space left on device|Disk quota exceeded")
_RAY_START = re.compile(r"The current node timed out during startup|GCS cannot find the node with node ID"
                        r"|Failed to (?:connect to|get node info from) GCS|raylet failed to start", re.IGNORECASE)
_HYDRA = re.compile(
    r"(Could not override '[^']*'[^\n]*|Key '[^']*' is not in struct[^\n]*|Could not find '[^']*'[^\n]*|"
    r"ConfigAttributeError: [^\n]*|ConfigKeyError: [^\n]*|MissingMandatoryValue: [^\n]*|"
    r"Error merging override [^\n]*|mismatched input [^\n]*)"
)  # fmt: skip
_EXCEPTION = re.compile(r"^(?:\S+\.)?([A-Z]\w*(?:Error|Exception)): ([^\n]{0,200})", re.MULTILINE)


def diagnose(log_text: str, returncode: int | None = None) -> Diagnosis | None:
    """The kind of failure that ended ``main_ppo``, from its log (all of it, or its tail).

    Args:
        log_text: ``train.log`` (main_ppo's stdout and stderr, Ray's worker lines included).
        returncode: main_ppo's exit status, when known (-9 / 137: killed with SIGKILL).

    Returns:
        A :class:`Diagnosis`, or None when the log shows none of the known kinds (the caller then prints the tail).
        Memory comes first (an out-of-memory kill shows up as dead actors too), then the disk, Ray failing to start,
        the configuration,
        dead nodes and actors, a SIGKILL, and last any Python exception (the last one in the log).
    """
    text = log_text or ""
    m = _RAY_OOM.search(text) or _RAY_OOM_RAYLET.search(text)
    if m or _RAY_OOM_ANY.search(text):
        usage = _RAY_OOM_USAGE.search(text)
        at = f" at {usage.group(1)} of {usage.group(2)} GB" if usage else ""
        killed = f"Ray killed {m.group(1)} worker(s)" if m else "Ray killed workers"
        return Diagnosis("out_of_memory", f"out of memory: {killed}{at}. Run fewer jobs beside this one, lower "
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or the response length, or raise "
                         "RAY_memory_usage_threshold (0-1, default 0.95).")  # fmt: skip
    torch_oom = _TORCH_OOM.search(text)
    if torch_oom:
        return Diagnosis("out_of_memory", f"out of memory in a worker: {torch_oom.group(0).strip()[:200]}. Lower the "
                         "micro-batch size or the response length.")  # fmt: skip
    if _DISK.search(text):
        return Diagnosis("disk_full", "the disk is full (No space left on device): free space where the run folder "
                         "and its checkpoints are (trainer.max_actor_ckpt_to_keep keeps fewer).")  # fmt: skip
    if _RAY_START.search(text):
        return Diagnosis("ray_start", "Ray did not start: its node did not register with its GCS in time, most often "
                         "on a machine busy with other jobs. Run fewer jobs beside this one or raise "
                         "RAY_raylet_start_wait_time_s (seconds); the same command starts the run again.")  # fmt: skip
    hydra = _HYDRA.search(text)
    if hydra:
        return Diagnosis("config", f"a configuration error (a Hydra override or recipe key): {hydra.group(0).strip()}",
                         resumable=False)  # fmt: skip
    if _NODE_DIED.search(text):
        return Diagnosis("node_died", "a Ray node died during the run (its raylet stopped or the machine went away); "
                         "start the node again (or run on fewer nodes) before resuming.")  # fmt: skip
    killed = returncode in (-9, 137) or _SIGKILL.search(text)
    if _ACTOR_DIED.search(text):
        why = " (killed with SIGKILL, most often the kernel's out-of-memory killer)" if killed else ""
        return Diagnosis("actor_died", f"a Ray worker died unexpectedly{why}; its last lines are in the log above.")
    if killed:
        return Diagnosis("killed", "main_ppo was killed with SIGKILL, most often by the kernel's out-of-memory killer "
                         "(dmesg says); run fewer jobs beside it or lower the micro-batch size.")  # fmt: skip
    exceptions = _EXCEPTION.findall(text)
    if exceptions:
        name, msg = exceptions[-1]
        return Diagnosis("exception", f"{name}: {msg.strip()}")
    return None


def failure_report(returncode: int, log_path, tail_chars: int = 3000) -> tuple[str, bool]:
    """The error a job prints when main_ppo exits with ``returncode`` != 0: ``(text, resumable)``.

    With a known kind (:func:`diagnose` on the whole log): one line, ``error: verl main_ppo exited with RC: <cause and
    remedy> (main_ppo's output: LOG)``. Otherwise the log's last ``tail_chars`` characters after the first line, as
    before. ``resumable`` is False only for a configuration error. A missing log reads as an empty one.
    """
    from pathlib import Path

    path = Path(log_path)
    text = path.read_text(errors="replace") if path.exists() else ""
    d = diagnose(text, returncode)
    if d is not None:
        return f"error: verl main_ppo exited with {returncode}: {d.message} (main_ppo's output: {path})", d.resumable
    return f"error: verl main_ppo exited with {returncode}; last lines of {path}:\n{text[-tail_chars:]}", True
