"""Helpers for the CPU backend tests: tiny model/dataset (from ``tests.support.tiny``), the ``main_ppo`` command
line, one launch of it with the leftover-process check (:func:`launch_main_ppo`), verl's metrics file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stare_verl.jobs.procs import RUN_TAG_ENV, cpu_env, kill_processes, remove_orphan_shm, tagged_processes  # noqa: F401
from tests.support import REPO
from tests.support.tiny import build_tiny_model, build_tool_calling_model, build_toy_dataset  # noqa: F401

# Ray waits a hard-coded 30 s for its own raylet; on an overloaded shared CPU that start can fail before anything
# of ours ran. This line in the log is that failure (ray/_private/node.py), and the only one launched again.
RAY_START_TIMEOUT = "The current node timed out during startup"


def main_ppo_cmd(config_name: str, overrides: list[str]) -> list[str]:
    """``python -m verl.trainer.main_ppo`` with a recipe from ``recipes/cpu`` and overrides."""
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={REPO / 'recipes' / 'cpu'}",
        f"--config-name={config_name}",
        *overrides,
    ]


@dataclass
class Launch:
    """What one :func:`launch_main_ppo` left: ``rc`` (exit status, or ``"timeout"``), ``wall`` (seconds of the last
    attempt), ``log_path`` (its output), ``leaked`` (tagged processes still alive after the settle time, then
    killed), ``still_alive`` (those that survived the kill), ``attempts`` (launches, > 1 only after Ray start-up
    timeouts)."""

    rc: int | str
    wall: float
    log_path: Path
    leaked: list[int]
    still_alive: list[int]
    attempts: int
    shm_removed: list[str] = field(default_factory=list)  # segments the run left unmapped (remove_orphan_shm)

    def log(self) -> str:
        """The whole log of the last attempt."""
        return self.log_path.read_text(errors="replace")

    def failure(self, name: str, tail: int = 4000) -> str | None:
        """None when the run exited with 0, else one message with the exit status, the time and the log's tail."""
        if self.rc == 0:
            return None
        return f"main_ppo ({name}) exited with {self.rc} after {self.wall:.0f}s; log tail:\n{self.log()[-tail:]}"


def launch_main_ppo(
    cmd: list[str],
    env: dict[str, str],
    cwd: str | os.PathLike,
    log_path: str | os.PathLike,
    timeout_s: float,
    *,
    settle_s: float = 60.0,
    attempts: int = 3,
    ran: Callable[[], bool] | None = None,
) -> Launch:
    """Run ``cmd`` (a ``main_ppo`` command) to its end, its output (stdout and stderr) to ``log_path``; then wait
    up to ``settle_s`` (60 s: Ray took over 20 s to shut down at load 20) for the processes tagged ``env[RUN_TAG_ENV]`` to go (Ray's own shutdown should leave none)
    and kill those still there (reported in ``leaked``).

    A failed run is launched again (``attempts`` in all) only when its log holds :data:`RAY_START_TIMEOUT` and
    ``ran`` (when given) says nothing of ours ran yet (e.g. no file a step writes); any other failure, and a
    timeout after ``timeout_s`` seconds, is returned as it is.

    Raises:
        KeyError: ``env`` has no ``RUN_TAG_ENV`` (without a tag the leftovers cannot be found).
    """
    tag = env[RUN_TAG_ENV]
    log_path = Path(log_path)
    launched = 0
    while True:
        launched += 1
        t0 = time.time()
        with open(log_path, "w") as log:
            try:
                rc: int | str = subprocess.run(
                    cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
                ).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        wall = time.time() - t0
        deadline = time.time() + settle_s
        while time.time() < deadline and tagged_processes(tag):
            time.sleep(0.5)
        leaked = tagged_processes(tag)
        still_alive = kill_processes(leaked)
        shm_removed = remove_orphan_shm(t0 - 1.0)
        start_failed = rc not in (0, "timeout") and RAY_START_TIMEOUT in log_path.read_text(errors="replace")
        if launched >= attempts or not start_failed or (ran is not None and ran()):
            return Launch(rc, wall, log_path, leaked, still_alive, launched, shm_removed)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Step metrics written by verl's ``file`` logger (one JSON object per line)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out
