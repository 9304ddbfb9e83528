"""A model folder as the model checks see one (``config.json`` and a small but well-formed ``model.safetensors``),
for tests that give ``--model PATH``, ``MODEL=...`` or a model-path override without loading the model: the checks
read the weights' header only (:func:`stare_verl.models.registry.weights_problem`), so a config-only folder is
refused and this one is not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

N_VALUES = 4096
"""Float32 values of the one tensor ``w`` written (16 KiB: room for a truncation half-way through the data)."""


def write_weights(path: Path) -> Path:
    """Write a safetensors file at ``path``: one float32 tensor ``w`` of shape ``(N_VALUES,)`` holding
    ``0, 1, ..., N_VALUES - 1``. Returns ``path``."""
    from safetensors.numpy import save_file

    save_file({"w": np.arange(N_VALUES, dtype=np.float32)}, str(path))
    return path


def write_model_folder(folder: Path, config: dict[str, Any] | None = None, weights: bool = True) -> Path:
    """Create ``folder`` (and its parents; an existing one is kept) with ``config.json`` (``config``, default
    ``{}``) and, when ``weights``, ``model.safetensors`` (:func:`write_weights`). Returns ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {}))
    if weights:
        write_weights(folder / "model.safetensors")
    return folder
