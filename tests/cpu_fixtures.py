"""Helpers for the CPU backend tests: tiny model/dataset (from ``stare_verl.cpu.tiny``), Ray cleanup."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from stare_verl.cpu.tiny import build_tiny_model, build_toy_dataset  # noqa: F401  (re-exported)

REPO = Path(__file__).resolve().parents[1]


def ray_processes() -> list[int]:
    """PIDs of Ray processes (raylet, gcs_server, workers) started by this user."""
    try:
        out = subprocess.run(
            ["ps", "-u", str(os.getuid()), "-o", "pid=,args="], capture_output=True, text=True
        )
    except OSError:
        return []
    pids = []
    for line in out.stdout.splitlines():
        pid, _, args = line.strip().partition(" ")
        if re.search(r"(raylet|gcs_server|ray::|default_worker\.py|dashboard\.py|log_monitor\.py)", args):
            pids.append(int(pid))
    return [p for p in pids if p != os.getpid()]


def kill_new_ray_processes(before: set[int], timeout: float = 10.0) -> list[int]:
    """Terminate Ray processes that were not running before (by PID); return those still alive after."""
    new = [p for p in ray_processes() if p not in before]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in new:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout / 2
        while time.time() < deadline and any(_alive(p) for p in new):
            time.sleep(0.2)
    return [p for p in new if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def cpu_env(extra: dict | None = None) -> dict:
    """Environment for a ``main_ppo`` subprocess on the CPU backend."""
    env = dict(os.environ)
    env.update(
        {
            "VERL_PLATFORM": "cpu",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "RAY_DEDUP_LOGS": "0",
            "PYTHONUNBUFFERED": "1",
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        }
    )
    env.update(extra or {})
    return env


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


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Step metrics written by verl's ``file`` logger (one JSON object per line)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out
