"""``make test``: the whole suite as two pytest sessions side by side, ``tests/e2e`` and everything else.

The end-to-end tests run one after another in their own session (each launches verl's trainer, which keeps both
cores busy for about a minute, and several tests read one launch through session-scoped fixtures); the unit and
integration tests, mostly one busy process at a time, run beside them in a second session, so the machine's second
core is not idle for the quarter of an hour the e2e launches take. Both sessions run every test; the e2e session's
output is written to ``.pytest-e2e.log`` and printed after the other's; the exit status is the first non-zero of
the two (0 when both passed).

Ctrl-C (SIGINT), SIGTERM and SIGHUP stop both sessions with SIGINT (pytest's own clean-up: fixtures, the e2e runs'
process checks), then kill what is left after 60 s.

Usage: ``python -m tests.support.suite [pytest options]`` (the options go to both sessions).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

E2E = "tests/e2e"
LOG = Path(".pytest-e2e.log")
STOP_GRACE_S = 60.0


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.time() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str]) -> int:
    """Run both sessions; return the exit status (see the module docstring)."""

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    pytest = [sys.executable, "-m", "pytest"]
    procs: list[subprocess.Popen] = []
    try:
        with open(LOG, "w") as log:
            procs.append(subprocess.Popen([*pytest, *argv, E2E], stdout=log, stderr=subprocess.STDOUT))
            procs.append(subprocess.Popen([*pytest, *argv, f"--ignore={E2E}", "tests"]))
            rest = procs[1].wait()
            e2e = procs[0].wait()
    except KeyboardInterrupt:
        _stop(procs)
        print(f"make test: interrupted; the e2e session's output is in {LOG}", file=sys.stderr)
        return 130
    print(f"\n===== {E2E} (run beside the rest; {LOG}) =====", flush=True)
    print(LOG.read_text(errors="replace"), end="", flush=True)
    print(f"\n===== make test: {E2E} exit {e2e}, the rest exit {rest} =====", flush=True)
    return e2e or rest


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
