"""Where the project's verl recipes are, in a source checkout and in an installed wheel alike.

The recipe YAMLs (and the files they name: tool configs, the toy reward function) live in the top-level
``recipes/`` folder of the repository. They ship as package data of ``stare_verl``: in the source tree
``stare_verl/recipes`` is a symbolic link to ``../recipes``, and the wheel build copies what it points to
(``[tool.setuptools.package-data]`` in pyproject.toml). :func:`recipes_dir` finds them through
``importlib.resources``; it is the one way the code finds a recipe.

A recipe names a file beside it with the OmegaConf resolver ``${stare_verl.recipe_file:<path under recipes/>}``
(e.g. ``tool_config_path: ${stare_verl.recipe_file:tool_use/tool_config.yaml}``): it resolves to the absolute
path, so the recipe works from any working directory. :func:`register_resolver` registers it; the verl plugin
(``stare_verl.plugin``) calls it in every process that imports verl, so ``python -m verl.trainer.main_ppo``
resolves it in the driver and in its Ray workers.

verl-free: imports only the standard library and OmegaConf.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["RESOLVER", "recipe_file", "recipes_dir", "register_resolver"]

RESOLVER = "stare_verl.recipe_file"


def recipes_dir() -> Path:
    """The folder holding the recipes (``recipes_dir() / "cpu" / "tiny_grpo.yaml"``), as an absolute path with
    symbolic links resolved (in a source checkout: the repository's ``recipes/``).

    Raises:
        FileNotFoundError: the installed ``stare_verl`` has no recipes folder on the file system (a broken install,
            or one Hydra and verl cannot read, e.g. a zip import).
    """
    folder = resources.files("stare_verl") / "recipes"
    if not isinstance(folder, Path) or not folder.is_dir():
        raise FileNotFoundError(
            f"no recipes folder at {folder}: reinstall stare-verl (the wheel ships them as stare_verl/recipes; "
            "in a source checkout stare_verl/recipes is a symbolic link to ../recipes)"
        )
    return folder.resolve()


def recipe_file(relative: str) -> str:
    """The absolute path of ``relative`` (e.g. ``tool_use/tool_config.yaml``) under :func:`recipes_dir`; the
    ``${stare_verl.recipe_file:...}`` resolver.

    Raises:
        ValueError: ``relative`` is absolute or leaves the recipes folder.
        FileNotFoundError: no such file (or no recipes folder).
    """
    root = recipes_dir()
    path = (root / relative).resolve()
    if Path(relative).is_absolute() or root not in path.parents:
        raise ValueError(f"{RESOLVER}: {relative!r} must be a path inside the recipes folder {root}")
    if not path.is_file():
        raise FileNotFoundError(f"{RESOLVER}: no file {relative!r} in the recipes folder {root}")
    return str(path)


def register_resolver() -> None:
    """Register the ``stare_verl.recipe_file`` OmegaConf resolver (idempotent). Its value is not cached: it is
    looked up each time a config resolves it."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, recipe_file)
