"""``stare_verl.jobs.stall``: when a CPU run's main_ppo has stopped making progress, and the job's reaction
(``train.run_main_ppo`` stops the run with ``STALLED``, its processes killed)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from stare_verl.jobs import stall, train
from stare_verl.jobs.exits import INTERRUPTED
from stare_verl.jobs.procs import tagged_processes
from stare_verl.jobs.stall import STALLED, StallWatch, no_step_timeout

# lines of the run that hung (a tool-use run whose agent-loop worker aborted in ZeroMQ), Ray's prefixes included
DEATH_LINES = [
    "\x1b[36m(AgentLoopWorkerTQ pid=19341)\x1b[0m *** SIGABRT received at time=1796424855 on cpu 1 ***",
    "\x1b[36m(AgentLoopWorkerTQ pid=19341)\x1b[0m [2026-12-04 22:54:15,153 E 19341 19715] logging.cc:474: *** SIGABRT "
    "received at time=1796424855 on cpu 1 ***",
    "\x1b[36m(AgentLoopWorkerTQ pid=19341)\x1b[0m Fatal Python error: Aborted",
    "\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system error. To "
    "troubleshoot the problem, check the logs for the dead worker.",
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    "(WorkerDict pid=7) *** SIGSEGV received at time=1 on cpu 0 ***",
]
BENIGN_LINES = [
    "\x1b[36m(AgentLoopWorkerTQ pid=19341)\x1b[0m Bad file descriptor (src/signaler.cpp:157)",  # alone: not a death
    "(TaskRunnerV1 pid=18644) INFO:2026-12-04 22:55:13,236:pending: 0, running: 8, finished: 0, failure: 0",
    "(TaskRunner pid=7) step:3 - actor/entropy:0.05 - stare/gate_on:1.0",
    "WARNING:2026-12-04 22:44:22,474:No supported accelerator detected.",
    "the tool's stderr: Traceback (most recent call last): ... ZeroDivisionError: division by zero",
]


@pytest.mark.parametrize("text", DEATH_LINES)
def test_worker_death_lines_are_recognised(text):
    assert stall.WORKER_DEATH.search(text)


@pytest.mark.parametrize("text", BENIGN_LINES)
def test_ordinary_lines_are_not_deaths(text):
    assert not stall.WORKER_DEATH.search(text)


def test_death_without_a_step_stops_after_the_grace():
    w = StallWatch(started=0.0, no_step_s=1800, after_death_s=180)
    w.step(100.0)
    w.line(BENIGN_LINES[1], 110.0)
    w.line(DEATH_LINES[2], 120.0)
    w.line(DEATH_LINES[3], 125.0)  # the first death line is the one reported
    assert w.verdict(299.0) is None
    reason = w.verdict(300.0)
    assert reason is not None and "Fatal Python error: Aborted" in reason and "180 s" in reason


def test_a_step_after_a_death_clears_it():
    w = StallWatch(started=0.0, no_step_s=1800, after_death_s=180)
    w.line(DEATH_LINES[4], 50.0)
    w.step(60.0)  # the run went on (e.g. the worker was not one the trainer waits for)
    assert w.death_line is None and w.verdict(400.0) is None
    assert w.verdict(1860.0) is not None  # no step for 1800 s since


def test_no_step_at_all_stops_after_no_step_s():
    w = StallWatch(started=10.0, no_step_s=600, after_death_s=180)
    assert w.verdict(609.0) is None
    reason = w.verdict(610.0)
    assert reason is not None and "no RL step in 600 s" in reason and stall.STALL_ENV in reason
    w.step(610.0)
    assert w.verdict(1209.0) is None and w.verdict(1210.0) is not None


@pytest.mark.parametrize(("raw", "expected"), [("", 1800.0), ("600", 600.0), (" 90.5 ", 90.5), ("60", 60.0),
                                              ("0", float("inf")), ("0.0", float("inf"))])  # fmt: skip
def test_no_step_timeout_from_the_environment(raw, expected):
    assert no_step_timeout({stall.STALL_ENV: raw}) == expected


@pytest.mark.parametrize("raw", ["ten", "5s", "1e", "nan", "inf", "-inf", "1e400", "-5", "-0.5"])
def test_no_step_timeout_rejects_what_is_not_a_finite_non_negative_number(raw):
    with pytest.raises(ValueError, match=stall.STALL_ENV):
        no_step_timeout({stall.STALL_ENV: raw})


@pytest.mark.parametrize("raw", ["30", "0.001", "59.9"])
def test_no_step_timeout_below_the_start_up_is_refused(raw):
    with pytest.raises(ValueError, match="start-up"):
        no_step_timeout({stall.STALL_ENV: raw})


def test_zero_switches_off_the_death_rule_too():
    w = StallWatch(started=0.0, no_step_s=float("inf"))
    w.line(DEATH_LINES[4], 5.0)
    assert w.verdict(1e6) is None


@pytest.mark.parametrize("text", [
    "(AgentLoopWorker pid=1) print('Fatal Python error is a phrase')",
    "(TaskRunner pid=7) WARNING: math-verify could not parse 'Fatal Python error: Aborted' in the response",
])  # fmt: skip
def test_a_quoted_death_phrase_is_not_a_death(text):
    assert not stall.WORKER_DEATH.search(text)


def test_train_refuses_a_bad_timeout_before_anything_runs(monkeypatch):
    monkeypatch.setenv(stall.STALL_ENV, "soon")
    assert stall.STALL_ENV in train.bad_option(train.parse_options([]))


# main_ppo stand-ins: one whose worker dies and that then waits for ever (what verl's trainer does), one silent
_DIES_THEN_HANGS = (
    "import sys, time\n"
    "print('(TaskRunner pid=7) step:1 - actor/entropy:0.5', flush=True)\n"
    "print('\\x1b[36m(AgentLoopWorkerTQ pid=19341)\\x1b[0m Fatal Python error: Aborted', flush=True)\n"
    "while True:\n"
    "    print('(TaskRunnerV1 pid=7) INFO:pending: 0, running: 8, finished: 0, failure: 0', flush=True)\n"
    "    time.sleep(0.5)\n"
)
_SILENT = "import time\ntime.sleep(3600)\n"


def _run(tmp_path, code, tag):
    log, part = tmp_path / "train.log", tmp_path / "verl_metrics.jsonl"
    env = train.run_env(tag, part)
    t0 = time.monotonic()
    rc = train.run_main_ppo([sys.executable, "-c", code], env, log, part, total_steps=5)
    return rc, time.monotonic() - t0, log.read_text()


def test_run_main_ppo_stops_a_run_whose_worker_died(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train.launch, "StallWatch", functools.partial(StallWatch, after_death_s=3.0))
    rc, took, log = _run(tmp_path, _DIES_THEN_HANGS, "stall-test-death")
    assert rc == STALLED
    assert took < 60  # stopped, not waited on
    assert "Fatal Python error: Aborted" in log
    err = capsys.readouterr().err
    assert "a Ray worker died" in err and "the run is stopped" in err
    assert tagged_processes("stall-test-death") == []  # the stand-in and anything it started are gone


def test_run_main_ppo_stops_a_run_without_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train.launch, "no_step_timeout", lambda: 4.0)  # the variable's floor is 60 s
    rc, took, _ = _run(tmp_path, _SILENT, "stall-test-silent")
    assert rc == STALLED and took < 60
    assert "no RL step in" in capsys.readouterr().err
    assert tagged_processes("stall-test-silent") == []


# --- deaths only Ray's own logs report (the run of 2026-12-06 that hung 16 minutes: Ray's memory monitor killed its
# rollout server, load balancer and agent-loop worker between two steps, and main_ppo's output said nothing) ---------
RAYLET_KILL = (
    "[2026-12-06 05:45:19,854 I 7472 7472] (raylet) node_manager.cc:3199: Killing 4 worker(s), kill details: Memory "
    "on the node (IP: 192.0.2.2, ID: f6593a3af401a4bcf5) was 23.36GB used / 23.54GB limit (0.992427)"
)
GCS_ACTOR_FAILED = (
    "[2026-12-06 05:45:20,025 I 7397 7397] (gcs_server) gcs_actor_manager.cc:1515: Actor is failed on worker "
    "160bc483b77a4521 at node f6593a3af401a4bc, need_reschedule = 1, death context type = OOMContext, "
    "remaining_restarts = 0, num_restarts = 0, num_restarts_due_to_node_preemption = 0, preempted = 0 job_id=01000000"
)
RAY_LOG_NOISE = [
    "[2026-12-06 05:33:32,561 I 7472 7472] (raylet) threshold_memory_monitor.cc:53: ThresholdMemoryMonitor initialized "
    "with usage threshold at 24897052672 bytes (98.500000% of system memory)",
    "[state-dump] 	RayletWorkerPool.deadline_timer.kill_idle_workers - 6801 total (1 active)",
    "[state-dump] 	NodeManager.KillWorkersCallback - 1 total (0 active), Execution time: mean = 1795.93ms",
    "[2026-12-06 05:45:20,024 W 7397 7397] (gcs_server) gcs_worker_manager.cc:70: Reporting worker exit, worker id = "
    "160bc483, node id = f6593a3a, address = 192.0.2.2, exit_type = INTENDED_SYSTEM_EXIT",
]


def _session_logs(root, name="session_2026-12-06_05-33-29_985872_7001"):
    logs = root / "ray" / name / "logs"
    logs.mkdir(parents=True)
    return logs


def test_ray_log_tail_reads_only_new_death_lines(tmp_path):
    tail = stall.RayLogTail(tmp_path)
    assert tail.new_lines() == []  # no Ray session yet
    logs = _session_logs(tmp_path)
    (logs / "raylet.out").write_text("\n".join(RAY_LOG_NOISE) + "\n")
    (logs / "gcs_server.out").write_text(RAY_LOG_NOISE[-1] + "\n")
    assert tail.new_lines() == []
    with open(logs / "gcs_server.out", "a") as f:
        f.write(GCS_ACTOR_FAILED[:60])  # a line still being written: not yet
    with open(logs / "raylet.out", "a") as f:
        f.write(RAYLET_KILL + "\nOOM kill reason: Memory usage 24907833344B exceeded threshold\n")
    assert tail.new_lines() == [RAYLET_KILL]
    with open(logs / "gcs_server.out", "a") as f:
        f.write(GCS_ACTOR_FAILED[60:] + "\n")
    assert tail.new_lines() == [GCS_ACTOR_FAILED]
    assert tail.new_lines() == []  # each line once
    (logs / "worker-1.out").write_text(RAYLET_KILL + "\n")  # a worker's own output is main_ppo's business
    assert tail.new_lines() == []


def test_ray_log_tail_reads_a_later_session_and_big_logs_in_parts(tmp_path):
    tail = stall.RayLogTail(tmp_path, max_read=100)
    logs = _session_logs(tmp_path)
    (logs / "raylet.out").write_text("x" * 250 + "\n" + RAYLET_KILL + "\n")
    got = []
    for _ in range(10):
        got += tail.new_lines()
    assert got == [RAYLET_KILL]
    later = _session_logs(tmp_path, "session_2026-12-06_06-01-00_000000_9000")
    (later / "gcs_server.out").write_text(GCS_ACTOR_FAILED + "\n")
    assert tail.new_lines() == []  # 100 of its ~300 bytes so far
    assert [line for _ in range(3) for line in tail.new_lines()] == [GCS_ACTOR_FAILED]


def test_a_ray_log_death_names_the_memory_kill_and_its_remedy():
    watch = StallWatch(0.0, no_step_s=1e9, after_death_s=10.0)
    watch.death(RAYLET_KILL, 5.0)
    watch.death(GCS_ACTOR_FAILED, 6.0)  # the first death is the one reported
    assert watch.verdict(14.0) is None
    why = watch.verdict(15.0)
    assert "Killing 4 worker(s)" in why and "23.36GB used / 23.54GB limit" in why
    assert "out of memory: Ray killed 4 worker(s) at 23.36 of 23.54 GB" in why and "ppo_micro_batch_size_per_gpu" in why


def test_the_grace_after_a_death_is_twice_the_longest_step():
    watch = StallWatch(0.0, no_step_s=1e9, after_death_s=180.0)
    watch.step(400.0)  # the first step: start-up included, not a step's length
    assert watch.death_grace_s == 180.0
    watch.step(650.0)  # a 250 s step (a real model under load)
    watch.step(700.0)
    assert watch.death_grace_s == 500.0
    watch.death(GCS_ACTOR_FAILED, 710.0)
    assert watch.verdict(1205.0) is None  # a slow step may still come
    assert "Actor is failed" in watch.verdict(1210.0)


_KILLED_THEN_HANGS = (
    "import os, pathlib, sys, time\n"
    "logs = pathlib.Path(os.environ['RAY_TMPDIR']) / 'ray' / 'session_2026-12-06_05-33-29_985872_7001' / 'logs'\n"
    "logs.mkdir(parents=True)\n"
    "print('(TaskRunner pid=7) step:1 - actor/entropy:0.5', flush=True)\n"
    f"(logs / 'raylet.out').write_text({RAYLET_KILL!r} + '\\n')\n"
    "while True:\n"
    "    print('(TaskRunnerV1 pid=7) INFO:pending: 0, running: 7, finished: 1, failure: 0', flush=True)\n"
    "    time.sleep(0.5)\n"
)


def test_run_main_ppo_stops_a_run_whose_actor_ray_killed_silently(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(train.launch, "StallWatch", functools.partial(StallWatch, after_death_s=3.0))
    rc, took, log = _run(tmp_path, _KILLED_THEN_HANGS, "stall-test-ray-log")
    assert rc == STALLED and took < 60
    assert "Killing 4 worker(s)" not in log  # main_ppo's output never said it: only Ray's log did
    err = capsys.readouterr().err
    assert "a Ray worker died" in err and "Killing 4 worker(s)" in err and "out of memory" in err
    kept = [line.split(": ", 1)[1] for line in err.splitlines() if line.startswith("Ray's logs of this run: ")]
    assert len(kept) == 1 and kept[0].startswith("/tmp/stare-run-")
    assert RAYLET_KILL in (Path(kept[0]) / "raylet.out").read_text()  # kept for the post-mortem
    shutil.rmtree(Path(kept[0]).parents[2])
    assert tagged_processes("stall-test-ray-log") == []


def test_a_run_that_ends_well_leaves_no_ray_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = "import os, pathlib; print(os.environ['RAY_TMPDIR']); pathlib.Path(os.environ['RAY_TMPDIR'], 'ray').mkdir()"
    rc, _, log = _run(tmp_path, code, "stall-test-ray-clean")
    folder = log.strip().splitlines()[-1]
    assert rc == 0 and folder.startswith("/tmp/stare-run-") and not os.path.exists(folder)


def test_a_run_the_user_stops_leaves_no_ray_folder(tmp_path, monkeypatch):
    """Ctrl-C: the run's one-line stop message names no folder, so the run's own Ray folder must not stay behind."""
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = ("import os, pathlib, signal, time; print(os.environ['RAY_TMPDIR'], flush=True); "
            "pathlib.Path(os.environ['RAY_TMPDIR'], 'ray').mkdir(); time.sleep(1); "
            "os.kill(os.getppid(), signal.SIGINT); time.sleep(60)")  # fmt: skip
    rc, took, log = _run(tmp_path, code, "stall-test-ray-stopped")
    folder = log.strip().splitlines()[0]
    assert rc == INTERRUPTED and took < 40
    assert folder.startswith("/tmp/stare-run-") and not os.path.exists(folder)
    assert tagged_processes("stall-test-ray-stopped") == []


def test_a_cpu_run_s_own_ray_waits_longer_for_its_node_unless_the_caller_said(tmp_path, monkeypatch):
    """Ray's 60 s for a new node to register failed on the loaded 2-core machine: a CPU run that starts its own Ray
    gives it RAY_START_WAIT_S; the caller's RAY_raylet_start_wait_time_s wins."""
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_raylet_start_wait_time_s", raising=False)
    code = "import os; print('wait', os.environ.get('RAY_raylet_start_wait_time_s'))"
    rc, _, log = _run(tmp_path, code, "stall-test-ray-wait")
    assert rc == 0 and f"wait {train.launch.RAY_START_WAIT_S}" in log and train.launch.RAY_START_WAIT_S >= 180
    monkeypatch.setenv("RAY_raylet_start_wait_time_s", "77")
    (tmp_path / "b").mkdir()
    rc, _, log = _run(tmp_path / "b", code, "stall-test-ray-wait-own")
    assert rc == 0 and "wait 77" in log


