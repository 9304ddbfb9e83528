"""Running verl's ``main_ppo`` for a run, CPU or GPU: its environment, its launch overrides (the method's), the
console's progress line, the stall watch, the clean-up of its processes, and what a stop says.

:func:`run_main_ppo` is the one place a run's trainer process is started and watched; the CPU path
(:mod:`stare_verl.jobs.train.cpu`) and the GPU recipe (:func:`stare_verl.jobs.gpu_run.run_gpu_recipe`) both call it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stare_verl.jobs.exits import INTERRUPTED
from stare_verl.jobs.logfilter import RepeatedWarningFilter
from stare_verl.jobs.procs import RUN_TAG_ENV, cpu_env, kill_tagged, remove_orphan_shm
from stare_verl.jobs.runlog import RunFolder
from stare_verl.jobs.stall import STALLED, RayLogTail, StallWatch, no_step_timeout
from stare_verl.methods import EntropyControl

RAY_START_WAIT_S = 300
"""Seconds a CPU run's own Ray node may take to register with its GCS (``RAY_raylet_start_wait_time_s``): Ray's 60 s
default fails on a 2-core machine busy with other jobs ("The current node timed out during startup")."""

def method_overrides(method: EntropyControl, overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The Hydra overrides a run of ``method`` (a parsed method: :attr:`TrainOptions.entropy_method`) launches
    with: the user's, then the method's own (``EntropyControl.compose_overrides``). The methods that run as the
    GRPO-ds twin (``grpo``, ``entropy_bonus``, ``clip_cov``, ``kl_cov``) keep W = M = 1 and no adaptive schedule
    whatever the overrides say, so overrides meant for STARE (``make compare ARGS="algorithm.stare.reweight_w=3"``
    applies them to every method) cannot turn them into STARE runs; a note is printed when one was dropped."""
    out, dropped = method.compose_overrides(list(overrides))
    if dropped:
        print(f"note: the GRPO-ds twin keeps W = M = 1; ignored for it: {' '.join(dropped)}", flush=True)
    return out


@contextlib.contextmanager
def timed(phases: dict[str, float], name: str):
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


def stopped_before_rl(name: str, exc: KeyboardInterrupt) -> str:
    """The one line a command prints when a stop (Ctrl-C, SIGTERM, SIGHUP: ``KeyboardInterrupt`` from
    ``procs.interrupt_on_termination``) lands before RL (the cold-start SFT, the held-out evaluation), where
    :func:`~stare_verl.jobs.train.cpu.train_cpu` lets it reach its caller; ``name`` is the command's tag
    (``train-tooluse``, ``compare``)."""
    return (f"[{name}] interrupted ({exc or 'signal SIGINT'}) before RL: nothing of this step is kept (an SFT "
            "checkpoint is cached only when it finishes); the same command starts it again")


def resume_clause(run: RunFolder, every: int) -> str:
    """What the same command does after a stop: resume from the last checkpoint in ``run`` (saved every ``every``
    steps and at the last), or, when none was saved yet, start RL again."""
    if run.latest_step() is None:
        return (f"No checkpoint was saved yet (the first comes at step {every}): the same command starts RL again "
                "from its first step.")  # fmt: skip
    return (f"The same command resumes from the last checkpoint in {run.path / 'checkpoints'} (saved every {every} "
            "steps and at the last).")  # fmt: skip


