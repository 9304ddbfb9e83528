"""Helpers for the CPU backend tests: tiny model/dataset (from ``stare_verl.cpu.tiny``), Ray cleanup."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from stare_verl.cpu.tiny import build_tiny_model, build_tool_calling_model, build_toy_dataset  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


RUN_TAG_ENV = "STARE_CPU_TEST_RUN"


def tagged_processes(tag: str) -> list[int]:
    """PIDs of live processes whose environment has ``STARE_CPU_TEST_RUN=<tag>``.

    A test starts ``main_ppo`` with a unique tag; every process it spawns (Ray's gcs_server, raylet,
    workers, actors) inherits it, so leftovers are found without touching anyone else's processes.
    """
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
        if needle in env and _alive(int(entry)):
            pids.append(int(entry))
    return pids


def kill_processes(pids: list[int], timeout: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL, the given PIDs; return those still alive afterwards."""
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
