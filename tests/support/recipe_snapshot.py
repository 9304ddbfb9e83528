"""Every launchable recipe of a recipes folder composed as Hydra would, unresolved, as one JSON object.

For refactors of the recipe files (moving keys into shared files, renaming includes): the composed configs
must not change. Compare a folder before and after, e.g. against ``main``::

    git archive main recipes | tar -x -C /tmp/before
    PYTHONPATH=$PWD python -m tests.support.recipe_snapshot /tmp/before/recipes > /tmp/before.json
    PYTHONPATH=$PWD python -m tests.support.recipe_snapshot recipes > /tmp/after.json
    PYTHONPATH=$PWD python -m tests.support.recipe_snapshot --diff /tmp/before.json /tmp/after.json

The launchable recipes are the YAMLs directly in ``recipes/``, ``recipes/cpu/`` and ``recipes/sft/`` (the
``base/`` and ``common/`` files are fragments they include). Each is composed with no override and with
:data:`OVERRIDES` (a few keys the drivers set), and kept as ``OmegaConf.to_container(cfg, resolve=False)``:
interpolations stay as written, so the result does not depend on the environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SUBFOLDERS = ("", "cpu", "sft")
OVERRIDES = ["trainer.total_training_steps=3", "trainer.experiment_name=snapshot"]


def snapshot(recipes: Path) -> dict[str, Any]:
    """``{"<sub>/<name>|<overrides>": composed config}`` for every launchable recipe under ``recipes``.

    Raises:
        hydra.errors.HydraException: a recipe does not compose.
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    out: dict[str, Any] = {}
    for sub in SUBFOLDERS:
        folder = (recipes / sub).resolve()
        for path in sorted(folder.glob("*.yaml")):
            if "defaults" not in path.read_text():  # a tool config, not a recipe
                continue
            for overrides in ([], OVERRIDES):
                with initialize_config_dir(config_dir=str(folder), version_base=None):
                    cfg = compose(config_name=path.stem, overrides=overrides)
                key = f"{sub}/{path.stem}|{' '.join(overrides)}"
                out[key] = OmegaConf.to_container(cfg, resolve=False)
    return out


def diff(a: Any, b: Any, where: str = "") -> list[str]:
    """The key paths where two nested containers differ (empty when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in diff(a.get(k, "<absent>"), b.get(k, "<absent>"),
                                                                          f"{where}.{k}" if where else str(k))]  # fmt: skip
    if a != b:
        return [f"{where}: {a!r} -> {b!r}"]
    return []


def main(argv: list[str] | None = None) -> int:
    """Print a folder's snapshot as JSON, or with ``--diff A B`` the differences of two snapshots (exit 1)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recipes", nargs="?", help="a recipes folder")
    p.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="two snapshot JSON files")
    args = p.parse_args(argv)
    if args.diff:
        before, after = (json.loads(Path(f).read_text()) for f in args.diff)
        lines = diff(before, after)
        print("\n".join(lines) if lines else f"identical: {len(before)} composed configs")
        return 1 if lines else 0
    json.dump(snapshot(Path(args.recipes)), sys.stdout, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
