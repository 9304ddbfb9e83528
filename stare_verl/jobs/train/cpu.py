"""The tiny-recipe run (``recipes/cpu/<family>_tiny_<method>.yaml``, or a pretrained model's ``_real_`` recipe):
the CPU default, and the GPU path without SGLang (``gpu-hf``).

:func:`train_cpu` checks the options and the recipe with them, then readies the model RL starts from (the tiny
model's cached cold-start SFT checkpoint, a pretrained model with its warm start, or a user's ``MODEL``) and its
held-out evaluation before RL; :func:`train_tiny_recipe` writes the RL data, runs ``main_ppo``
(:func:`~stare_verl.jobs.train.launch.run_main_ppo`), evaluates after RL and writes the run folder's
``metrics.jsonl``, plots and ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from stare_verl.jobs.backend import RunBackend, choose_backend, probe_gpu, sandbox_backend, stderr_to
from stare_verl.jobs.failure import failure_report
from stare_verl.jobs.pretrained import PretrainedRun
from stare_verl.jobs.procs import RUN_TAG_ENV
from stare_verl.jobs.runlog import RunFolder, entropy_report, format_entropy_report
from stare_verl.jobs.stall import STALLED
from stare_verl.jobs.train import launch
from stare_verl.jobs.train.engine import (
    engine_mismatch,
    engine_overrides,
    model_problem,
    override_model_problem,
    placement_overrides,
    rollout_engine,
    run_path,
    tiny_option_problem,
)
from stare_verl.jobs.train.heldout import (
    cached_eval_before,
    evaluate_heldout,
    evaluate_sft_cached,
    format_eval,
    heldout_entropy_curve,
)
from stare_verl.jobs.train.launch import INTERRUPTED, method_overrides, resume_clause, run_env, timed
from stare_verl.jobs.train.options import WARM_START_STEPS, TrainOptions, bad_option, settings_differ
from stare_verl.recipe_files import recipes_dir

HELDOUT_POINTS = 6
"""Checkpoints a run of the tiny CPU model saves by default (``--save-freq 0``; not a ``MODEL=`` run, which saves
at the end), the points of its held-out entropy curve."""
HELDOUT_MIN_SPACING = 5
"""Fewest steps between two saved checkpoints by default: a run of a few steps (the tests') saves at its end only."""


@dataclass(frozen=True)
class TinyLaunch:
    """A tiny-recipe run as :func:`train_cpu` readied it: the options, where it runs, its run folder,
    ``recipes/cpu/<recipe>.yaml``, the launch overrides (the engine's keys, the user's, the method's:
    :func:`~stare_verl.jobs.train.launch.method_overrides`) and the console tag (``train-<family>``)."""

    opts: TrainOptions
    backend: RunBackend
    run: RunFolder
    recipe: str
    overrides: list[str]
    name: str


def tiny_run_dir(opts: TrainOptions, backend: RunBackend, model: str | None) -> Path:
    """The run folder of a tiny-recipe run (absolute): ``--run-dir``, ``$RUN_DIR`` or
    ``runs/<family>-<method>-seed<seed>``, with ``-gpu`` (and ``-<MODEL's name>``) appended off the CPU: a GPU run
    (and each MODEL) gets a folder of its own, never resumed from, or answered by, the CPU run's."""
    where = "" if backend.path == "cpu" else "-gpu" + (f"-{Path(model).name}" if model else "")
    if backend.rollout == "vllm":
        where += "-vllm"  # another engine: a folder of its own, never resumed from the hf run's checkpoints
    return run_path(opts, where)


def tiny_save_freq(opts: TrainOptions, from_model: bool) -> int:
    """``trainer.save_freq`` of a tiny-recipe run: ``--save-freq`` when given, else the end for a user's ``MODEL``
    (``from_model``) and :func:`heldout_save_freq` for the tiny model."""
    return opts.save_freq or (opts.steps if from_model else heldout_save_freq(opts.steps))


def is_pretrained_recipe(recipe: str) -> bool:
    """Whether ``recipes/cpu/<recipe>.yaml`` is a pretrained model's (``<family>_real_<method>``): its prompt length
    is the recipe's (not the 1024 of a user's ``MODEL`` on the tiny recipe) and it saves as the tiny runs do."""
    return recipe.rsplit("_", 1)[0].endswith("_real")


def heldout_save_freq(steps: int) -> int:
    """``trainer.save_freq`` of a tiny CPU run without ``--save-freq``: ``ceil(steps / HELDOUT_POINTS)``, at least
    :data:`HELDOUT_MIN_SPACING`, so the held-out entropy is read at up to :data:`HELDOUT_POINTS` checkpoints (and the
    last step, which verl always saves) whatever the budget; ~0.1 s and 7 MB per checkpoint of the 0.46 M-parameter
    model, ~3 s per reading."""
    return max(HELDOUT_MIN_SPACING, -(-steps // HELDOUT_POINTS))


def tiny_recipe_command(job: TinyLaunch, model_dir: Path, data: dict[str, Path], from_model: bool) -> list[str]:
    """The ``main_ppo`` command of ``recipes/cpu/<recipe>.yaml``: RL from ``model_dir`` on ``data`` (``train`` /
    ``val`` parquet files) into the run folder, with the options as Hydra keys and the launch overrides last.
    ``from_model``: ``model_dir`` is the user's ``MODEL`` (a real model's chat template makes longer prompts than
    the tiny tokenizer's)."""
    opts, run, recipe = job.opts, job.run, job.recipe
    user_model = from_model and not is_pretrained_recipe(recipe)
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['val']}",
        f"trainer.default_local_dir={run.checkpoints}",
        f"trainer.total_training_steps={opts.steps}",
        f"trainer.save_freq={tiny_save_freq(opts, user_model)}",
        *([f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={opts.max_turns}"]
          if opts.job_family.multi_turn else []),  # fmt: skip
        f"data.seed={opts.seed}",
        f"actor_rollout_ref.actor.data_loader_seed={opts.seed}",
        f"actor_rollout_ref.rollout.seed={opts.seed}",
        f"trainer.experiment_name={run.path.name}",
        f"hydra.run.dir={run.logs / 'hydra'}",
        *(["trainer.device=cuda"] if job.backend.platform != "cpu" else []),
        *(["data.max_prompt_length=1024"] if user_model else []),
        *placement_overrides(opts, keep_file_logger=True),
        *job.overrides,
    ]
    return [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={recipes_dir() / 'cpu'}", f"--config-name={recipe}", *overrides,
    ]  # fmt: skip


def _checked_recipe(recipe: str, overrides: list[str], backend: RunBackend) -> tuple[RunBackend, str | None]:
    """Compose ``recipes/cpu/<recipe>.yaml`` with the launch ``overrides`` and validate it as verl would at launch
    (a bad override fails now, not after the SFT and the held-out evaluation); returns ``backend`` with the tool
    config's sandbox backend, and an error line or None."""
    from stare_verl.jobs.recipes import compose_recipe, config_problem, validate_recipe

    placeholders = ["actor_rollout_ref.model.path=x", "data.train_files=x", "data.val_files=x",
                    "trainer.default_local_dir=x"]  # fmt: skip
    try:
        cfg = compose_recipe(f"cpu/{recipe}", placeholders + overrides)
        mismatch = engine_mismatch(cfg.actor_rollout_ref.rollout.name, backend) or config_problem(cfg)
        if mismatch:  # an impossible value: named alone, as a bad option is
            return backend, mismatch
        validate_recipe(cfg)
        tool_config = cfg.actor_rollout_ref.rollout.multi_turn.get("tool_config_path")
        return dataclasses.replace(backend, sandbox=sandbox_backend(tool_config)), None
    except Exception as err:  # noqa: BLE001 - the launch's own failure, as one line
        why = " ".join(str(err).split())  # one line (a method's config error lists its keys one a line)
        return backend, f"recipes/cpu/{recipe}.yaml with your overrides would fail at launch: {why}"


def tiny_recipe_problem(opts: TrainOptions, backend: RunBackend) -> str | None:
    """Why the tiny-model run of ``opts`` (``backend``: ``cpu`` or ``gpu-hf``) would stop at its recipe check, as
    one line, or None: the check :func:`train_cpu` makes before the cold-start SFT (the family's tiny recipe for
    the method, composed with the launch overrides and validated as verl would at launch; an impossible value of
    an override: :func:`stare_verl.jobs.recipes.config_problem`), for a caller that checks runs up front
    (``compare``). Prints nothing (the GRPO-ds twin's note is the run's)."""
    recipe = f"{opts.job_family.cpu_recipe}_{opts.entropy_method.recipe}"
    overrides, _ = opts.entropy_method.compose_overrides(engine_overrides(backend) + list(opts.overrides))
    return _checked_recipe(recipe, overrides, backend)[1]


def train_cpu(opts: TrainOptions, backend: RunBackend | None = None) -> int:
    """The tiny-recipe run of ``opts`` (see the module docstring); returns the exit status.

    ``backend`` (default: the CPU default) says where it runs: ``gpu-hf`` runs the same recipe on verl's CUDA
    platform (FSDP actor and the ``hf`` rollout on the GPU), from ``MODEL`` when set (no cold-start SFT and no
    held-out evaluation then: they are the tiny model's) or else from the tiny model's SFT checkpoint.
    A stop before RL (``KeyboardInterrupt``: the SFT, the evaluation) reaches the caller.
    """
    from stare_verl.jobs.demo.sft import ensure_sft_checkpoint, read_report

    backend = backend or choose_backend(probe_gpu(), force_cpu=True)
    model = os.environ.get("MODEL") if backend.path == "gpu-hf" else None
    fam, name = opts.job_family, f"train-{opts.family}"
    try:
        pretrained = PretrainedRun.of(opts.model, opts.job_family, opts.sft_cache)
    except ValueError as err:  # an unknown --model, a model not prepared, a family without a pretrained task
        print(f"error: {err}", file=sys.stderr)
        return 2
    if pretrained is not None:
        if model:
            print(f"error: MODEL={model} and --model {opts.model} name two models: give one", file=sys.stderr)
            return 2
        fam = pretrained.family
    run_dir = tiny_run_dir(opts, backend, model)
    if pretrained is not None and not (opts.run_dir or os.environ.get("RUN_DIR")):
        run_dir = run_dir.with_name(f"{run_dir.name}-{pretrained.model.name}")
    bad = (bad_option(opts) or tiny_option_problem(opts, backend) or (model_problem(model) if model else None)
           or override_model_problem(opts.overrides))
    if backend.rollout == "vllm" and not bad:
        bad = _vllm_shape_problem(opts, pretrained)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    # the launch overrides (the engine's keys first, the user's last, the twin's pins added, its note printed) once,
    # for the check and the launch below
    overrides = method_overrides(opts.entropy_method, engine_overrides(backend) + list(opts.overrides))
    t0 = time.time()
    what = "CPU default" if backend.path == "cpu" else f"GPU ({backend.path}: no SGLang installed)"
    print(f"[{name}] {what}, method={opts.method}, seed={opts.seed}, run folder {run_dir}", flush=True)
    recipe = f"{fam.cpu_recipe}_{opts.entropy_method.recipe}"
    # verl's import-time warnings (optional engines, the accelerator probe) go to train.log, not the console
    noise = tempfile.TemporaryFile()
    with stderr_to(noise):
        backend, problem = _checked_recipe(recipe, overrides, backend)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"[{name}] {backend.line()}; rollout engine {rollout_engine(backend)}", flush=True)
    run = RunFolder(run_dir)
    done = run.latest_step()
    if done is not None and done >= opts.steps and run.is_finished():  # nothing is written into a finished run
        noise.close()
        differ = settings_differ(run.read_summary().get("settings"), opts.run_settings())
        if differ:  # never "nothing to train" for a command whose run this is not
            print(f"error: {run_dir} holds a finished run of other settings ({'; '.join(differ)}); use another "
                  "--run-dir, or delete that folder to run it again", file=sys.stderr)  # fmt: skip
            return 2
        print(f"[{name}] {run_dir} already holds step {done} >= --steps {opts.steps}: nothing to train (raise "
              "--steps to continue it)", flush=True)  # fmt: skip
        return 0
    run.logs.mkdir(parents=True, exist_ok=True)
    with open(run.train_log, "ab") as log:  # the run's own lines first, then what verl printed
        log.write(f"[{name}] {time.strftime('%Y-%m-%d %H:%M:%S')} {backend.line()}\n".encode())
        noise.seek(0)
        shutil.copyfileobj(noise, log)
    noise.close()
    job = TinyLaunch(opts, backend, run, recipe, overrides, name)
    phases: dict[str, float] = {}  # wall seconds per phase of the run (bench/main_job.py prints them)
    if pretrained is not None:
        pretrained, start_dir, before = _pretrained_start(job, pretrained, phases)
        return train_tiny_recipe(job, start_dir, t0, before, phases, pretrained=pretrained)
    if model:
        print(f"[{name}] MODEL={model}: RL from it (no cold-start SFT, no held-out evaluation)", flush=True)
        return train_tiny_recipe(job, Path(model), t0, None)
    sft_cfg = opts.sft_config
    with timed(phases, "sft"):
        sft_dir = ensure_sft_checkpoint(sft_cfg)
    sft_acc = read_report(sft_dir)["heldout"]["T=0.0"]["accuracy"]
    min_acc = fam.min_sft_accuracy if opts.min_sft_accuracy is None else opts.min_sft_accuracy
    if sft_acc < min_acc:
        print(
            f"error: the cold-start SFT checkpoint {sft_dir} has held-out greedy accuracy {sft_acc:.3f} < "
            f"{min_acc} (--min-sft-accuracy); RL from it would have little to learn from. "
            f"Train longer (--sft-steps {max(1500, sft_cfg.steps + 500)}, a checkpoint of its own; when the copy "
            "plateau ends depends on the seed and the machine), try another --sft-seed, or lower the threshold.",
            file=sys.stderr,
        )
        return 1
    # what the evaluation before RL depends on: a cached one of other settings (another --eval-samples, --n-eval,
    # --max-turns or SFT checkpoint: a resumed run given other options) is evaluated again, never reused
    key = {"sft_checkpoint": str(Path(sft_dir).resolve()), "n_eval": opts.n_eval, "eval_samples": opts.eval_samples,
           "eval_turns": fam.eval_turns(opts.max_turns), "temperatures": [0, 1]}  # fmt: skip
    with timed(phases, "eval_before"):
        before = cached_eval_before(run.eval_before, key, lambda: evaluate_sft_cached(
            sft_dir, sft_cfg, opts.n_eval, opts.max_turns, opts.eval_samples))  # fmt: skip
    print(f"[{name}] held-out before RL: {format_eval(before)}", flush=True)
    return train_tiny_recipe(job, sft_dir, t0, before, phases)


def _vllm_shape_problem(opts: TrainOptions, pretrained: PretrainedRun | None) -> str | None:
    """Why verl's vLLM rollout on the CPU cannot run the model's attention shape, or None."""
    from stare_verl.cpu.vllm_engine import VllmSetupError, check_head_dim

    if pretrained is not None:
        from transformers import AutoConfig

        shape = AutoConfig.from_pretrained(pretrained.model.path, local_files_only=True)
    else:
        shape = opts.sft_config.model
    try:
        check_head_dim(shape.hidden_size, shape.num_attention_heads)
    except VllmSetupError as err:
        return str(err)
    return None


def _pretrained_start(job: TinyLaunch, pretrained: PretrainedRun, phases: dict[str, float]
                      ) -> tuple[PretrainedRun, Path, dict]:  # fmt: skip
    """A pretrained model's start: its warm start when its family's task asks for one, then its held-out evaluation
    before RL (cached in the run folder under the model's identity); returns the run (with the warm start's split
    left out of RL's problems), the model folder RL starts from and the evaluation."""
    from stare_verl.models.registry import model_identity

    opts, name = job.opts, job.name
    start_dir = pretrained.model.path
    where = f"[{name}] --model {pretrained.model.name} ({pretrained.model.path}):"
    if pretrained.needs_warm_start:
        steps = opts.warm_start_steps if opts.warm_start_steps is not None else WARM_START_STEPS
        print(f"{where} a warm start of {steps} steps on the family's demonstrations, then RL on its pretrained task",
              flush=True)  # fmt: skip
        with timed(phases, "warm_start"):
            pretrained, start_dir = pretrained.warm_start(steps, num_threads=opts.sft_threads or None)
    else:
        print(f"{where} RL on the family's pretrained task, no cold-start SFT", flush=True)
    with timed(phases, "eval_before"):
        key = {"model": model_identity(start_dir), "task": pretrained.family.cpu_recipe,
               "n_eval": opts.n_eval, "eval_samples": opts.eval_samples, "temperatures": [0, 1]}  # fmt: skip
        before = cached_eval_before(job.run.eval_before, key,
                                    lambda: pretrained.evaluate(start_dir, opts.n_eval, opts.eval_samples))  # fmt: skip
    print(f"[{name}] held-out before RL: {format_eval(before)}", flush=True)
    return pretrained, start_dir, before


def train_tiny_recipe(job: TinyLaunch, model_dir: Path, t0: float, before: dict | None,
                      phases: dict[str, float] | None = None, pretrained: PretrainedRun | None = None) -> int:  # fmt: skip
    """RL of ``job`` from ``model_dir``, then the held-out evaluation (when ``before`` is given), plots and
    ``summary.json`` (``phases_s``: wall seconds of the phases before RL given in ``phases``, then ``rl`` (verl's
    main_ppo, start-up included) and ``eval_after``); ``t0``: the run's start (``time.time()``); returns the exit
    status.

    ``pretrained``: ``model_dir`` is a pretrained model run with its family's pretrained task (its own data and
    held-out problems, no cold-start SFT)."""
    from stare_verl.jobs.dashboard import method_settings, run_title
    from stare_verl.jobs.demo.sft import write_rl_data
    from stare_verl.jobs.runlog import plot_run, read_verl_jsonl, write_metrics_jsonl

    opts, backend, run, name = job.opts, job.backend, job.run, job.name
    sft_cfg = opts.sft_config
    family = pretrained.family.name if pretrained else opts.family
    from_model = before is None or pretrained is not None
    if pretrained:
        data = pretrained.write_data(run.data, n_train=opts.n_train, n_val=opts.n_eval)
    else:
        data = write_rl_data(sft_cfg, run.data, n_train=opts.n_train, n_val=opts.n_eval)
    cmd = tiny_recipe_command(job, model_dir, data, from_model=from_model)
    part = run.new_verl_metric_part()
    env = run_env(f"{os.environ.get(RUN_TAG_ENV, 'run')}-{uuid.uuid4().hex}", part, backend.platform)
    if backend.rollout == "vllm":
        from stare_verl.cpu.vllm_engine import engine_env

        env.update(engine_env(pretrained.cache_dir if pretrained else sft_cfg.resolved_cache_dir(), environ=env))
    resume_step = run.latest_step()  # verl resumes from it (trainer.resume_mode auto)
    if resume_step is not None:
        print(f"[{name}] resuming from the checkpoint of step {resume_step} in {run.checkpoints}", flush=True)
    print(f"[{name}] verl main_ppo ({opts.steps} steps); log: {run.train_log}", flush=True)
    phases = dict(phases or {})
    with timed(phases, "rl"):
        rc = launch.run_main_ppo(cmd, env, run.train_log, part, opts.steps)

    rows = read_verl_jsonl(run.verl_metric_parts())
    write_metrics_jsonl(rows, run.metrics)
    known = {"family": family, "method": opts.method, "seed": opts.seed, "eval_before": before}
    settings = method_settings(run, known)  # the run's Hydra config, read once for every plot
    if rc != 0:  # what the run got to, before the error below
        plot_run(rows, run.plots, title=run_title(rows, known, settings))
        launch.draw_dashboard(rows, run, known, settings)
    if rc in (INTERRUPTED, STALLED):
        every = tiny_save_freq(opts, from_model and not pretrained)
        what = ("interrupted: main_ppo and its Ray processes were stopped." if rc == INTERRUPTED else
                f"stopped: no progress (the reason is above; {run.train_log} has main_ppo's output).")  # fmt: skip
        print(f"[{name}] {what} {resume_clause(run, every)}", file=sys.stderr)
        return rc
    if rc != 0:
        report, resumable = failure_report(rc, run.train_log)
        print(report, file=sys.stderr)
        if resumable:
            print(f"[{name}] {resume_clause(run, tiny_save_freq(opts, from_model and not pretrained))}",
                  file=sys.stderr)  # fmt: skip
        return rc if rc > 0 else 1

    ckpt = run.latest_checkpoint()
    heldout = None
    with timed(phases, "eval_after"):
        if ckpt and pretrained is not None:
            after = pretrained.evaluate(ckpt, opts.n_eval, opts.eval_samples)
        elif ckpt and before is not None:
            after = evaluate_heldout(ckpt, sft_cfg, opts.n_eval, opts.max_turns, opts.eval_samples)
        else:
            after = {}
        run.eval_after.write_text(json.dumps(after, indent=1))
        if ckpt and before is not None and pretrained is None:  # every saved checkpoint: the curve of the entropy plots
            heldout = heldout_entropy_curve(model_dir, run.hf_checkpoints(), opts.n_eval, name)
    summary = {
        "family": family,
        "method": opts.method,
        "seed": opts.seed,
        "settings": opts.run_settings(),
        "steps": rows[-1]["step"] if rows else 0,
        "backend": backend.to_dict(),
        "rollout_engine": rollout_engine(backend),
        "sft_checkpoint": None if pretrained else str(model_dir),
        **({"model": pretrained.describe()} if pretrained else {}),
        "rl_checkpoint": str(ckpt) if ckpt else None,
        "eval_before": before,
        "eval_after": after,
        "entropy_report": entropy_report(rows, before, after, heldout=heldout),
        "wall_s": round(time.time() - t0, 1),
        "phases_s": phases,
    }
    plots = plot_run(rows, run.plots, title=run_title(rows, known, settings),
                     heldout=summary["entropy_report"]["heldout_entropy"])  # fmt: skip
    summary["plots"] = [str(p) for p in plots + launch.draw_dashboard(rows, run, summary, settings)]
    run.write_summary(summary)
    if before is not None:
        print(f"[{name}] held-out after RL:  {format_eval(after) if after else 'no checkpoint'}", flush=True)
    print("\n".join(f"[{name}] {line}" for line in format_entropy_report(summary["entropy_report"])), flush=True)
    print(f"[{name}] done in {summary['wall_s']:.0f} s: {run.path}/metrics.jsonl, plots/, summary.json", flush=True)
    return 0
