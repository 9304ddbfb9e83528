"""``stare_verl.jobs.stall``: when a CPU run's main_ppo has stopped making progress, and the job's reaction
(``train.run_main_ppo`` stops the run with ``STALLED``, its processes killed)."""

from __future__ import annotations

import functools
import sys
import time

import pytest

from stare_verl.jobs import stall, train
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
