"""The recipes as package data: every shipped recipe composes and validates through the package lookup from a
working directory outside the repository, the verl plugin registers the recipes' path resolver in any process
that imports verl (``main_ppo``'s driver and Ray workers), and a built wheel holds every recipe file."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stare_verl.jobs.recipes import compose_recipe, recipe_names, recipes_dir, validate_recipe
from stare_verl.jobs.sft import compose_sft
from tests.support import REPO

pytestmark = pytest.mark.integration

# the keys the CPU recipes leave to the driver (???)
PLACEHOLDERS = [
    "actor_rollout_ref.model.path=x",
    "data.train_files=x",
    "data.val_files=x",
    "trainer.default_local_dir=x",
]
CPU = recipes_dir() / "cpu"
# the RL recipes (cpu/noop_tool.yaml is a tool config: no Hydra defaults)
SHIPPED = [
    *recipe_names(),
    *(f"cpu/{n}" for n in recipe_names(CPU) if "defaults:" in (CPU / f"{n}.yaml").read_text()),
]


def _paths_named(cfg) -> list[str]:
    """The file paths a composed RL recipe names (tool config, custom reward function), pkg:// ones left out."""
    paths = [cfg.actor_rollout_ref.rollout.multi_turn.get("tool_config_path"),
             (cfg.reward.get("custom_reward_function") or {}).get("path")]  # fmt: skip
    return [p for p in paths if p and not p.startswith("pkg://")]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_recipe_composes_and_validates_outside_the_repository(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STARE_VERL_REPO", raising=False)
    cfg = compose_recipe(name, PLACEHOLDERS)
    validate_recipe(cfg)
    for path in _paths_named(cfg):
        assert os.path.isabs(path) and recipes_dir() in Path(path).parents, path
        assert os.path.isfile(path)


def test_the_recipes_list_covers_the_families_and_the_cpu_runs():
    gpu = [n for n in SHIPPED if not n.startswith("cpu/")]
    assert len(gpu) == 12  # six STARE / GRPO-ds pairs
    assert {"shortcot_qwen2.5-math-1.5b_stare", "shortcot_qwen2.5-math-1.5b_grpo"} <= set(gpu)
    cpu_runs = {f"cpu/{f}_tiny_{m}" for f in ("shortcot", "longcot", "tooluse") for m in ("stare", "grpo")}
    pretrained = {f"cpu/{f}_real_{m}" for f in ("shortcot", "tooluse") for m in ("stare", "grpo")}  # --model runs
    assert sorted(n for n in SHIPPED if n.startswith("cpu/")) == sorted([*cpu_runs, *pretrained, "cpu/tiny_grpo"])


@pytest.mark.parametrize("name", recipe_names(recipes_dir() / "sft"))
def test_every_sft_recipe_composes_outside_the_repository(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose_sft(name)
    assert cfg.trainer.experiment_name


def test_importing_verl_registers_the_recipe_path_resolver(tmp_path):
    """``python -m verl.trainer.main_ppo`` resolves the config in its driver and Ray workers: each imports verl,
    which loads the plugin; checked in a fresh process outside the repository."""
    code = ("import verl\nfrom omegaconf import OmegaConf\n"
            "print(OmegaConf.create({'p': '${stare_verl.recipe_file:cpu/toy_reward.py}'}).p)")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("STARE_VERL_REPO", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(recipes_dir() / "cpu" / "toy_reward.py")


def test_the_built_wheel_holds_every_recipe_file(tmp_path):
    """Builds the wheel (setuptools' PEP 517 hook, no network) from a copy of the project, the link kept as a
    link, and compares its ``stare_verl/recipes/`` with the top-level ``recipes/`` folder."""
    build_meta = pytest.importorskip("setuptools.build_meta")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("stare_verl", "envs", "recipes"):
        shutil.copytree(REPO / folder, src / folder, symlinks=True, ignore=ignore)
    assert (src / "stare_verl" / "recipes").is_symlink()
    out = tmp_path / "dist"
    code = f"import sys, {build_meta.__name__} as b; print(b.build_wheel(sys.argv[1]))"
    res = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    wheel = out / res.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("stare_verl/") for n in names if n.startswith("stare_verl/recipes/")}
    root = REPO / "recipes"
    source = {f"recipes/{p.relative_to(root).as_posix()}" for p in root.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}  # fmt: skip
    assert shipped == source
    assert "stare_verl/recipe_files.py" in names and "envs/plugin.py" in names
