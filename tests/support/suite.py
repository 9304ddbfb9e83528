"""``make test``: the whole suite as two pytest sessions side by side, ``tests/e2e`` and everything else.

The end-to-end tests run one after another in their own session (each launches verl's trainer, which keeps both
cores busy for about a minute, and several tests read one launch through session-scoped fixtures); the unit and
integration tests, mostly one busy process at a time, run beside them in a second session, so the machine's second
core is not idle while the e2e launches run. The e2e launches in ``BESIDE`` (ones that share no session fixture)
run at the end of the second session instead, so that the two sessions take about as long; none at present (the
second session is the longer one: nearly idle, 2 cores, 747 s against the e2e session's 600 s, plus 91 s for the
long-CoT run that was there until 2026-12-07). Between them the sessions run every test once; the e2e
session's output is written to ``.pytest-e2e.log`` and printed after the other's; the exit status is the first
non-zero of the two (0 when both passed).

Ctrl-C (SIGINT), SIGTERM and SIGHUP stop both sessions with one SIGINT each (pytest's own clean-up: fixtures, the
e2e runs' process checks), then kill what is left after 60 s. The sessions run in process groups of their own, so
that a Ctrl-C reaches them only through the runner (once), and get SIGINT when the runner dies.

Usage: ``python -m tests.support.suite [pytest options]`` (the options go to both sessions).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

E2E = "tests/e2e"
LOG = Path(".pytest-e2e.log")
STOP_GRACE_S = 60.0
# e2e tests that run in the second session (after its unit and integration tests: pytest keeps the argument order);
# $STARE_SUITE_BESIDE (node ids, comma-separated) sets them for one run.
BESIDE: tuple[str, ...] = ()


def beside_nodes() -> tuple[str, ...]:
    """``$STARE_SUITE_BESIDE``'s node ids when set (empty: none), else :data:`BESIDE`."""
    env = os.environ.get("STARE_SUITE_BESIDE")
    return BESIDE if env is None else tuple(n.strip() for n in env.split(",") if n.strip())


def session_args(tests: Path = Path("tests"), beside_ids: tuple[str, ...] | None = None) -> tuple[list[str], list[str]]:
    """The two sessions' test arguments: ``(e2e, rest)``.

    ``rest`` names every folder and ``test_*.py`` file under ``tests`` except ``tests/e2e`` (pytest's ``--ignore``
    would drop the ``BESIDE`` node ids as well), then the ``BESIDE`` node ids whose file exists; ``e2e`` is
    ``tests/e2e`` with those deselected. A ``BESIDE`` entry whose file is gone is left to the e2e session, so every
    test still runs exactly once. ``beside_ids``: those node ids (default :func:`beside_nodes`).
    """
    ids = beside_nodes() if beside_ids is None else beside_ids
    beside = [node for node in ids if (tests.parent / node.split("::")[0]).is_file()]
    rest = [
        str(p)
        for p in sorted(tests.iterdir())
        if p.name != Path(E2E).name
        and not p.name.startswith((".", "_"))
        and (p.is_dir() or (p.name.startswith("test_") and p.suffix == ".py"))
    ]
    e2e = [E2E, *(f"--deselect={node}" for node in beside)]
    return e2e, [*rest, *beside]


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _own_group_interrupted_with_parent() -> None:
    """In a session's process, before pytest starts: a process group of its own, so that a Ctrl-C (the terminal's
    SIGINT to the foreground group) or a ``kill -INT -- -<group>`` reaches the runner alone, which passes one SIGINT
    on; a second SIGINT while pytest tears down its fixtures interrupted that clean-up (the e2e runs' kills), and the
    run's Ray agents lived on for a minute. SIGINT also comes when the runner dies (``PR_SET_PDEATHSIG``: a
    ``kill -9`` of the runner or of its group), so the sessions always get pytest's clean-up."""
    import ctypes
    import os

    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the group of its own still holds
        pass


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
    e2e_args, rest_args = session_args()
    # Each session's tmp_path folders under a folder of this run's own: pytest's default /tmp/pytest-of-<user>/
    # keeps the 3 newest numbered folders, so any other pytest started on the machine meanwhile (a developer's
    # single test, a second checkout's make test) deleted a running session's tmp_path under it (a loaded run
    # failed so). --basetemp in argv wins.
    root = Path(tempfile.mkdtemp(prefix="stare-make-test-"))
    own = not any(a == "--basetemp" or a.startswith("--basetemp=") for a in argv)
    e2e_tmp, rest_tmp = ([f"--basetemp={root / 'e2e'}"], [f"--basetemp={root / 'rest'}"]) if own else ([], [])
    procs: list[subprocess.Popen] = []
    try:
        with open(LOG, "w") as log:
            procs.append(subprocess.Popen([*pytest, *argv, *e2e_tmp, *e2e_args], stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=_own_group_interrupted_with_parent))  # fmt: skip
            procs.append(subprocess.Popen([*pytest, *argv, *rest_tmp, *rest_args],
                                          preexec_fn=_own_group_interrupted_with_parent))  # fmt: skip
            rest = procs[1].wait()
            e2e = procs[0].wait()
    except KeyboardInterrupt:
        _stop(procs)
        print(f"make test: interrupted; the e2e session's output is in {LOG}", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n===== {E2E} (run beside the rest; {LOG}) =====", flush=True)
    print(LOG.read_text(errors="replace"), end="", flush=True)
    print(f"\n===== make test: {E2E} exit {e2e}, the rest exit {rest} =====", flush=True)
    return e2e or rest


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
