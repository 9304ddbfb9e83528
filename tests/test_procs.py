"""Clean-up of a run's tagged processes (stare_verl.jobs.procs)."""

import os
import subprocess
import sys
import time
import uuid

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
