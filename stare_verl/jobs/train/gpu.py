"""The GPU recipe (verl + SGLang, ``recipes/<family's GPU recipe>_<method>.yaml``): the options it takes as Hydra
keys, the recipe's name, the run folder, the ``main_ppo`` command and the run itself (:func:`train_gpu`; the run
folder is laid out as a CPU run's, :func:`stare_verl.jobs.gpu_run.run_gpu_recipe`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

from stare_verl.jobs.backend import RunBackend, choose_backend, probe_gpu, sandbox_backend, stderr_to
from stare_verl.jobs.runlog import RunFolder
from stare_verl.jobs.train.engine import model_problem, placement_overrides, run_path
from stare_verl.jobs.train.launch import method_overrides
from stare_verl.jobs.train.options import SFT_OPTIONS, TrainOptions, bad_option
from stare_verl.recipe_files import recipes_dir

GPU_RECIPE_OPTIONS = {"steps": "trainer.total_training_steps", "seed": "data.seed", "save_freq": "trainer.save_freq"}
"""Options of ``stare-verl train`` that the GPU recipe takes, as the Hydra key each one sets (when given)."""
CPU_ONLY_OPTIONS = ("n_train", "n_eval", "eval_samples", "max_turns", "min_sft_accuracy", "warm_start_steps",
                    "sft_threads", "sft_steps", "sft_cache", *SFT_OPTIONS)  # fmt: skip
"""Options of the tiny-model CPU pipeline (its data, SFT and held-out evaluation) that a GPU recipe has no use for."""


def gpu_recipe_overrides(opts: TrainOptions) -> tuple[list[str], str | None]:
    """The Hydra overrides the options given to ``stare-verl train`` mean for a GPU recipe, or an error line for an
    option that only the CPU pipeline has (never silently dropped). Options left at their default are not passed,
    so the recipe's own values (steps, seed, save frequency) stand (the defaults of ``--model``'s kind: a pretrained
    model's 20 steps are not passed either)."""
    defaults = opts.kind_defaults()
    given = [o for o in CPU_ONLY_OPTIONS if getattr(opts, o) != getattr(defaults, o)]
    if given:
        flags = ", ".join("--" + o.replace("_", "-") for o in given)
        return [], (
            f"{flags} only apply to the CPU tiny-model pipeline (its data, cold-start SFT and held-out evaluation); "
            "the GPU recipe takes Hydra overrides instead (e.g. data.train_batch_size=..., or --cpu for the CPU run)"
        )
    out = [f"{key}={getattr(opts, o)}" for o, key in GPU_RECIPE_OPTIONS.items() if getattr(opts, o) != getattr(defaults, o)]
    return out + placement_overrides(opts), None


def gpu_model(opts: TrainOptions) -> tuple[str | None, str | None]:
    """``(model, None)``: what a GPU-recipe run loads as ``actor_rollout_ref.model.path``: ``--model`` (a
    registered pretrained model's prepared folder, else the folder or Hugging Face hub id as given), else ``MODEL``;
    None: the recipe's own model. ``(None, error line)``: ``--model tiny`` (the CPU pipeline's from-scratch model),
    or ``--model`` and ``MODEL`` naming different models. Whether the model is there is :func:`gpu_model_problem`'s."""
    from stare_verl.models import MODELS, lookup
    from stare_verl.models.registry import prepared_dir

    env = os.environ.get("MODEL") or None
    if opts.model is None:
        return env, None
    entry = lookup(opts.model)
    if entry is not None and entry.kind == "tiny":
        real = ", ".join(n for n, e in MODELS.items() if e.kind != "tiny")
        return None, (f"--model {opts.model} is the CPU pipeline's from-scratch model; the GPU recipe (--gpu) takes a "
                      f"registered pretrained model ({real}), a model folder or a Hugging Face hub id")  # fmt: skip
    model = str(prepared_dir(entry).resolve()) if entry is not None else opts.model
    if env and env not in (opts.model, model):
        return None, f"--model {opts.model} and MODEL={env} name different models: give one of them"
    return model, None


def gpu_model_problem(opts: TrainOptions, model: str) -> str | None:
    """Why the GPU recipe's ``model`` (:func:`gpu_model`) cannot be loaded here, or None: a registered model not
    prepared yet or whose prepared weights are damaged (the command that prepares it), a folder without
    ``config.json``, whose weights do not load, or that does not exist (a hub id is downloaded by the run)."""
    from stare_verl.models import ModelError, lookup, resolve_model

    if opts.model is not None and lookup(opts.model) is not None:
        try:
            resolve_model(opts.model)
        except ModelError as err:
            return str(err)
        return None
    return model_problem(model, offline=False, what=f"--model {opts.model}" if opts.model else None)


def gpu_recipe_name(opts: TrainOptions) -> tuple[str | None, str | None]:
    """``(recipe, None)``: the GPU recipe a run of ``opts`` launches (``<base>_<method's recipe>``, the base from
    ``--gpu-recipe`` or the family's), or ``(None, error line)`` when the family has none or the recipe is not
    shipped (the names that are, listed)."""
    from stare_verl.jobs.recipes import recipe_names

    base = opts.gpu_recipe or opts.job_family.gpu_recipe
    if base is None:
        return None, f"family {opts.family} has no GPU recipe; run it on the CPU (--cpu)"
    recipe = f"{base.removesuffix('.yaml')}_{opts.entropy_method.recipe}"
    if recipe not in recipe_names():
        shipped = sorted({n.rsplit("_", 1)[0] for n in recipe_names() if n.startswith(f"{opts.family}_")})
        return None, f"no GPU recipe {recipe} under {recipes_dir()}; --gpu-recipe for {opts.family}: {', '.join(shipped)}"
    return recipe, None


