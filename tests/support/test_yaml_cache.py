"""tests.support.yaml_cache: ``OmegaConf.load`` (installed for the session by tests/conftest.py) gives what a fresh
load gives, each call its own copy, a rewritten file's new text, and the same errors."""

from __future__ import annotations

import io

import pytest
import yaml
from omegaconf import OmegaConf

from tests.support import yaml_cache

TEXT = "a: 1\nb: ${a}\nc: {d: [1, 2.5, x], e: null}\n"


def test_the_session_loads_through_the_cache():
    assert OmegaConf.load is yaml_cache.cached_load


def test_a_load_is_a_fresh_load_each_time(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(TEXT)
    first = OmegaConf.load(path)
    assert first == yaml_cache._real_load(path) and first.b == 1
    first.c.d.append(3)  # a caller changes its copy
    OmegaConf.set_readonly(first, True)
    second = OmegaConf.load(str(path))
    assert OmegaConf.to_container(second) == {"a": 1, "b": "${a}", "c": {"d": [1, 2.5, "x"], "e": None}}
    assert second is not first and not OmegaConf.is_readonly(second)
    with open(path) as text, open(path, "rb") as raw:
        assert OmegaConf.load(text) == OmegaConf.load(raw) == second
    assert OmegaConf.load(io.StringIO("- 1\n- 2\n")) == OmegaConf.create([1, 2])
    assert OmegaConf.load(io.StringIO("")) == OmegaConf.create()
    path.write_text("a: 2\n")  # the same file, another text
    assert OmegaConf.load(path) == OmegaConf.create({"a": 2})


def test_errors_are_those_of_a_fresh_load(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("a: [1\n")
    for _ in range(2):
        with pytest.raises(yaml.YAMLError, match=f'in "{path}", line 2'):
            OmegaConf.load(path)
        with open(path) as f, pytest.raises(yaml.YAMLError, match=f'in "{path}", line 2'):
            OmegaConf.load(f)
    with pytest.raises(FileNotFoundError):
        OmegaConf.load(tmp_path / "missing.yaml")
    with pytest.raises(TypeError, match="Unexpected file type"):
        OmegaConf.load(3)
