"""Clean-up of a run's tagged processes (stare_verl.jobs.procs)."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from stare_verl.jobs.procs import RUN_TAG_ENV, kill_processes, kill_tagged, tagged_processes

# On SIGTERM this parent starts one more tagged process (as a Ray raylet may fork a worker while it is being
# stopped) and exits: a single scan-and-kill leaves that child behind.
_FORKS_ON_TERM = """
import signal, subprocess, sys, time
def on_term(*_):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
"""


def _start(tag):
    env = {**os.environ, RUN_TAG_ENV: tag}
    p = subprocess.Popen([sys.executable, "-c", _FORKS_ON_TERM], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_one_scan_misses_a_child_forked_during_the_kill_but_kill_tagged_does_not():
    tag = f"pytest-procs-{uuid.uuid4().hex}"
    p = _start(tag)
    try:
        assert tagged_processes(tag) == [p.pid]
        kill_processes(tagged_processes(tag), timeout=4)
        p.wait(timeout=10)
        deadline = time.time() + 5
        while not tagged_processes(tag) and time.time() < deadline:
            time.sleep(0.1)
        (child,) = tagged_processes(tag)  # the child started on SIGTERM survived one scan
        assert child != p.pid
        assert kill_tagged(tag, timeout=4) == [] and tagged_processes(tag) == []

        q = _start(tag)  # the same from the start: every round scans again
        assert kill_tagged(tag, timeout=4) == [] and tagged_processes(tag) == []
        q.wait(timeout=10)
    finally:
        kill_processes(tagged_processes(tag), timeout=2)
        p.kill()


# A driver that runs a stand-in for main_ppo (its own session, as main_ppo is launched) through run_main_ppo.
_DRIVER = """
import os, sys
from pathlib import Path
from stare_verl.jobs import train
from stare_verl.jobs.procs import RUN_TAG_ENV, interrupt_on_termination
interrupt_on_termination()
out = Path(sys.argv[1])
if len(sys.argv) > 3:  # a slow log set-up: the signal lands after the launch, before the wait loop
    import time
    class SlowFilter(train.launch.RepeatedWarningFilter):
        def __init__(self, *a, **k):
            time.sleep(float(sys.argv[3]))
            super().__init__(*a, **k)
    train.launch.RepeatedWarningFilter = SlowFilter
child = "import os, time, pathlib; pathlib.Path(%r).write_text(str(os.getpid())); time.sleep(120)" % str(out / "pid")
env = {**os.environ, RUN_TAG_ENV: sys.argv[2]}
rc = train.run_main_ppo([sys.executable, "-c", child], env, out / "log", out / "metrics.jsonl", 5)
print("rc", rc, flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _ignore_sigint():
    """What a shell does to a job started with ``&`` without job control (nohup, CI runners, ``make ... &``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_terminated_driver_stops_main_ppo_as_ctrl_c_does(tmp_path, sig, inherited):
    """kill / timeout / a closed terminal (SIGTERM, SIGHUP) stop the run's processes as Ctrl-C (SIGINT) does,
    instead of leaving main_ppo (its own session) training detached; also when the driver inherited SIGINT as
    ignored (a background job of a non-interactive shell), where Python alone would keep ignoring Ctrl-C."""
    _signal_driver_and_check(tmp_path, sig, preexec_fn=_ignore_sigint if inherited == "ignored" else None)


def test_a_signal_during_the_launch_set_up_still_stops_main_ppo(tmp_path):
    """The window between main_ppo's start (its own session) and the driver's wait loop (the log reader's set-up,
    widened here to 5 s): a SIGTERM landing there stops the stand-in and prints the exit status, as one landing in
    the loop does (it once left the driver dead without a word and main_ppo training detached)."""
    _signal_driver_and_check(tmp_path, signal.SIGTERM, setup_s=5.0)  # the signal lands within the 5 s set-up


def _signal_driver_and_check(tmp_path, sig, *, preexec_fn=None, setup_s: float | None = None) -> None:
    """Start :data:`_DRIVER` (``setup_s``: its log set-up made that slow), send ``sig`` as soon as the stand-in for
    main_ppo has started, then check that the driver reports 130 and that the stand-in and every tagged process
    are gone."""
    tag = f"test-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-c", _DRIVER, str(tmp_path), tag, *([str(setup_s)] if setup_s is not None else [])]
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              preexec_fn=preexec_fn)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
            assert time.time() < deadline and driver.poll() is None, "the stand-in never started"
            time.sleep(0.05)
        child = int((tmp_path / "pid").read_text())
        driver.send_signal(sig)
        out, _ = driver.communicate(timeout=90)
        assert "rc 130" in out
        deadline = time.time() + 30
        while _alive(child) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(child)
        assert tagged_processes(tag) == []
    finally:
        if driver.poll() is None:
            driver.kill()
        kill_tagged(tag)


# Each driver's entry point, with its long-running work replaced by a stand-in that reports the SIGINT disposition
# it runs under and then waits: the entry point itself must have installed the handler.
_ENTRY = """
import signal, sys, time
def work(*a, **k):
    print("ready", signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.SIG_DFL), flush=True)
    time.sleep(120)
    return 0
