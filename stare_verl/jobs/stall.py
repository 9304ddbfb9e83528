"""When a CPU run's ``main_ppo`` has stopped making progress (:class:`StallWatch`), so the job stops it with an error
instead of waiting for ever.

Why: verl's V1 trainer samples each batch from its replay buffer, which waits until every episode of the batch is
finished or failed. An agent-loop worker that dies (a crash in native code, the OOM killer) leaves its episodes
"running" for ever: the trainer logs ``pending: 0, running: 8, finished: 0`` once a minute and never fails. Seen
when a sandbox pipe's descriptor was closed twice under uvloop (the worker aborted in ZeroMQ, SIGABRT; fixed in
``envs.sandbox._io``); any other death of a worker has the same end. The job watches main_ppo's output and its
logged steps: a Ray worker's death followed by no step for ``after_death_s``, or no step at all for ``no_step_s``,
stops the run (its checkpoints stay; the same command resumes from the last one).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

__all__ = ["DEFAULT_AFTER_DEATH_S", "DEFAULT_NO_STEP_S", "MIN_NO_STEP_S", "STALL_ENV", "STALLED", "WORKER_DEATH", "StallWatch",
           "no_step_timeout"]  # fmt: skip

STALLED = 124
"""Exit status of a run the job stopped because it made no progress (as ``timeout(1)`` reports one)."""

STALL_ENV = "STARE_STALL_TIMEOUT_S"
"""Environment variable: seconds without a new RL step before a CPU run is stopped (0: never)."""

DEFAULT_NO_STEP_S = 1800.0
"""Without a new step for this long (start-up included), a CPU run is stopped: the tiny recipes' steps take 3-60 s
and their start-up 1-3 minutes on 2 cores, so half an hour is a hang, not a slow step."""

DEFAULT_AFTER_DEATH_S = 180.0
"""After a Ray worker's death is logged, a run with no new step for this long is stopped."""

WORKER_DEATH = re.compile(
    r"A worker died or was killed while executing a task"
    r"|\*\*\* SIG(?:ABRT|SEGV|BUS|ILL|FPE) received at time="
    r"|^(?:\x1b\[[0-9;]*m)*(?:\([^)]*\))?(?:\x1b\[[0-9;]*m)*\s*Fatal Python error: "
    r"|The actor died unexpectedly|ActorDiedError"
)
"""A line of main_ppo's output (Ray's log prefixes included) that reports the death of one of its processes: Ray's
and the fault handler's own wording (``Fatal Python error:`` only at the start of a process's line, so a message that
merely quotes it does not count)."""

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

    def __post_init__(self) -> None:
        self.last_progress = self.started
        if math.isinf(self.no_step_s):  # stopping switched off ($STARE_STALL_TIMEOUT_S=0): for deaths too
            self.after_death_s = math.inf

    def line(self, text: str, now: float) -> None:
        """One line of output; the first that reports a worker's death (since the last step) is kept."""
        if self.death_line is None and WORKER_DEATH.search(text):
            self.death_line = text.strip()[-300:]
            self.death_at = now

    def step(self, now: float) -> None:
        """A new RL step was logged: the run is alive (a death logged before it did not stop it)."""
        self.last_progress = now
        self.death_line = self.death_at = None

    def verdict(self, now: float) -> str | None:
        """Why the run should be stopped now, or None while it may still be making progress."""
        if self.death_at is not None and now - max(self.death_at, self.last_progress) >= self.after_death_s:
            return (f"a Ray worker died ({self.death_line!r}) and no RL step followed in {now - self.death_at:.0f} s: "
                    "verl's trainer waits for a dead worker's episodes for ever")  # fmt: skip
        if now - self.last_progress >= self.no_step_s:
            return (f"no RL step in {now - self.last_progress:.0f} s (the limit: ${STALL_ENV}, "
                    f"{self.no_step_s:.0f} s)")  # fmt: skip
        return None
