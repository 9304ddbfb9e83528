"""A GPU recipe's run (verl + SGLang) with the CPU path's run folder: ``metrics.jsonl`` from verl's file logger, the
plots and the dashboard, ``summary.json`` with the entropy report, the stall watch, the resume message, one progress
line per step on the console and main_ppo's output in ``train.log``.

``stare_verl.jobs.train.gpu.train_gpu`` checks the options and builds the command; :func:`run_gpu_recipe` runs it.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any

from stare_verl.jobs.failure import failure_report
from stare_verl.jobs.procs import RUN_TAG_ENV
from stare_verl.jobs.runlog import RunFolder

DEFAULT_LOGGERS = ("console", "wandb")
"""verl's ``trainer.logger`` default (``ppo_trainer.yaml``), which the GPU recipes keep."""


def logger_override(loggers: list[str] | tuple[str, ...] | None) -> str:
    """The ``trainer.logger`` override of a GPU run: ``loggers`` (``--logger``; verl's default
    :data:`DEFAULT_LOGGERS` when not given) with verl's ``file`` logger added when missing (the run folder's
    ``metrics.jsonl`` and the progress line are read from it); the others (console, wandb) stay as asked."""
    out = list(loggers or DEFAULT_LOGGERS)
    if "file" not in out:
        out.append("file")
    return f"trainer.logger=[{','.join(out)}]"


def with_run_overrides(cmd: list[str], run: RunFolder, loggers: list[str] | None) -> list[str]:
    """``cmd`` (the GPU recipe's ``main_ppo`` command) with what the run folder needs, before the user's overrides
    (so theirs win): verl's ``file`` logger (:func:`logger_override`) unless the command sets ``trainer.logger``
    itself (then it is replaced by the same list plus ``file``), and Hydra's run directory under ``logs/hydra``
    (the dashboard reads the method's settings from its ``config.yaml``)."""
    own = [a for a in cmd if a.startswith(("trainer.logger=", "+trainer.logger=", "++trainer.logger="))]
    if own:
        names = own[-1].split("=", 1)[1].strip("[]")
        loggers = [n.strip().strip("'\"") for n in names.split(",") if n.strip()]
    base = [a for a in cmd if a not in own]
    i = next((k for k, a in enumerate(base) if a.startswith("--config-name=")), len(base) - 1) + 1
    extra = [logger_override(loggers), f"hydra.run.dir={run.logs / 'hydra'}"]
    return base[:i] + extra + base[i:]


