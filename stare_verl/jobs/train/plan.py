"""``stare-verl train --dry-run``: what a run with these options would do on this machine, without CUDA, a model
download, a run folder or a process: the backend and why, the recipe, the run folder (not created), the key
settings, the composed config, the exact ``main_ppo`` command, the stall watch, whether the config validates as
verl would at launch and, for a multi-node GPU run, what to start on each node.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
from pathlib import Path

from stare_verl.jobs.backend import RunBackend, choose_backend, stderr_to
from stare_verl.jobs.pretrained import PretrainedRun
from stare_verl.jobs.runlog import RunFolder
from stare_verl.jobs.stall import DEFAULT_AFTER_DEATH_S, STALL_ENV, STALLED, no_step_timeout
from stare_verl.jobs.train.cpu import TinyLaunch, tiny_recipe_command, tiny_run_dir
from stare_verl.jobs.train.engine import (
    engine_mismatch,
    engine_overrides,
    model_problem,
    override_model_problem,
    tiny_option_problem,
    with_rollout,
)
from stare_verl.jobs.train.gpu import (
    gpu_command,
    gpu_model,
    gpu_model_problem,
    gpu_recipe_name,
    gpu_recipe_overrides,
    gpu_run,
)
from stare_verl.jobs.train.launch import method_overrides
from stare_verl.jobs.train.options import TrainOptions, bad_option
from stare_verl.models import ModelError, resolve_model


def no_gpu_recipe_here(probe) -> str:
    """Why this machine (``probe``: :class:`stare_verl.jobs.backend.GpuProbe`) cannot run the GPU recipe."""
    if not probe.gpu:
        return f"this machine has no GPU that this torch can use: {probe.problem or 'no NVIDIA GPU listed'}"
    return "SGLang is not installed (pip install -e '.[gpu]')"


def model_on_cpu_error(opts: TrainOptions) -> str:
    """The error line of ``MODEL=...`` on a run that takes the CPU (``--cpu``, or no usable GPU)."""
    return (
        f"error: MODEL={os.environ['MODEL']} is for GPU runs, and "
        + ("--cpu was given" if opts.cpu else "this machine has no GPU that this torch can use")
        + ". The CPU default trains its own tiny model: run without MODEL "
        f"(unset MODEL; make train-{opts.family}), or add --dry-run to see the GPU run's command."
    )


def dry_run(opts: TrainOptions, probe) -> int:
    """Say what a run of ``opts`` would do on this machine (``probe``: :class:`stare_verl.jobs.backend.GpuProbe`).

    The backend is the real run's choice (:func:`stare_verl.jobs.backend.choose_backend`), except that ``--gpu``,
    or ``MODEL=...`` on a machine without a usable GPU (an error for a real run), plans the GPU recipe as a GPU
    node with SGLang would run it. Prints the composed config (OmegaConf YAML, as ``stare-verl check --print``),
    then the plan (module docstring). Problems a real run here would stop at (a MODEL folder missing on this
    machine, a registered model not prepared or whose prepared weights are damaged, data files not built yet) are
    notes.

    Returns:
        0 when the config validates; 2 for a bad option (a ``--model`` folder, or on the tiny recipe an
        ``actor_rollout_ref.model.path`` override, whose weights cannot be loaded included) or a config that would
        fail at launch.
    """
    model = os.environ.get("MODEL")
    if opts.cpu and model:
        print(model_on_cpu_error(opts), file=sys.stderr)
        return 2
    bad = bad_option(opts)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    name = f"train-{opts.family}"
    backend = choose_backend(probe, force_cpu=opts.cpu)
    notes: list[str] = []
    if opts.rollout == "vllm":
        _, problem = with_rollout(opts, backend)
        if backend.path != "cpu":
            print(f"error: {problem}", file=sys.stderr)
            return 2
        if problem:
            notes.append(f"a real run here would stop: {problem}")
        backend = dataclasses.replace(backend, rollout="vllm")
    if backend.path == "cpu":
        why = "--cpu" if opts.cpu else no_gpu_recipe_here(probe)
    else:
        why = f"this machine has {probe.name}" + (" and SGLang" if probe.sglang else ", without SGLang")
    if (opts.gpu or model) and backend.path != "gpu-sglang":
        why = ("--gpu" if opts.gpu else f"MODEL={model}") + f" (a real run here: {no_gpu_recipe_here(probe)})"
        device = f"cuda ({probe.name})" if probe.gpu else "cuda (the GPU node's; none here)"
        backend = RunBackend("gpu-sglang", rollout="sglang", platform="cuda", device=device)
    print(f"[{name}] dry run: nothing is trained, downloaded, written or launched", flush=True)
    if backend.path == "gpu-sglang":
        model, no_model = gpu_model(opts)
        mapped, err = gpu_recipe_overrides(opts)
        recipe, no_recipe = gpu_recipe_name(opts)
        if no_model or err or no_recipe:
            print(f"error: {no_model or err or no_recipe}", file=sys.stderr)
            return 2
        problem = gpu_model_problem(opts, model) if model else None
        if problem:
            notes.append(f"a real run here would stop: {problem}")
        run = gpu_run(opts)
        cmd = gpu_command(opts, recipe, run, mapped, model)
        what, compose_name = "verl + SGLang, the GPU recipe", recipe
        sandbox = "probed at launch" if opts.job_family.tool_config else "none"
    else:
        problem = tiny_option_problem(opts, backend) or override_model_problem(opts.overrides)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        try:
            pretrained = PretrainedRun.of(opts.model, opts.job_family, opts.sft_cache, planned=True)
        except ValueError as err:  # an unknown --model, a family without a pretrained task
            print(f"error: {err}", file=sys.stderr)
            return 2
        cmd, run, recipe, what = _tiny_plan(opts, backend, model, pretrained, notes)
        compose_name = f"cpu/{recipe}"
        sandbox = "probed at launch" if opts.job_family.multi_turn else "none"
    backend = dataclasses.replace(backend, sandbox=sandbox)
    overrides = cmd[cmd.index(f"--config-name={recipe}") + 1 :]
    rc = _print_plan(name, compose_name, overrides, cmd, run, f"{backend.path} ({what})", backend, why, notes)
    if rc == 0 and backend.path == "gpu-sglang" and (opts.nnodes or 1) > 1:
        _print_cluster_plan(name, opts, cmd, compose_name, overrides)
    return rc


def one_line(err: BaseException) -> str:
    """An error's message as one line (a method's config error lists its keys one a line; Hydra's adds advice)."""
    return " ".join(str(err).split())