def run_main_ppo(
    cmd: list[str], env: dict[str, str], log_path: Path, metrics_part: Path, total_steps: int
) -> int:
    """Run main_ppo, its output to ``log_path``, one progress line per logged step; kill its processes at the end.

    The output reaches the log through :class:`stare_verl.jobs.logfilter.RepeatedWarningFilter`: each warning line
    once (Ray's actors repeat the same thread-count warnings thousands of times), their counts at the end.

    At the end every process tagged with ``env[RUN_TAG_ENV]`` is killed and the shared-memory segments the run left
    unmapped are removed (:func:`stare_verl.jobs.procs.remove_orphan_shm`).

    A run that stops making progress is stopped (:class:`stare_verl.jobs.stall.StallWatch`: a Ray worker's death
    followed by no step for 3 minutes or twice the longest step, or no step for ``$STARE_STALL_TIMEOUT_S``, default
    30 minutes), since verl's trainer waits for a dead agent-loop worker's episodes for ever; the reason goes to
    stderr. A CPU run that starts its own Ray waits up to :data:`RAY_START_WAIT_S` for its node to start (Ray's
    ``RAY_raylet_start_wait_time_s``, 60 s by default; the caller's value wins) and keeps Ray's files in a folder of
    its own (``RAY_TMPDIR``, unless the
    caller set one; a GPU run keeps Ray's default, where ``ray.init()`` finds a cluster started with ``ray start``): its raylet and GCS logs are watched for the deaths main_ppo's output never shows
    (:class:`stare_verl.jobs.stall.RayLogTail`: Ray's memory monitor killing idle actors, a SIGKILL), and no other
    run on the machine can join its cluster by accident. The folder is removed after a run that ended well and kept
    after one that did not (its path on stderr, unless the run was interrupted).

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
    own_tmp = None
    # a CPU run that starts its own Ray gets its own files (a short path: Ray's socket paths must stay short); a GPU
    # run keeps Ray's default folder, where ray.init() finds a cluster the user started with `ray start`
    if env.get("VERL_PLATFORM") == "cpu" and not env.get("RAY_ADDRESS") and not env.get("RAY_TMPDIR"):
        own_tmp = Path(tempfile.mkdtemp(prefix="stare-run-", dir="/tmp"))
        env = {**env, "RAY_TMPDIR": str(own_tmp)}
    if env.get("VERL_PLATFORM") == "cpu" and not env.get("RAY_ADDRESS"):
        # Ray gives a new node 60 s to register its raylet with the GCS; a loaded CPU machine can take longer
        env = {"RAY_raylet_start_wait_time_s": str(RAY_START_WAIT_S), **env}
    ray_logs = RayLogTail(env["RAY_TMPDIR"]) if not env.get("RAY_ADDRESS") and env.get("RAY_TMPDIR") else None
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
                deaths = ray_logs.new_lines() if ray_logs is not None else []
                with watch_lock:
                    for line in deaths:
                        watch.death(line, time.monotonic())
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
    if own_tmp is not None:
        # ended well, stopped by the user (whose one-line message names no folder: nothing to look into), or Ray
        # never started: removed; kept, and named, for the post-mortem of a run that failed or stalled
        if rc in (0, INTERRUPTED) or not (own_tmp / "ray").exists():
            shutil.rmtree(own_tmp, ignore_errors=True)
        else:
            sessions = sorted((own_tmp / "ray").glob("session_2*"))
            logs = (sessions[-1] if sessions else own_tmp / "ray" / "session_latest") / "logs"
            print(f"Ray's logs of this run: {logs}", file=sys.stderr, flush=True)
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


def draw_dashboard(
    rows: list[dict[str, Any]], run: RunFolder, summary: dict[str, Any], settings: dict[str, Any]
) -> list[Path]:
    """``plots/dashboard.png`` of the run (:func:`stare_verl.jobs.dashboard.draw_dashboard`) from its metric rows,
    ``summary`` (method, seed, family, held-out evaluations) and the method's ``settings``
    (:func:`stare_verl.jobs.dashboard.method_settings`); returns ``[path]``, or ``[]`` when no step logged a
    metric. Raises OSError when the PNG cannot be written."""
    from stare_verl.jobs.dashboard import DASHBOARD_NAME, NoMetricsError
    from stare_verl.jobs.dashboard import draw_dashboard as draw

    try:
        dash = draw(rows, run.plots / DASHBOARD_NAME, summary, settings)
    except NoMetricsError:
        return []
    return [dash.path]
