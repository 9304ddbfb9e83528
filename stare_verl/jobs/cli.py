"""``stare-verl`` command line: inspect and validate recipes, run the project's jobs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stare_verl.jobs.exits import USAGE_ERROR


def _cmd_recipes(args: argparse.Namespace) -> int:
    from stare_verl.jobs.recipes import recipe_names, recipes_dir

    cpu = recipes_dir() / "cpu"  # the CPU defaults of the make targets (launchable: they compose ppo_trainer)
    names = recipe_names() + [f"cpu/{n}" for n in recipe_names(cpu) if "ppo_trainer" in (cpu / f"{n}.yaml").read_text()]
    print("\n".join(names))
    return 0


def _recipe_source(arg: str, tmp: str) -> tuple[str, Path | None] | str:
    """Where ``stare-verl check ARG`` composes from: ``(name, folder)`` for a recipe name (``folder`` None: the
    shipped recipes) or a YAML file on disk (its folder); a file without a ``defaults`` list (a user's own verl
    config) is composed on verl's ``ppo_trainer`` defaults, as ``main_ppo`` would, with every ``algorithm.stare``
    key at its default. Returns the one-line error (with the nearest recipe names) when ARG is neither."""
    import difflib

    from omegaconf import DictConfig, OmegaConf

    from stare_verl.jobs.recipes import recipe_names, recipes_dir

    if not arg.strip():
        return "error: an empty recipe name (a recipe name, a path to a recipe or to your own verl YAML)"
    path = Path(arg).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        path = path.resolve()
        try:
            own = OmegaConf.load(path)
        except Exception as err:  # noqa: BLE001 - a broken file is a one-line error
            return f"error: {arg!r} is no readable YAML: {err}"
        if not isinstance(own, DictConfig):
            return f"error: {arg!r} is no YAML mapping (a verl config is one)"
        if "defaults" in own:
            return path.stem, path.parent
        # the user's own config: on verl's ppo_trainer defaults and every algorithm.stare key at its default (so a
        # plain key=value override works), with the file's keys on top (a copy in a temp folder)
        from stare_verl.methods.stare.config import StareConfig

        head = OmegaConf.create({"hydra": {"searchpath": ["pkg://verl.trainer.config"]},
                                 "defaults": ["ppo_trainer", "_self_"],
                                 "algorithm": {"stare": StareConfig().model_dump()}})
        merged = OmegaConf.merge(head, own)
        Path(tmp, path.name).write_text(OmegaConf.to_yaml(merged))
        return path.stem, Path(tmp)
    names = sorted(set(recipe_names()) | {f"cpu/{n}" for n in recipe_names(recipes_dir() / "cpu")})
    name = arg.removesuffix(".yaml")
    if name in names:
        return name, None
    if path.exists():  # a file or folder that is no YAML recipe (a recipe name matched above)
        what = "a folder" if path.is_dir() else "a file"
        return f"error: {arg!r} is {what}, not a recipe: give a recipe name or a .yaml / .yml verl config"
    if "/" in name and not name.startswith("cpu/"):  # a path that is no file
        return f"error: no file {arg!r} (a recipe name, a path to a recipe or to your own verl YAML)"
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    close = [f"cpu/{name}"] if f"cpu/{name}" in names else close
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"error: no recipe {arg!r}{hint} (stare-verl recipes lists them)"


def _cmd_check(args: argparse.Namespace) -> int:
    import tempfile

    from omegaconf import OmegaConf

    from stare_verl.jobs.backend import stderr_to
    from stare_verl.jobs.recipes import override_problem

    bad = next(filter(None, map(override_problem, args.overrides)), None)
    if bad:  # an empty value composes (as the empty string): refused before it would pass the check
        print(f"error: {bad}", file=sys.stderr)
        return USAGE_ERROR
    tmp = tempfile.TemporaryDirectory()
    source = _recipe_source(args.recipe, tmp.name)
    if isinstance(source, str):
        tmp.cleanup()
        print(source, file=sys.stderr)
        return USAGE_ERROR
    name, folder = source
    noise = tempfile.TemporaryFile()  # verl's import-time warnings: shown only when the check fails
    try:
        with stderr_to(noise):
            from stare_verl.jobs.recipes import compose_recipe, validate_recipe

            cfg = compose_recipe(name, args.overrides, folder=folder)
            stare = validate_recipe(cfg)
    except Exception as err:  # report any composition/validation failure as a one-line error
        print(f"error: recipe {args.recipe!r} would fail at launch: {err}", file=sys.stderr)
        return USAGE_ERROR
    finally:
        noise.close()
        tmp.cleanup()
    if args.print:
        print(OmegaConf.to_yaml(cfg))
    summary = f"ok: {args.recipe}: adv_estimator={cfg.algorithm.adv_estimator}, "
    summary += f"trainer_mode={cfg.trainer.v1.trainer_mode}, rollout={cfg.actor_rollout_ref.rollout.name}"
    from stare_verl.methods.stare.config import StareConfig

    if isinstance(stare, StareConfig):
        summary += f", stare: variant={stare.variant} P={stare.top_p_ratio} W={stare.reweight_w} "
        summary += f"M={stare.reweight_m} target={stare.target_entropy} nats"
    elif stare is not None:  # another method's config (forking, entropy_adv, adaptive_entropy)
        summary += ", " + " ".join(f"{k}={v}" for k, v in stare.model_dump().items())
    if stare is not None:
        from stare_verl.methods import group_config_of

        norm = group_config_of(cfg.algorithm).norm_adv_by_std_in_grpo
        summary += ", baseline " + ("GRPO (std-normalised)" if norm else "Dr.GRPO (no std normalisation)")
    print(summary)
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    """``stare-verl plot``: the run's dashboard (:func:`stare_verl.jobs.dashboard.plot_path`); prints its path.
    A path that does not exist or holds no metrics: a one-line error, exit status 2."""
    from stare_verl.jobs.dashboard import NoMetricsError, plot_path

    try:
        dash = plot_path(args.path, args.out)
    except (FileNotFoundError, NoMetricsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(dash.path)
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    """``stare-verl methods``: the registered entropy-control methods, one line each; ``--markdown``: the README's
    table (:mod:`stare_verl.jobs.methods_table`); ``--write FILE``: that table rewritten inside FILE's markers.
    A file without the markers: a one-line error, exit status 2."""
    from stare_verl.jobs import methods_table

    if args.write:
        try:
            changed = methods_table.write_table(args.write)
        except (OSError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"{args.write}: {'table updated' if changed else 'table already current'}")
        return 0
    if args.markdown:
        print(methods_table.methods_markdown(), end="")
        return 0
    from stare_verl.methods import METHODS

    for name, cls in METHODS.items():
        print(f"{name}: {cls.summary}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``stare-verl`` argument parser."""
    parser = argparse.ArgumentParser(prog="stare-verl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("recipes", help="list the recipes under recipes/")
    p.set_defaults(func=_cmd_recipes)
    p = sub.add_parser(
        "check", help="compose a recipe with overrides and validate it as verl would at launch"
    )
    p.add_argument(
        "recipe",
        help="recipe name (e.g. shortcot_qwen2.5-math-7b_stare, cpu/tooluse_tiny_stare), a path to a recipe, or your "
        "own verl YAML (composed on verl's ppo_trainer defaults when it has no defaults list)",
    )
    p.add_argument("overrides", nargs="*", default=[], help="Hydra overrides, e.g. algorithm.stare.variant=C2")
    p.add_argument("--print", action="store_true", help="print the composed config")
    p.set_defaults(func=_cmd_check)
    p = sub.add_parser(
        "plot", help="draw a run's dashboard (entropy, reward, length, tool calls, Cov(log pi, A)) as dashboard.png"
    )
    p.add_argument(
        "path", metavar="RUN_DIR_OR_METRICS_FILE",
        help="a run folder (runs/<run>) or one verl file-logger JSONL (trainer.logger=[file]) or metrics.jsonl",
    )  # fmt: skip
    p.add_argument("--out", default=None, metavar="DIR", help="folder of dashboard.png (default: the run's plots/)")
    p.set_defaults(func=_cmd_plot)
    p = sub.add_parser("methods", help="list the entropy-control methods (--method NAME[:key=value,...])")
    p.add_argument("--markdown", action="store_true", help="print the README's methods table")
    p.add_argument("--write", metavar="FILE", default=None, help="rewrite the methods table inside FILE's markers")
    p.set_defaults(func=_cmd_methods)
    from stare_verl.jobs.evaluation import cli as eval_cli

    p = sub.add_parser(
        "eval", help="avg@k / pass@k against an OpenAI-compatible server or a local checkpoint"
    )
    eval_cli.add_arguments(p)
    p.set_defaults(func=eval_cli.run)
    # listed with their help line; never parsed here: main hands their arguments to their own module's parser
    # (stare-verl train --help shows train's options)
    for name, (module, line) in DELEGATED.items():
        p = sub.add_parser(name, help=line, add_help=False, description=f"see stare-verl {name} --help")
        p.set_defaults(func=lambda args, module=module: _delegate(module, []))
    return parser


def _delegate(module: str, argv: list[str]) -> int:
    """Run ``module``'s own ``main`` (a delegated subcommand) on ``argv``; returns its exit status."""
    import importlib

    return importlib.import_module(module).main(argv)


DELEGATED = {
    "train": ("stare_verl.jobs.train", "RL run: the CPU default, or verl + SGLang on a GPU node; --dry-run prints the plan (see train --help)"),
    "compare": ("stare_verl.jobs.compare", "STARE vs GRPO-ds on a CPU default task (--family), several seeds"),
    "sft": ("stare_verl.jobs.sft", "cold-start SFT for tool use: verl's SFT trainer on GPU, the tiny CPU SFT otherwise"),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stare-verl`` script; returns the exit status."""
    from stare_verl.jobs.procs import interrupt_on_termination

    interrupt_on_termination()  # Ctrl-C (even when inherited as ignored), kill, a closed terminal: one clean-up
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:  # train, compare, sft: their own parsers
        return _delegate(DELEGATED[argv[0]][0], argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
