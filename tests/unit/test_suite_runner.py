"""``make test``'s runner (tests/support/suite.py): two pytest sessions side by side, every test run once, the
exit status the first non-zero of the two."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.suite import BESIDE, session_args


def _tree(root, e2e_ok: bool, rest_ok: bool):
    (root / "tests" / "e2e").mkdir(parents=True)
    (root / "tests" / "unit").mkdir()
    (root / "tests" / "e2e" / "test_x.py").write_text(f"def test_e2e_one():\n    assert {e2e_ok}\n")
    (root / "tests" / "unit" / "test_y.py").write_text(
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


def test_the_beside_e2e_case_runs_once_in_the_second_session(tmp_path):
    """The long-CoT case of ``BESIDE`` moves to the rest's session; its twin case stays in the e2e session."""
    _tree(tmp_path, True, True)
    (tmp_path / "tests" / "e2e" / "test_train_cot.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('family', ['shortcot', 'longcot'])\n"
        "def test_cot_cpu_default_run_writes_run_folder(family):\n    print('RAN', family)\n"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "tests.support.suite", "-v", "-p", "no:cacheprovider"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rest, e2e = out.stdout.split("===== tests/e2e")
    assert "3 passed" in rest and "2 passed" in e2e
    assert "[longcot] PASSED" in rest and "[longcot]" not in e2e
    assert "[shortcot] PASSED" in e2e and "[shortcot]" not in rest
    assert "1 deselected" in e2e


def test_session_args_split_the_real_tree_so_every_test_runs_once():
    e2e, rest = session_args(REPO / "tests")
    assert e2e[0] == "tests/e2e" and [a.removeprefix("--deselect=") for a in e2e[1:]] == list(BESIDE)
    assert rest[-len(BESIDE) :] == list(BESIDE)
    named = [Path(a).name for a in rest[: -len(BESIDE)]]
    assert "e2e" not in named and {"unit", "integration"} <= set(named)
    assert not any(n.startswith(("_", ".")) or n == "conftest.py" for n in named)
