"""tests.support.cpu.launch_main_ppo: one launch, the leftover check, and a relaunch only after Ray's own start-up
timeout (fake commands stand in for main_ppo)."""

import os
import sys
import uuid

from tests.support.cpu import RAY_START_TIMEOUT, RUN_TAG_ENV, launch_main_ppo

# Counts its launches in a file, prints what it is told to, exits with the given status.
_FAKE = """
import pathlib, sys
n = pathlib.Path(sys.argv[1]); n.write_text(str(int(n.read_text() or 0) + 1) if n.exists() else "1")
print(sys.argv[2], flush=True)
sys.exit(int(sys.argv[3]))
"""


def _launch(tmp_path, text, rc, **kw):
    count = tmp_path / "count"
    if count.exists():
        count.unlink()
    env = {**os.environ, RUN_TAG_ENV: f"launch-{uuid.uuid4().hex}"}
    cmd = [sys.executable, "-c", _FAKE, str(count), text, str(rc)]
    launch = launch_main_ppo(cmd, env, tmp_path, tmp_path / "log.txt", 60, settle_s=0.5, **kw)
    return launch, int(count.read_text())


def test_success_and_real_failures_run_once(tmp_path):
    launch, n = _launch(tmp_path, "step 1 done", 0)
    assert (launch.rc, launch.attempts, n, launch.leaked, launch.failure("x")) == (0, 1, 1, [], None)
    launch, n = _launch(tmp_path, "Traceback: KeyError 'actor'", 1)
    assert (launch.rc, launch.attempts, n) == (1, 1, 1)
    assert launch.failure("x").startswith("main_ppo (x) exited with 1 after ")
    assert launch.failure("x").endswith("Traceback: KeyError 'actor'\n") and "KeyError" in launch.log()


def test_ray_start_timeout_is_launched_again_until_attempts_run_out(tmp_path):
    launch, n = _launch(tmp_path, f"RuntimeError: {RAY_START_TIMEOUT}.", 1)
    assert (launch.rc, launch.attempts, n) == (1, 3, 3)
    launch, n = _launch(tmp_path, f"RuntimeError: {RAY_START_TIMEOUT}.", 1, attempts=2)
    assert (launch.attempts, n) == (2, 2)
    # something of ours already ran: that is a real failure, not a start-up one
    launch, n = _launch(tmp_path, f"RuntimeError: {RAY_START_TIMEOUT}.", 1, ran=lambda: True)
    assert (launch.attempts, n) == (1, 1)


def test_timeout_and_leftover_processes(tmp_path):
    env = {**os.environ, RUN_TAG_ENV: f"launch-{uuid.uuid4().hex}"}
    sleeper = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], " \
              "start_new_session=True); print('" + RAY_START_TIMEOUT + "')"
    launch = launch_main_ppo([sys.executable, "-c", sleeper], env, tmp_path, tmp_path / "a.log", 60, settle_s=0.5)
    assert launch.rc == 0 and len(launch.leaked) == 1 and launch.still_alive == [] and launch.attempts == 1
    launch = launch_main_ppo([sys.executable, "-c", "import time; time.sleep(30)"], env, tmp_path, tmp_path / "b.log",
                             1, settle_s=0.5)  # fmt: skip
    assert (launch.rc, launch.attempts) == ("timeout", 1)