def run_gpu_recipe(name: str, run: RunFolder, cmd: list[str], summary: dict[str, Any], total_steps: int | None,
                   save_freq: Any = None) -> int:  # fmt: skip
    """Run ``cmd`` (from :func:`with_run_overrides`) into ``run`` as the CPU path does
    (:func:`stare_verl.jobs.train.launch.run_main_ppo`: the log, the progress line, the stall watch, the clean-up; with
    ``RAY_ADDRESS`` set, on that Ray cluster), then write ``metrics.jsonl``, ``plots/`` (with the dashboard) and
    ``summary.json`` (``summary``'s keys, then ``steps``, ``exit_status``, ``wall_s``, ``entropy_report``,
    ``rl_checkpoint``, ``plots``), also after a failed or stopped run (what it got to). ``total_steps``: for the
    progress bar (None: unknown). ``save_freq``: the checkpoint interval named in the stop messages.

    Prints the resume line when the run folder has a checkpoint (verl resumes from it: ``trainer.resume_mode``
    auto), and on a stop or failure what to do next. Returns main_ppo's exit status."""
    from stare_verl.jobs.dashboard import method_settings, run_title
    from stare_verl.jobs.runlog import (
        entropy_report,
        format_entropy_report,
        plot_run,
        read_verl_jsonl,
        write_metrics_jsonl,
    )
    from stare_verl.jobs.stall import STALLED
    from stare_verl.jobs.train import launch

    run.logs.mkdir(parents=True, exist_ok=True)
    part = run.new_verl_metric_part()
    # this process's environment (a hub model may download; verl picks its NVIDIA platform), tagged for clean-up
    env = {**os.environ, RUN_TAG_ENV: f"{os.environ.get(RUN_TAG_ENV, 'run')}-{uuid.uuid4().hex}",
           "VERL_FILE_LOGGER_PATH": str(part), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    resume_step = run.latest_step()
    if resume_step is not None:
        print(f"[{name}] resuming from the checkpoint of step {resume_step} in {run.checkpoints}", flush=True)
    print(f"[{name}] verl main_ppo ({total_steps or '?'} steps); log: {run.train_log}", flush=True)
    with open(run.train_log, "ab") as log:
        log.write(f"[{name}] {time.strftime('%Y-%m-%d %H:%M:%S')} {summary.get('backend_line', '')}\n".encode())
    t0 = time.time()
    rc = launch.run_main_ppo(cmd, env, run.train_log, part, total_steps or 0)
    rows = read_verl_jsonl(run.verl_metric_parts())
    write_metrics_jsonl(rows, run.metrics)
    known = {k: summary.get(k) for k in ("family", "method", "seed")}
    settings = method_settings(run, known)
    report = entropy_report(rows)
    plots = plot_run(rows, run.plots, title=run_title(rows, known, settings))
    plots += launch.draw_dashboard(rows, run, known, settings)
    ckpt = run.latest_checkpoint()
    out = {k: v for k, v in summary.items() if k != "backend_line"}
    out.update({
        "steps": rows[-1]["step"] if rows else 0,
        "exit_status": rc,
        "wall_s": round(time.time() - t0, 1),
        "rl_checkpoint": str(ckpt) if ckpt else None,
        "entropy_report": report,
        "plots": [str(p) for p in plots],
    })  # fmt: skip
    run.write_summary(out)
    every = f" (saved every {save_freq} steps)" if save_freq else ""
    if rc == launch.INTERRUPTED:
        print(f"[{name}] interrupted: main_ppo and its Ray processes were stopped. The same command resumes from the "
              f"last checkpoint in {run.checkpoints}{every}.", file=sys.stderr)  # fmt: skip
        return rc
    if rc == STALLED:
        print(f"[{name}] stopped: no progress (the reason is above; {run.train_log} has main_ppo's output). The same "
              f"command resumes from the last checkpoint in {run.checkpoints}{every}.", file=sys.stderr)  # fmt: skip
        return rc
    if rc != 0:
        report, resumable = failure_report(rc, run.train_log)
        print(report, file=sys.stderr)
        if resumable:
            print(f"[{name}] the same command resumes from the last checkpoint in {run.checkpoints}{every}",
                  file=sys.stderr)  # fmt: skip
        return rc if rc > 0 else 1
    print("\n".join(f"[{name}] {line}" for line in format_entropy_report(report)), flush=True)
    print(f"[{name}] done in {out['wall_s']:.0f} s: {run.path}/metrics.jsonl, plots/, summary.json", flush=True)
    return 0


def recipe_total_steps(recipe: str, overrides: list[str]) -> tuple[int | None, Any]:
    """``(trainer.total_training_steps, trainer.save_freq)`` of GPU recipe ``recipe`` composed with ``overrides``
    (None for a step count the recipe leaves to its epochs); ``(None, None)`` when it does not compose (main_ppo
    reports that itself)."""
    from stare_verl.jobs.recipes import compose_recipe

    try:
        cfg = compose_recipe(recipe, overrides)
    except Exception:  # noqa: BLE001 - main_ppo reports a bad override with its own message
        return None, None
    steps = cfg.trainer.get("total_training_steps")
    return (int(steps) if steps else None), cfg.trainer.get("save_freq")


__all__ = ["DEFAULT_LOGGERS", "logger_override", "recipe_total_steps", "run_gpu_recipe",
           "with_run_overrides"]  # fmt: skip