def gpu_run(opts: TrainOptions) -> RunFolder:
    """The run folder of a GPU-recipe run: ``--run-dir``, ``$RUN_DIR`` or ``runs/<family>-<method>-seed<seed>-sglang``
    (absolute); nothing is created."""
    return RunFolder(run_path(opts, "-sglang"))


def gpu_command(opts: TrainOptions, recipe: str, run: RunFolder, mapped: list[str], model: str | None) -> list[str]:
    """The ``main_ppo`` command of GPU recipe ``recipe``: checkpoints into ``run``, ``model`` (when set: :func:`gpu_model`) as
    ``actor_rollout_ref.model.path``, the options' Hydra keys ``mapped`` (:func:`gpu_recipe_overrides`), then the
    user's overrides with the method's (:func:`~stare_verl.jobs.train.launch.method_overrides`, which prints the
    GRPO-ds twin's note); verl's ``file`` logger and Hydra's run directory for the run folder
    (:func:`stare_verl.jobs.gpu_run.with_run_overrides`)."""
    from stare_verl.jobs.gpu_run import with_run_overrides

    cmd = [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={recipes_dir()}", f"--config-name={recipe}",
        f"trainer.default_local_dir={run.path / 'checkpoints'}",
        *([f"actor_rollout_ref.model.path={model}"] if model else []),
        *mapped, *method_overrides(opts.entropy_method, opts.overrides),
    ]  # fmt: skip
    return with_run_overrides(cmd, run, opts.logger)


def gpu_config_problem(recipe: str, overrides: list[str]) -> str | None:
    """Why GPU recipe ``recipe`` with the command's Hydra ``overrides`` cannot launch, as one line, or None: an
    override that does not compose (a key the recipe does not have names the nearest one), or a value out of range
    (:func:`stare_verl.jobs.recipes.config_problem`: ``data.max_response_length=0``, ``...optim.lr=abc``). Checked
    before the run folder is made; verl's own launch checks stay ``main_ppo``'s (``--dry-run`` runs them here)."""
    from stare_verl.jobs.recipes import compose_recipe, config_problem

    try:
        cfg = compose_recipe(recipe, overrides)
    except Exception as err:  # noqa: BLE001 - a bad override, as one line
        return f"recipes/{recipe}.yaml with these overrides does not compose: {' '.join(str(err).split())}"
    return config_problem(cfg)


def train_gpu(opts: TrainOptions, backend: RunBackend | None = None) -> int:
    """Launch ``main_ppo`` with the family's GPU recipe (``--model`` or the ``MODEL`` env var, :func:`gpu_model`, and
    the overrides pass through).

    The run folder (``--run-dir``, ``RUN_DIR`` or ``runs/<family>-<method>-seed<seed>-sglang``) is laid out as a CPU
    run's (:func:`stare_verl.jobs.gpu_run.run_gpu_recipe`): the checkpoints (``trainer.default_local_dir``),
    ``train.log`` (first line: rollout backend, platform, device, sandbox; then main_ppo's output), ``logs/`` (verl's
    file-logger parts, Hydra's config), ``metrics.jsonl``, ``plots/`` with the dashboard and ``summary.json``
    (backend, recipe, command, exit status, entropy report); the stall watch and the resume message are the CPU
    path's, the loggers ``--logger`` (or verl's console + wandb) plus ``file``. With ``RAY_ADDRESS`` set the run
    joins that Ray cluster (``--nnodes N`` nodes; ``--dry-run`` prints what to start on each node). An override
    that cannot launch (:func:`gpu_config_problem`) is an error before anything is written.
    ``backend``: the caller's choice (default: probed here).
    """
    from stare_verl.jobs.gpu_run import recipe_total_steps, run_gpu_recipe

    model, bad = gpu_model(opts)
    bad = bad or bad_option(opts) or (gpu_model_problem(opts, model) if model else None)
    mapped, err = gpu_recipe_overrides(opts)
    recipe, no_recipe = gpu_recipe_name(opts)
    if bad or err or no_recipe:
        print(f"error: {bad or err or no_recipe}", file=sys.stderr)
        return 2
    fam = opts.job_family
    run = gpu_run(opts)
    cmd = gpu_command(opts, recipe, run, mapped, model)
    overrides = cmd[cmd.index(f"--config-name={recipe}") + 1 :]
    with tempfile.TemporaryFile() as noise, stderr_to(noise):  # verl's import-time warnings: not the console's
        problem = gpu_config_problem(recipe, overrides)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    backend = dataclasses.replace(
        backend or choose_backend(probe_gpu()),
        sandbox=sandbox_backend(recipes_dir() / fam.tool_config) if fam.tool_config else "none",
    )  # fmt: skip
    name = f"train-{opts.family}"
    print(f"[{name}] GPU recipe {recipe}: {backend.line()}; run folder {run.path}", flush=True)
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    with tempfile.TemporaryFile() as noise, stderr_to(noise):  # verl's import-time warnings: not the console's
        steps, save_freq = recipe_total_steps(recipe, overrides)
    summary = {"family": opts.family, "method": opts.method, "seed": opts.seed, "recipe": recipe,
               "backend": backend.to_dict(), "model": model, "command": cmd, "backend_line": backend.line()}  # fmt: skip
    return run_gpu_recipe(name, run, cmd, summary, steps, save_freq)
