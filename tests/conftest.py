"""Shared pytest hooks.

- The folders under ``tests/`` mirror the package path of what they test (``tests/envs/sandbox/``,
  ``tests/stare_verl/methods/``, ...); the test tier is a marker (registered in pyproject): ``integration`` (a test
  module's ``pytestmark``), ``e2e`` (every test under ``tests/e2e/``, marked here), ``gpu``, ``vllm``, and ``unit``
  for every test without one of those (marked here). ``pytest -m "not e2e"`` skips the end-to-end runs (minutes
  each on a CPU), ``pytest -m unit`` runs only the fast ones; ``make test`` runs everything.
- Tests marked ``gpu`` are skipped where CUDA is not available (``make test-gpu`` runs them).
- ``OmegaConf.load`` keeps what it parsed, by file text, for the session (``tests.support.yaml_cache``): the recipe
  compositions of the suite read the same YAML files hundreds of times.
- Tests marked ``cluster`` (several verl launches on a local multi-node Ray cluster) run only when the ``-m``
  expression names ``cluster`` (``make test-cluster``); ``make test`` skips them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import yaml_cache

_E2E = Path(__file__).resolve().parent / "e2e"
_TIERS = ("integration", "e2e", "gpu", "vllm", "cluster")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return torch.cuda.is_available()


def pytest_configure(config):
    yaml_cache.install()


def pytest_unconfigure(config):
    yaml_cache.uninstall()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _E2E in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
        if not any(item.get_closest_marker(tier) for tier in _TIERS):
            item.add_marker(pytest.mark.unit)
    if "cluster" not in (config.getoption("markexpr", "") or ""):
        skip_cluster = pytest.mark.skip(reason="a multi-node Ray cluster run: make test-cluster (pytest -m cluster)")
        for item in items:
            if item.get_closest_marker("cluster") is not None:
                item.add_marker(skip_cluster)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (an NVIDIA GPU): run make test-gpu on a GPU machine")
    for item in gpu_items:
        item.add_marker(skip)