which = sys.argv[1]
if which in ("train", "compare"):
    from stare_verl.jobs import train
    train.cpu.train_cpu = work
    if which == "train":
        sys.exit(train.main(["--cpu"]))
    from stare_verl.jobs import compare
    compare.run_stats = lambda *a, **k: {}
    sys.exit(compare.main(["--family", "shortcot", "--seeds", "0", "--out", sys.argv[2]]))
if which == "sft":
    from stare_verl.jobs import sft
    sft._train = work
    sys.exit(sft.main(["train", "--device", "cpu"]))
if which == "eval":
    from stare_verl.jobs.evaluation import cli
    cli.run = work
    sys.exit(cli.main([]))
if which == "stare-verl":
    from stare_verl.jobs import cli, train
    train.cpu.train_cpu = work
    sys.exit(cli.main(["train", "--cpu"]))
"""


@pytest.mark.parametrize("entry", ["train", "compare", "sft", "eval", "stare-verl"])
def test_every_driver_turns_an_inherited_ignored_sigint_into_an_interrupt(tmp_path, entry):
    """train, compare, sft, eval (and the stare-verl script) started with SIGINT ignored still stop on SIGINT.

    Two contracts: the user-facing commands train and compare (and ``stare-verl train``) end a stop that reaches
    them from their work (``train_cpu`` raises it to its caller before RL) with one line and status 130, never a
    traceback; the stand-ins of sft and eval replace the function that reports the stop (``sft._train``,
    ``evaluation.cli.run``), so there the interrupt itself reaches the top: the helper's contract is to raise it."""
    proc = subprocess.Popen([sys.executable, "-c", _ENTRY, entry, str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint)  # fmt: skip
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("ready"):  # a driver may print its plan first
            line = proc.stdout.readline()
        assert line.split() == ["ready", "True"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if entry in ("train", "compare", "stare-verl"):
            assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err
            assert [ln for ln in err.splitlines() if "interrupted" in ln] == [err.strip().splitlines()[-1]]
            assert "interrupted (signal SIGINT) before RL" in err
        else:
            assert proc.returncode != 0 and "KeyboardInterrupt" in err
    finally:
        if proc.poll() is None:
            proc.kill()


# The real train / compare up to the cold-start SFT, whose stand-in starts a math-verify worker (a child process, as
# the SFT's demonstration check starts one), reports its pid and then trains "for minutes".
_SFT_STOP = """
import os, sys, time
from stare_verl.jobs.demo import sft as demo_sft
def slow_sft(cfg, *a, **k):
    from envs.scoring import verify
    assert verify.prewarm(wait_s=120)
    pids = [w.proc.pid for w in verify.get_pool()._all]
    print("sft", *pids, flush=True)
    time.sleep(300)
demo_sft.ensure_sft_checkpoint = slow_sft
which, out = sys.argv[1], sys.argv[2]
if which == "train":
    from stare_verl.jobs import train
    sys.exit(train.main(["--cpu", "--family", "shortcot", "--steps", "2", "--run-dir", out]))
from stare_verl.jobs import compare
sys.exit(compare.main(["--family", "shortcot", "--seeds", "0", "--steps", "2", "--out", out]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("entry", ["train", "compare"])
def test_a_stop_during_the_cold_start_sft_ends_with_one_line_and_130(tmp_path, entry, sig):
    """Ctrl-C or a kill during the cold-start SFT (minutes, before RL's own stop handling) ends train and compare as
    a stop during RL does: one line, status 130, no traceback, and the SFT's child processes gone."""
    proc = subprocess.Popen([sys.executable, "-c", _SFT_STOP, entry, str(tmp_path / "out")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("sft"):  # the driver prints its plan first
            line = proc.stdout.readline()
        children = [int(x) for x in line.split()[1:]]
        assert children, "the SFT stand-in never started"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
        last = err.strip().splitlines()[-1]
        assert f"interrupted (signal {sig.name}) before RL" in last and "the same command starts it again" in last
        assert sum("interrupted" in ln for ln in err.splitlines()) == 1
        assert last.startswith("[train-shortcot]" if entry == "train" else "[compare stare-seed0]")
        deadline = time.time() + 30
        while any(_alive(c) for c in children) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(c) for c in children)  # nothing left running
    finally:
        if proc.poll() is None:
            proc.kill()
