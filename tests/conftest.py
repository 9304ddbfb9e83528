"""Shared pytest hooks.

- The test tier follows the folder (``unit/``, ``integration/``, ``e2e/``): tests under ``tests/e2e/`` get the
  ``e2e`` marker (registered in pyproject): ``pytest -m "not e2e"`` skips the end-to-end runs (minutes each on a
  CPU), ``pytest -m e2e`` runs only them; ``make test`` runs everything.
- Tests marked ``gpu`` are skipped where CUDA is not available (``make test-gpu`` runs them).
- Under pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``) every test carries an ``xdist_group``: all
  end-to-end tests share one group (one worker runs them one after another: each already keeps both cores busy, and
  their module-scoped launches are shared by several tests), every other file is a group of its own (its
  module-scoped fixtures are built once, on one worker). The e2e group is collected first, so it starts first.
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
    root = Path(str(config.rootpath)).resolve()
    for item in items:
        path = Path(str(item.path)).resolve()
        if _E2E in path.parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group("e2e"))
        else:
            item.add_marker(pytest.mark.xdist_group(str(path.relative_to(root)) if root in path.parents else path.name))
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (an NVIDIA GPU): run make test-gpu on a GPU machine")
    for item in gpu_items:
        item.add_marker(skip)