def _tiny_plan(opts: TrainOptions, backend: RunBackend, model: str | None, pretrained: PretrainedRun | None,
               notes: list[str]) -> tuple[list[str], RunFolder, str, str]:  # fmt: skip
    """``(command, run folder, recipe, what)`` of a tiny-recipe run (``backend``: ``cpu`` or ``gpu-hf``; from
    ``pretrained``, a user's ``MODEL`` or the tiny model's SFT checkpoint); what a real run here would stop at goes
    to ``notes``."""
    from stare_verl.jobs.demo.sft import config_hash

    tiny_model = model if backend.path == "gpu-hf" else None
    run = RunFolder(tiny_run_dir(opts, backend, tiny_model))
    fam = opts.job_family
    if pretrained is not None:
        fam = pretrained.family
        if not (opts.run_dir or os.environ.get("RUN_DIR")):
            run = RunFolder(run.path.with_name(f"{run.path.name}-{pretrained.model.name}"))
    recipe = f"{fam.cpu_recipe}_{opts.entropy_method.recipe}"
    if pretrained is not None:
        model_dir = pretrained.model.path
        if not (model_dir / "config.json").is_file():
            notes.append(f"a real run here would stop: {pretrained.model.name} is not prepared in {model_dir} "
                         "(make model)")  # fmt: skip
        elif pretrained.model.entry is not None:  # prepared, but its weights may be damaged (a user's folder: checked)
            try:
                resolve_model(pretrained.model.spec)
            except ModelError as err:
                notes.append(f"a real run here would stop: {err}")
        tiny_model = str(model_dir)
    elif tiny_model:
        model_dir = Path(tiny_model)
        problem = model_problem(tiny_model)
        if problem:
            notes.append(f"a real run here would stop: {problem}")
    else:
        sft_cfg = opts.sft_config
        model_dir = (sft_cfg.resolved_cache_dir() / f"sft-{config_hash(sft_cfg)}").resolve()
        if not model_dir.is_dir():
            notes.append(f"the cold-start SFT checkpoint {model_dir} is not cached yet: a real run trains it first")
    data = {"train": run.data / "train.parquet", "val": run.data / "val.parquet"}
    overrides = method_overrides(opts.entropy_method, engine_overrides(backend) + list(opts.overrides))
    job = TinyLaunch(opts, backend, run, recipe, overrides, f"train-{opts.family}")
    cmd = tiny_recipe_command(job, model_dir, data, tiny_model is not None)
    what = "verl on this CPU, the tiny recipe" if backend.path == "cpu" else "the tiny recipe on the GPU (no SGLang)"
    if pretrained is not None:
        what = f"verl on this CPU, the pretrained model {pretrained.model.name}"
    return cmd, run, recipe, what