def test_a_caller_ray_tmpdir_is_kept_and_watched(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    own = tmp_path / "ray-tmp"
    monkeypatch.setenv("RAY_TMPDIR", str(own))
    monkeypatch.setattr(train.launch, "StallWatch", functools.partial(StallWatch, after_death_s=3.0))
    log, part = tmp_path / "train.log", tmp_path / "verl_metrics.jsonl"
    env = train.run_env("stall-test-ray-own", part)
    rc = train.run_main_ppo([sys.executable, "-c", _KILLED_THEN_HANGS], env, log, part, total_steps=5)
    assert rc == STALLED and (own / "ray").is_dir()
    assert "Killing 4 worker(s)" in capsys.readouterr().err


_KILL_AN_IDLE_ACTOR = """
import os, signal, time, ray
ray.init(num_cpus=1, include_dashboard=False)
@ray.remote(max_restarts=0)
class Idle:
    def pid(self):
        return os.getpid()
actor = Idle.remote()
os.kill(ray.get(actor.pid.remote()), signal.SIGKILL)  # what the kernel's OOM killer does
try:
    ray.get(actor.pid.remote(), timeout=120)  # fails once the GCS has marked the actor dead
    raise SystemExit("the killed actor answered")
except ray.exceptions.RayActorError:
    pass
time.sleep(2)  # the GCS log line is flushed
ray.shutdown()
"""


@pytest.mark.integration
def test_ray_log_tail_sees_a_real_actor_killed_with_sigkill():
    """Ray's own GCS log (Ray as installed) reports an idle actor killed with SIGKILL in the form RayLogTail reads."""
    root = tempfile.mkdtemp(prefix="stare-test-", dir="/tmp")  # short: Ray's socket paths have a length limit
    try:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": root}
        done = subprocess.run([sys.executable, "-c", _KILL_AN_IDLE_ACTOR], env=env, timeout=300, capture_output=True,
                              text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        lines = stall.RayLogTail(root).new_lines()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert len(lines) == 1 and "Actor is failed on worker" in lines[0], (lines, done.stdout[-2000:])
    assert "death context type = ActorDiedErrorContext" in lines[0]


def test_a_gpu_run_keeps_rays_default_folder(tmp_path, monkeypatch):
    """ray.init() in a GPU run must still find a cluster the user started with `ray start` (Ray's default folder)."""
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    log, part = tmp_path / "train.log", tmp_path / "verl_metrics.jsonl"
    env = train.run_env("stall-test-gpu-env", part, platform="cuda")
    code = "import os; print('RAY_TMPDIR=' + os.environ.get('RAY_TMPDIR', 'unset'))"
    assert train.run_main_ppo([sys.executable, "-c", code], env, log, part, total_steps=1) == 0
    assert "RAY_TMPDIR=unset" in log.read_text()
