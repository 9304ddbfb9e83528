"""When a CPU run's ``main_ppo`` has stopped making progress (:class:`StallWatch`), so the job stops it with an error
instead of waiting for ever.

Why: verl's V1 trainer samples each batch from its replay buffer, which waits until every episode of the batch is
finished or failed. An agent-loop worker that dies (a crash in native code, the OOM killer) leaves its episodes
"running" for ever: the trainer logs ``pending: 0, running: 8, finished: 0`` once a minute and never fails. Seen
when a sandbox pipe's descriptor was closed twice under uvloop (the worker aborted in ZeroMQ, SIGABRT; fixed in
``envs.sandbox._io``); any other death of a worker has the same end. The job watches main_ppo's output and its
logged steps: a Ray worker's death followed by no step for ``after_death_s``, or no step at all for ``no_step_s``,
stops the run (its checkpoints stay; the same command resumes from the last one).

Some deaths never reach main_ppo's output: Ray's memory monitor kills idle actors (the rollout server, the agent-loop
worker) between two calls, and the kernel's OOM killer kills a process outright; the driver is told nothing, and
only Ray's own logs (the raylet's and the GCS's, in the run's Ray session folder) say so. :class:`RayLogTail` reads
those logs as they grow and hands their death lines to the same watch.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from stare_verl.jobs.exits import STALLED

__all__ = ["DEFAULT_AFTER_DEATH_S", "DEFAULT_NO_STEP_S", "MIN_NO_STEP_S", "RAY_LOG_DEATH", "STALL_ENV", "STALLED",
           "WORKER_DEATH", "RayLogTail", "StallWatch", "no_step_timeout"]  # fmt: skip

STALL_ENV = "STARE_STALL_TIMEOUT_S"
"""Environment variable: seconds without a new RL step before a CPU run is stopped (0: never)."""

DEFAULT_NO_STEP_S = 1800.0
"""Without a new step for this long (start-up included), a CPU run is stopped: the tiny recipes' steps take 3-60 s
and their start-up 1-3 minutes on 2 cores, so half an hour is a hang, not a slow step."""

DEFAULT_AFTER_DEATH_S = 180.0
"""After a Ray worker's death is logged, a run with no new step for this long (or twice its longest step so far,
when that is longer: a real model's steps take minutes) is stopped."""

WORKER_DEATH = re.compile(
    r"A worker died or was killed while executing a task"
    r"|\*\*\* SIG(?:ABRT|SEGV|BUS|ILL|FPE) received at time="
    r"|^(?:\x1b\[[0-9;]*m)*(?:\([^)]*\))?(?:\x1b\[[0-9;]*m)*\s*Fatal Python error: "
    r"|The actor died unexpectedly|ActorDiedError"
)
"""A line of main_ppo's output (Ray's log prefixes included) that reports the death of one of its processes: Ray's
and the fault handler's own wording (``Fatal Python error:`` only at the start of a process's line, so a message that
merely quotes it does not count)."""

RAY_LOG_DEATH = re.compile(
    r"Killing \d+ worker\(s\), kill details: .*"
    r"|Actor is failed on worker \S+ .*death context type = \w+.*"
)
"""A line of Ray's own logs that reports a death main_ppo's output may never show: the raylet's memory monitor
killing workers (``raylet.out``), the GCS marking an actor failed, whatever the cause (``gcs_server.out``: Ray's
out-of-memory kill, a SIGKILL from the kernel, a crash while the actor was idle)."""

MIN_NO_STEP_S = 60.0
"""The shortest ``$STARE_STALL_TIMEOUT_S`` taken: the wait counts the start-up (1-3 minutes on 2 cores)."""


def no_step_timeout(env: dict[str, str] | None = None) -> float:
    """Seconds without a step before a run is stopped: ``$STARE_STALL_TIMEOUT_S`` (0: never, returned as ``inf``;
    then the run is never stopped for a worker's death either), default :data:`DEFAULT_NO_STEP_S`.

    Raises:
        ValueError: the variable is not a finite number, is negative, or is below :data:`MIN_NO_STEP_S` (a run
            would be stopped during its start-up).
    """
    raw = (os.environ if env is None else env).get(STALL_ENV, "").strip()
    if not raw:
        return DEFAULT_NO_STEP_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{STALL_ENV}={raw!r}: give the seconds without an RL step before a run is stopped "
                         f"(at least {MIN_NO_STEP_S:g}; 0: never)")  # fmt: skip
    if value == 0:
        return math.inf
    if value < MIN_NO_STEP_S:
        raise ValueError(f"{STALL_ENV}={raw!r}: at least {MIN_NO_STEP_S:g} seconds (the wait includes the run's "
                         "start-up, 1-3 minutes on 2 cores), or 0 for never")  # fmt: skip
    return value


