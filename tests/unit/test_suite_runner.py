"""``make test``'s runner (tests/support/suite.py): two pytest sessions side by side, every test run once, the
exit status the first non-zero of the two."""

import subprocess
import sys

import pytest

from tests.support import REPO


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
