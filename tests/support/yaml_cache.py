"""``OmegaConf.load`` with its results kept by file text for the test session (installed by ``tests/conftest.py``).

Each composition of a verl recipe (``stare_verl.jobs.recipes.compose_recipe``, the dry runs, ``compare``'s checks)
has Hydra read and parse the same thirty-odd YAML files again: verl's ``ppo_trainer`` tree and the recipes. The
suite composes hundreds of times, and the YAML parsing and config building of those files was most of each
composition's time. Here each distinct text is parsed once; every call still reads its file and gets a deep copy of
the config that text gives, so a test sees what a fresh ``OmegaConf.load`` gives: a file written anew is parsed
anew, and a text that does not parse raises the same error (naming the same file) each time it is read.
"""

from __future__ import annotations

import copy
import io
import os
import pathlib
from collections.abc import Callable
from typing import IO, Any

from omegaconf import DictConfig, ListConfig, OmegaConf

_real_load: Callable[[Any], DictConfig | ListConfig] | None = None
_parsed: dict[str | bytes, DictConfig | ListConfig] = {}


def cached_load(file_: str | pathlib.Path | IO[Any]) -> DictConfig | ListConfig:
    """``OmegaConf.load(file_)`` (a path, or an open text or binary file read from where it stands), parsed only
    the first time its text is seen; returns a deep copy of that config (callers may change it).

    Raises:
        what ``OmegaConf.load`` raises: ``TypeError`` for anything else than a path or a file, ``OSError`` for a
        path that cannot be read, yaml's errors (naming the file) for a text that does not parse.
    """
    assert _real_load is not None, "install() first"
    if isinstance(file_, (str, pathlib.Path)):
        with open(os.path.abspath(file_), encoding="utf-8") as f:
            text: str | bytes = f.read()
        name = os.path.abspath(file_)
    elif getattr(file_, "read", None):
        text = file_.read()
        name = getattr(file_, "name", None)
    else:
        return _real_load(file_)  # OmegaConf's own TypeError
    if text not in _parsed:
        stream = io.BytesIO(text) if isinstance(text, bytes) else io.StringIO(text)
        if name is not None:
            stream.name = name  # yaml's error marks name the file, as they do for the file itself
        _parsed[text] = _real_load(stream)
    return copy.deepcopy(_parsed[text])


def install() -> None:
    """Make ``OmegaConf.load`` :func:`cached_load` (a second call does nothing)."""
    global _real_load
    if _real_load is None:
        _real_load = OmegaConf.load
        OmegaConf.load = staticmethod(cached_load)  # type: ignore[method-assign]


def uninstall() -> None:
    """Give ``OmegaConf.load`` back and forget what was parsed."""
    global _real_load
    if _real_load is not None:
        OmegaConf.load = staticmethod(_real_load)  # type: ignore[method-assign]
        _real_load = None
        _parsed.clear()
