"""A command's entry point run in the test's own process, as its ``python -m`` would run it: for tests of what a
command says and returns (options, dry runs, one-line errors, exit statuses), which need no process of their own
and so need not pay a fresh interpreter's imports (verl's alone takes seconds)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping

import pytest

from stare_verl.jobs.procs import TERMINATION_SIGNALS


def run_main(
    main: Callable[[list[str]], int | None],
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """``main(argv)`` with ``env`` added to the environment and ``cwd`` as the working directory for the call only
    (both restored after it, as are the handlers of :data:`TERMINATION_SIGNALS` the drivers install), its output
    read through ``capsys``.

    Returns:
        a ``CompletedProcess`` as ``subprocess.run(..., capture_output=True, text=True)`` gives for ``python -m``:
        ``returncode`` is what ``main`` returned (``None`` as 0) or the status of the ``SystemExit`` it raised
        (argparse's usage errors; a message is printed to stderr and is status 1), ``stdout`` / ``stderr`` what it printed (output printed before the call is
        dropped). Any other exception propagates (a subprocess would have printed a traceback and exited 1).
    """
    saved = {sig: signal.getsignal(sig) for sig in TERMINATION_SIGNALS}
    capsys.readouterr()
    with monkeypatch.context() as m:
        if cwd is not None:
            m.chdir(cwd)
        for key, value in (env or {}).items():
            m.setenv(key, value)
        try:
            rc = main(argv)
        except SystemExit as exit_:  # sys.exit(None | int | message): the status the interpreter makes of it
            rc = exit_.code
            if rc is not None and not isinstance(rc, int):
                print(rc, file=sys.stderr)
                rc = 1
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
    out, err = capsys.readouterr()
    if rc is None:
        rc = 0
    return subprocess.CompletedProcess(argv, rc, stdout=out, stderr=err)
