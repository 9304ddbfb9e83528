"""Helpers for the CPU backend tests: tiny model/dataset (from ``stare_verl.jobs.tiny``), Ray cleanup."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from stare_verl.jobs.procs import RUN_TAG_ENV, cpu_env, kill_processes, tagged_processes  # noqa: F401
from stare_verl.jobs.tiny import build_tiny_model, build_tool_calling_model, build_toy_dataset  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


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