def _print_cluster_plan(name: str, opts: TrainOptions, cmd: list[str], compose_name: str,
                        overrides: list[str]) -> None:  # fmt: skip
    """The dry run's multi-node part (``--nnodes N`` > 1 on the GPU recipe): what to start on the head and on each
    worker node, and the run as a Ray job or as ``stare-verl train`` on the head
    (:func:`stare_verl.jobs.cluster.cluster_plan`)."""
    from stare_verl.jobs.cluster import cluster_plan, driver_argv, sandbox_note

    with tempfile.TemporaryFile() as noise, stderr_to(noise):  # composed (and checked) by _print_plan already
        from stare_verl.jobs.recipes import compose_recipe

        n_gpus = int(compose_recipe(compose_name, overrides).trainer.n_gpus_per_node)
    note = sandbox_note(opts.job_family.tool_config is not None)
    plan = cluster_plan(cmd, driver_argv(opts, opts.kind_defaults()), opts.nnodes, n_gpus, dict(os.environ), note)
    print("\n".join(f"[{name}] {line}" for line in plan.lines(opts.nnodes)), flush=True)


def _stall_plan(backend: RunBackend) -> str:
    """The dry run's line on when a real run would be stopped for making no progress
    (:func:`~stare_verl.jobs.train.launch.run_main_ppo`)."""
    no_step = no_step_timeout()  # a bad value was refused by bad_option before the plan
    if math.isinf(no_step):
        return f"off ({STALL_ENV}=0)"
    line = f"exit {STALLED} after {no_step:.10g} s without an RL step ({STALL_ENV})"
    if no_step > DEFAULT_AFTER_DEATH_S:  # else the no-step limit always comes first
        line += f", or {DEFAULT_AFTER_DEATH_S:g} s without one after a Ray worker's death"
    return line


def _print_plan(name: str, compose_name: str, overrides: list[str], cmd: list[str], run: RunFolder, what: str,
                backend: RunBackend, why: str, notes: list[str]) -> int:  # fmt: skip
    """Compose ``compose_name`` with ``overrides`` (the command's Hydra arguments) and print the dry run's
    plan (see :func:`dry_run`); returns its exit status."""
    import shlex

    from omegaconf import OmegaConf

    try:
        with tempfile.TemporaryFile() as noise, stderr_to(noise):  # verl's import-time warnings: not the plan's
            from stare_verl.jobs.recipes import compose_recipe, config_problem, validate_recipe

            cfg = compose_recipe(compose_name, overrides)
    except Exception as err:  # noqa: BLE001 - a bad override: one line
        print(f"error: recipes/{compose_name}.yaml with these overrides does not compose: {one_line(err)}",
              file=sys.stderr)  # fmt: skip
        return 2
    mismatch = engine_mismatch(cfg.actor_rollout_ref.rollout.name, backend) or config_problem(cfg)
    if mismatch:  # an impossible value (data.max_response_length=0, ...): before the plan, as a bad option is
        print(f"error: {mismatch}", file=sys.stderr)
        return 2
    print(f"[{name}] composed config (recipes/{compose_name}.yaml with the overrides of the command below):")
    print(OmegaConf.to_yaml(cfg), end="")
    print(f"[{name}] backend: {what}: {backend.line()}")
    print(f"[{name}] chosen because: {why}")
    print(f"[{name}] recipe: {compose_name} (stare-verl check {compose_name} validates it alone)")
    print(f"[{name}] run folder (not created): {run.path}")
    t = cfg.trainer
    files = [str(f) for f in (list(cfg.data.val_files) if OmegaConf.is_list(cfg.data.val_files) else [cfg.data.val_files])]
    ranks = "GPU(s)" if backend.platform == "cuda" else "CPU rank(s)"
    print(f"[{name}] model {cfg.actor_rollout_ref.model.path}; {t.n_gpus_per_node} {ranks} per node x {t.nnodes} "
          f"node(s); logger {list(t.logger)}; " + (f"{t.total_training_steps} steps" if t.get("total_training_steps")
                                                    else f"{t.total_epochs} epochs"))  # fmt: skip
    print(f"[{name}] data: train {cfg.data.train_files}; val {', '.join(files)}")
    if backend.path == "gpu-sglang":  # the tiny recipe's run writes its own data
        notes += [f"no data file {f} here yet (make data-hf writes it)" for f in [str(cfg.data.train_files), *files]
                  if "://" not in f and not Path(f).is_file()]  # fmt: skip
    for note in notes:
        print(f"[{name}] note: {note}")
    print(f"[{name}] stall watch: {_stall_plan(backend)}")
    print(f"[{name}] command:")
    print(shlex.join(cmd), flush=True)
    try:
        with tempfile.TemporaryFile() as noise, stderr_to(noise):
            stare = validate_recipe(cfg)
    except Exception as err:  # noqa: BLE001 - the launch's own failure, reported as one line
        print(f"error: the composed config would fail at launch: {one_line(err)}", file=sys.stderr)
        return 2
    ok = f"[{name}] ok: validates as verl would at launch: adv_estimator={cfg.algorithm.adv_estimator}, "
    ok += f"trainer_mode={cfg.trainer.v1.trainer_mode}, rollout={cfg.actor_rollout_ref.rollout.name}"
    if stare is not None and hasattr(stare, "reweight_w"):
        ok += f", stare: variant={stare.variant} W={stare.reweight_w} M={stare.reweight_m}"
    print(ok, flush=True)
    return 0
