"""Shared pytest hooks: tests marked ``gpu`` are skipped where CUDA is not available (``make test-gpu`` runs them)."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (an NVIDIA GPU): run make test-gpu on a GPU machine")
    for item in gpu_items:
        item.add_marker(skip)
