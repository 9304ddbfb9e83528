"""Where the recipes are found (``stare_verl.recipe_files``): the package's ``recipes`` folder is the repository's
top-level ``recipes/`` (through a symbolic link), the package data spec covers every file in it, and the
``${stare_verl.recipe_file:...}`` resolver gives absolute paths inside it only."""

import glob
import os

import pytest
from omegaconf import OmegaConf

from stare_verl.recipe_files import RESOLVER, recipe_file, recipes_dir, register_resolver
from tests.support import REPO


def _source_files() -> set[str]:
    """Every file of the top-level recipes/ folder, as ``recipes/<path>`` (caches left out)."""
    root = REPO / "recipes"
    return {
        f"recipes/{p.relative_to(root).as_posix()}"
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_the_package_recipes_folder_is_the_top_level_one():
    link = REPO / "stare_verl" / "recipes"
    assert link.is_symlink() and os.readlink(link) == "../recipes"
    assert recipes_dir() == (REPO / "recipes").resolve()
    assert (recipes_dir() / "cpu" / "base" / "cpu_common.yaml").is_file()


def test_the_package_data_spec_covers_every_recipe_file():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "stare_verl"
    ]
    # setuptools expands the globs relative to the package folder, following the link
    shipped = {
        m for pattern in spec for m in glob.glob(pattern, root_dir=REPO / "stare_verl", recursive=True)
    }
    shipped = {m for m in shipped if (REPO / "stare_verl" / m).is_file() and "__pycache__" not in m}
    source = _source_files()
    assert any(f.endswith(".yaml") for f in source) and "recipes/cpu/toy_reward.py" in source
    assert shipped == source


def test_recipe_file_gives_absolute_paths_inside_the_recipes_folder():
    path = recipe_file("tool_use/tool_config.yaml")
    assert os.path.isabs(path) and path == str(recipes_dir() / "tool_use" / "tool_config.yaml")
    with pytest.raises(FileNotFoundError, match="no_such.yaml"):
        recipe_file("tool_use/no_such.yaml")
    for bad in ("../pyproject.toml", "/etc/passwd", "cpu/../../README.md"):
        with pytest.raises(ValueError, match="inside the recipes folder"):
            recipe_file(bad)


def test_the_resolver_resolves_in_a_config_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    register_resolver()
    register_resolver()  # idempotent
    cfg = OmegaConf.create({"tool": "${" + RESOLVER + ":tool_use/tool_config.yaml}"})
    assert cfg.tool == str(recipes_dir() / "tool_use" / "tool_config.yaml")


def test_the_recipes_command_lists_the_cpu_defaults_too(capsys):
    from stare_verl.jobs import cli

    assert cli.main(["recipes"]) == 0
    names = capsys.readouterr().out.split()
    assert {"cpu/shortcot_tiny_stare", "cpu/tooluse_tiny_grpo", "shortcot_qwen2.5-math-7b_stare"} <= set(names)
    assert "cpu/noop_tool" not in names  # a tool config, not a recipe
