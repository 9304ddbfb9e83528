"""Shared pytest hooks.

- The test tier follows the folder (``unit/``, ``integration/``, ``e2e/``): tests under ``tests/e2e/`` get the
  ``e2e`` marker (registered in pyproject): ``pytest -m "not e2e"`` skips the end-to-end runs (minutes each on a
  CPU), ``pytest -m e2e`` runs only them; ``make test`` runs everything.
- Tests marked ``gpu`` are skipped where CUDA is not available (``make test-gpu`` runs them).
- Tests marked ``cluster`` (several verl launches on a local multi-node Ray cluster) run only when the ``-m``
  expression names ``cluster`` (``make test-cluster``); ``make test`` skips them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_E2E = Path(__file__).resolve().parent / "e2e"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _E2E in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
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
