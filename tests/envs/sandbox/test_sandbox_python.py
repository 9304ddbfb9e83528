"""Issue 14.6: the sandbox runs model-written code with an interpreter that has the math stack (numpy, sympy,
scipy, mpmath, matplotlib), bound read-only; matplotlib draws headless; the start-up probe names missing modules
and never crashes."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from envs.sandbox import SandboxConfig, SandboxUnavailable, make_sandbox, probe_backend
from envs.sandbox import interpreter as interp
from envs.sandbox.local import SANDBOX_ENV
from tests.support import REPO

pytestmark = pytest.mark.integration

VENV_PY = interp.project_sandbox_python()
needs_venv = pytest.mark.skipif(not VENV_PY.exists(), reason="no .venv-sandbox: run `make sandbox-python`")
BACKENDS = [k for k in ("bwrap", "unshare") if probe_backend(k, SandboxConfig(python=interp.SYSTEM_PYTHON)) is None]
YAML = REPO / "recipes" / "tool_use" / "tool_config.yaml"


def _run(sb, code: str):
    async def go():
        try:
            return await sb.run(code)
        finally:
            await sb.aclose()

    return asyncio.run(go())


def test_auto_resolution_order(monkeypatch, tmp_path):
    monkeypatch.delenv("STARE_SANDBOX_PYTHON", raising=False)
    assert interp.resolve_python("/opt/py/bin/python3") == "/opt/py/bin/python3"  # explicit wins
    expected = str(VENV_PY) if VENV_PY.exists() else interp.SYSTEM_PYTHON
    assert interp.resolve_python("auto") == expected
    monkeypatch.setenv("STARE_SANDBOX_PYTHON", "/somewhere/bin/python")
    assert interp.resolve_python("auto") == "/somewhere/bin/python"
    monkeypatch.setenv("STARE_SANDBOX_PYTHON", "relative/python")  # not absolute: ignored
    assert interp.resolve_python("auto") == expected
    monkeypatch.setattr(interp, "project_sandbox_python", lambda: tmp_path / "none" / "bin" / "python")
    assert interp.resolve_python("auto") == interp.SYSTEM_PYTHON


def test_venv_root_detection(tmp_path):
    (tmp_path / "v" / "bin").mkdir(parents=True)
    (tmp_path / "v" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert interp.venv_root(str(tmp_path / "v" / "bin" / "python")) == str(tmp_path / "v")
    assert interp.venv_root("/usr/bin/python3") is None
    assert interp.venv_root(str(tmp_path / "python")) is None


def test_config_accepts_auto_or_absolute_paths_only():
    assert SandboxConfig().python == "auto"
    assert SandboxConfig(python="/usr/bin/python3").python == "/usr/bin/python3"
    with pytest.raises(ValueError, match="'auto' or an absolute path"):
        SandboxConfig(python="python3")


def test_a_missing_interpreter_is_a_clear_error_not_a_probe_failure():
    with pytest.raises(SandboxUnavailable, match="interpreter /no/such/python .*does not exist"):
        make_sandbox(SandboxConfig(python="/no/such/python"))


@pytest.mark.skipif(not BACKENDS, reason="no isolated backend here")
def test_the_probe_names_missing_modules_and_warns(caplog):
    cfg = SandboxConfig(python=interp.SYSTEM_PYTHON, expected_modules=("json", "no_such_module_xyz", "numpy_nope"))
    with caplog.at_level(logging.WARNING, logger="envs.sandbox.runner"):
        sb = make_sandbox(cfg)
    assert sb.missing_modules == ["no_such_module_xyz", "numpy_nope"]
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "cannot import no_such_module_xyz, numpy_nope" in msg and interp.SYSTEM_PYTHON in msg
    assert "point sandbox.python at an interpreter" in msg
    # nothing expected: nothing probed, nothing missing
    assert make_sandbox(SandboxConfig(python=interp.SYSTEM_PYTHON, expected_modules=())).missing_modules == []


@needs_venv
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sandbox_interpreter_has_the_math_stack(backend, caplog):
    with caplog.at_level(logging.WARNING, logger="envs.sandbox.runner"):
        sb = make_sandbox(SandboxConfig(backend=backend))
    assert sb.python == str(VENV_PY) and sb.venv == str(VENV_PY.parents[1]) and sb.missing_modules == []
    assert not [r for r in caplog.records if "cannot import" in r.getMessage()]
    code = (
        "import numpy as np, sympy as sp, scipy.optimize as so, mpmath\n"
        "x = sp.symbols('x')\n"
        "print(np.linalg.det(np.array([[2.0, 1.0], [1.0, 3.0]])).round(6), sp.factor(x**2 - 1),\n"
        "      round(so.brentq(lambda t: t * t - 2, 0, 2), 6), mpmath.mpf(1) / 3)\n"
    )
    r = _run(sb, code)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split() == ["5.0", "(x", "-", "1)*(x", "+", "1)", "1.414214", "0.333333333333333"]


@needs_venv
@pytest.mark.parametrize("backend", BACKENDS)
def test_matplotlib_is_headless_and_show_returns(backend):
    sb = make_sandbox(SandboxConfig(backend=backend))
    code = (
        "import os, matplotlib, matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9]); plt.savefig('plot.png'); plt.show()\n"
        "print(matplotlib.get_backend(), os.path.getsize('plot.png') > 1000)\n"
    )
    t0 = time.monotonic()
    r = _run(sb, code)
    assert r.exit_code == 0 and not r.timed_out, r.stderr
    assert r.stdout.lower().split() == ["agg", "true"] and time.monotonic() - t0 < 30
    assert "Fontconfig error" not in r.stderr


@needs_venv
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sandbox_interpreter_is_read_only_and_its_threads_are_bounded(backend):
    sb = make_sandbox(SandboxConfig(backend=backend))
    code = (
        "import os, sys\n"
        "try:\n"
        "    open(os.path.join(sys.prefix, 'planted.py'), 'w')\n"
        "    print('writable')\n"
        "except OSError as e:\n"
        "    print('errno', e.errno)\n"
        "print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['MPLBACKEND'])\n"
        "print(sorted(os.listdir(os.path.dirname(sys.prefix))))\n"
    )
    r = _run(sb, code)
    lines = r.stdout.splitlines()
    assert lines[0] in ("errno 30", "errno 13") and lines[1] == "1 Agg", r.stdout + r.stderr
    assert lines[2] == "['.venv-sandbox']"  # the project around it stays hidden
    assert not (VENV_PY.parents[1] / "planted.py").exists()
    assert SANDBOX_ENV["OMP_NUM_THREADS"] == "1"


@needs_venv
def test_the_shipped_tool_config_uses_the_sandbox_interpreter():
    from verl.tools.tool_registry import initialize_tools_from_config

    (tool,) = initialize_tools_from_config(str(YAML))
    assert tool.cfg.sandbox.python == "auto" and tool.sandbox.python == str(VENV_PY)
    assert tool.sandbox.missing_modules == []

    async def go():
        iid, _ = await tool.create()
        try:
            return await tool.execute(iid, {"code": "import sympy\nprint(sympy.Rational(1, 3) + sympy.Rational(1, 6))"})
        finally:
            await tool.release(iid)
            await tool.aclose()

    resp, _, metrics = asyncio.run(go())
    assert resp.text == "1/2" and metrics["exit_code"] == 0


@pytest.fixture
def tmp_root():
    """A world-readable folder directly under /tmp, as a clone there would be (pytest's tmp_path is 0700, which
    the sandbox's unprivileged uid cannot enter)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="stare-sbx-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sandbox_interpreter_under_tmp_runs_read_only(backend, tmp_root):
    """A project cloned under /tmp (CI's clones may be) has its .venv-sandbox there too: the sandbox's private
    /tmp must not hide it, and the rest of the host's /tmp stays invisible."""
    import subprocess

    tmp_path = tmp_root
    venv = tmp_path / "clone" / ".venv-sandbox"
    subprocess.run([interp.SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (tmp_path / "host-secret.txt").write_text("x")
    sb = make_sandbox(SandboxConfig(backend=backend, python=str(venv / "bin" / "python")))
    code = (
        "import os, sys\n"
        "print(sys.prefix)\n"
        "try:\n"
        "    open(os.path.join(sys.prefix, 'planted.py'), 'w'); print('writable')\n"
        "except OSError as e:\n"
        "    print('errno', e.errno)\n"
        f"print(os.path.exists({str(tmp_path / 'host-secret.txt')!r}))\n"
        "open('/tmp/scratch.txt', 'w').write('ok'); print(open('/tmp/scratch.txt').read())\n"
    )
    r = _run(sb, code)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert r.stdout.split() == [str(venv), "errno", r.stdout.split()[2], "False", "ok"], r.stdout
    assert r.stdout.split()[2] in ("30", "13")
    assert not (venv / "planted.py").exists() and not (tmp_path / "scratch.txt").exists()