@dataclass
class StallWatch:
    """Progress of one ``main_ppo`` run: feed it output lines (:meth:`line`) and new steps (:meth:`step`), ask
    :meth:`verdict`. Times are seconds on any one clock (e.g. ``time.monotonic()``).

    Attributes:
        started: when the run was launched.
        no_step_s: the longest wait for a step (the first one included).
        after_death_s: the longest wait for a step once a worker's death was logged.
    """

    started: float
    no_step_s: float = DEFAULT_NO_STEP_S
    after_death_s: float = DEFAULT_AFTER_DEATH_S
    last_progress: float = field(init=False)
    death_line: str | None = field(init=False, default=None)
    death_at: float | None = field(init=False, default=None)
    steps: int = field(init=False, default=0)
    longest_step_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.last_progress = self.started
        if math.isinf(self.no_step_s):  # stopping switched off ($STARE_STALL_TIMEOUT_S=0): for deaths too
            self.after_death_s = math.inf

    def line(self, text: str, now: float) -> None:
        """One line of output; the first that reports a worker's death (since the last step) is kept."""
        if WORKER_DEATH.search(text):
            self.death(text, now)

    def death(self, text: str, now: float) -> None:
        """A line known to report a death (e.g. from :class:`RayLogTail`); kept if it is the first since the last
        step."""
        if self.death_line is None:
            self.death_line = text.strip()[-300:]
            self.death_at = now

    def step(self, now: float) -> None:
        """A new RL step was logged: the run is alive (a death logged before it did not stop it)."""
        if self.steps:  # from the second step on: the first one's wait includes the start-up
            self.longest_step_s = max(self.longest_step_s, now - self.last_progress)
        self.steps += 1
        self.last_progress = now
        self.death_line = self.death_at = None

    @property
    def death_grace_s(self) -> float:
        """How long a run may go without a step after a death: ``after_death_s``, or twice the longest step so far."""
        return max(self.after_death_s, 2.0 * self.longest_step_s)

    def verdict(self, now: float) -> str | None:
        """Why the run should be stopped now, or None while it may still be making progress."""
        if self.death_at is not None and now - max(self.death_at, self.last_progress) >= self.death_grace_s:
            from stare_verl.jobs.failure import diagnose

            why = diagnose(self.death_line or "")
            remedy = f" ({why.message})" if why is not None and why.kind == "out_of_memory" else ""
            return (f"a Ray worker died ({self.death_line!r}) and no RL step followed in {now - self.death_at:.0f} s: "
                    f"verl's trainer waits for a dead worker's episodes for ever{remedy}")  # fmt: skip
        if now - self.last_progress >= self.no_step_s:
            return (f"no RL step in {now - self.last_progress:.0f} s (the limit: ${STALL_ENV}, "
                    f"{self.no_step_s:.0f} s)")  # fmt: skip
        return None


class RayLogTail:
    """The death lines (:data:`RAY_LOG_DEATH`) Ray's own logs gain under one Ray temp root: each call to
    :meth:`new_lines` reads what ``<root>/ray/session_*/logs/{raylet,gcs_server}.out`` gained since the last call.

    Args:
        root: the run's ``RAY_TMPDIR`` (Ray keeps its sessions in ``<root>/ray``); it may not exist yet.
        max_read: the most bytes read from one file per call (the rest is read by the next calls).
    """

    FILES = ("raylet.out", "gcs_server.out")

    def __init__(self, root: Path | str, max_read: int = 4 << 20):
        self.root = Path(root)
        self.max_read = max_read
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def new_lines(self) -> list[str]:
        """The death lines written since the last call, oldest first per file (raylet's before the GCS's); a line
        still being written is kept for the next call. Files that vanish or cannot be read are skipped."""
        out: list[str] = []
        found = [p for p in (self.root / "ray").glob("session_2*/logs/*.out") if p.name in self.FILES]
        for path in sorted(found, key=lambda p: (p.parent.parent.name, self.FILES.index(p.name))):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    chunk = f.read(self.max_read)
            except OSError:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(chunk)
            data = self._partial.pop(path, b"") + chunk
            lines = data.split(b"\n")
            if lines[-1]:
                self._partial[path] = lines[-1]
            for raw in lines[:-1]:
                text = raw.decode("utf-8", errors="replace")
                if RAY_LOG_DEATH.search(text):
                    out.append(text.strip())
        return out

