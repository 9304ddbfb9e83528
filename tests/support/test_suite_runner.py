"""``make test``'s runner (tests/support/suite.py): two pytest sessions side by side, every test run once, the
exit status the first non-zero of the two."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stare_verl.jobs.procs import _alive
from tests.support import REPO
from tests.support.suite import BESIDE, session_args


def _tree(root, e2e_ok: bool, rest_ok: bool):
    (root / "tests" / "e2e").mkdir(parents=True)
    (root / "tests" / "envs").mkdir()
    (root / "tests" / "e2e" / "test_x.py").write_text(f"def test_e2e_one():\n    assert {e2e_ok}\n")
    (root / "tests" / "envs" / "test_y.py").write_text(
        f"def test_unit_one():\n    assert {rest_ok}\n\ndef test_unit_two():\n    assert True\n"
    )


@pytest.mark.parametrize(("e2e_ok", "rest_ok", "rc"), [(True, True, 0), (False, True, 1), (True, False, 1)])
def test_both_sessions_run_every_test_and_either_failure_fails(tmp_path, e2e_ok, rest_ok, rc):
    _tree(tmp_path, e2e_ok, rest_ok)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "tests.support.suite", "-q", "-p", "no:cacheprovider"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == rc, out.stdout + out.stderr
    text = out.stdout
    # the rest's session first (2 tests), then the e2e session's log (1 test), then the two exit statuses
    assert ("2 passed" if rest_ok else "1 failed, 1 passed") in text
    assert ("1 passed" if e2e_ok else "1 failed") in text.split("===== tests/e2e")[1]
    assert f"tests/e2e exit {0 if e2e_ok else 1}, the rest exit {0 if rest_ok else 1}" in text
    assert (tmp_path / ".pytest-e2e.log").read_text() in text


LONGCOT = "tests/e2e/test_train_cot.py::test_cot_cpu_default_run_writes_run_folder[longcot]"


def test_the_beside_e2e_case_runs_once_in_the_second_session(tmp_path):
    """An e2e case named beside (here through ``$STARE_SUITE_BESIDE``) moves to the rest's session; its twin case
    stays in the e2e session."""
    _tree(tmp_path, True, True)
    (tmp_path / "tests" / "e2e" / "test_train_cot.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('family', ['shortcot', 'longcot'])\n"
        "def test_cot_cpu_default_run_writes_run_folder(family):\n    print('RAN', family)\n"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "STARE_SUITE_BESIDE": LONGCOT}
    out = subprocess.run([sys.executable, "-m", "tests.support.suite", "-v", "-p", "no:cacheprovider"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rest, e2e = out.stdout.split("===== tests/e2e")
    assert "3 passed" in rest and "2 passed" in e2e
    assert "[longcot] PASSED" in rest and "[longcot]" not in e2e
    assert "[shortcot] PASSED" in e2e and "[shortcot]" not in rest
    assert "1 deselected" in e2e


@pytest.mark.parametrize("beside", [BESIDE, (LONGCOT,)])
def test_session_args_split_the_real_tree_so_every_test_runs_once(beside):
    e2e, rest = session_args(REPO / "tests", beside)
    assert e2e[0] == "tests/e2e" and [a.removeprefix("--deselect=") for a in e2e[1:]] == list(beside)
    assert rest[len(rest) - len(beside) :] == list(beside)
    named = [Path(a).name for a in rest[: len(rest) - len(beside)]]
    assert "e2e" not in named and {"envs", "stare_verl", "support"} <= set(named)
    assert not {"unit", "integration"} & set(named)  # the tier is a marker, the folder the package path
    assert not any(n.startswith(("_", ".")) or n == "conftest.py" for n in named)


_SLOW_TREE = """
import os, time, pytest
from pathlib import Path

@pytest.fixture
def held():
    Path(os.environ["MARK_DIR"], "started-" + os.environ.get("PYTEST_XDIST_WORKER", str(os.getpid()))).touch()
    yield
    with open(Path(os.environ["MARK_DIR"], "teardowns"), "a") as f:  # pytest's clean-up ran to its end
        f.write("down\\n")

def test_slow(held):
    time.sleep(60)
"""


def _slow_tree(root):
    for d in ("e2e", "envs"):
        (root / "tests" / d).mkdir(parents=True)
        (root / "tests" / d / f"test_{d}.py").write_text(_SLOW_TREE)


def _start(root, marks):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "MARK_DIR": str(marks)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.suite", "-q", "-p", "no:cacheprovider"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 120
    while len(list(marks.glob("started-*"))) < 2:
        assert time.time() < deadline and proc.poll() is None, "the two sessions did not start"
        time.sleep(0.2)
    return proc


@pytest.mark.parametrize("how", ["ctrl-c to the group", "kill -9 of the runner"])
def test_an_interrupt_stops_both_sessions_once_through_their_clean_up(tmp_path, how):
    """A Ctrl-C reaches the sessions once (no second KeyboardInterrupt in the middle of their fixtures' teardown),
    and a runner killed outright still leaves its sessions to clean up: both teardowns run, nothing is left."""
    _slow_tree(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = _start(tmp_path, marks)
    sessions = [int(p.name.split("-")[1]) for p in marks.glob("started-*")]
    if how == "ctrl-c to the group":
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the runner's whole (foreground) group
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out
        assert "During handling of the above exception" not in out, out
    else:
        proc.kill()
        proc.communicate(timeout=60)
    deadline = time.time() + 60
    while any(_alive(pid) for pid in sessions) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in sessions)
    assert (marks / "teardowns").read_text() == "down\n" * 2


def test_each_session_keeps_its_tmp_path_under_a_folder_of_its_own(tmp_path):
    """Another pytest started meanwhile (here: 4 of them, more than pytest's 3 kept numbered folders under the
    shared default base) does not delete a running session's tmp_path; the run's folder is gone afterwards."""
    _tree(tmp_path, True, True)
    (tmp_path / "tests" / "envs" / "test_y.py").write_text(
        "import subprocess, sys\n"
        "def test_tmp_path_survives_other_pytests(tmp_path, tmp_path_factory):\n"
        "    (tmp_path / 'mine').write_text('x')\n"
        "    base = tmp_path_factory.getbasetemp()\n"
        "    assert base.name == 'rest' and base.parent.name.startswith('stare-make-test-')\n"
        "    print('BASE', base.parent)\n"
        "    for _ in range(4):\n"
        "        subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'other'],\n"
        "                       capture_output=True, timeout=120)\n"
        "    assert (tmp_path / 'mine').read_text() == 'x'\n"
    )
    (tmp_path / "other").mkdir()  # a pytest of someone else's, with tmp_path under the default base
    (tmp_path / "other" / "test_o.py").write_text("def test_o(tmp_path):\n    (tmp_path / 'f').write_text('y')\n")
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "tests.support.suite", "-q", "-s", "-p", "no:cacheprovider"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    base = Path(next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("BASE")))
    assert not base.exists()
