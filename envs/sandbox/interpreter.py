"""Which Python runs model-written code in the sandbox, and which modules it has.

``SandboxConfig.python`` is an absolute path or ``"auto"`` (the default and the shipped tool config's value).
``"auto"`` means, in this order:

1. ``$STARE_SANDBOX_PYTHON`` (an absolute path), when set;
2. the project's sandbox interpreter ``<repo>/.venv-sandbox/bin/python`` (``make sandbox-python`` builds it:
   a virtualenv with numpy, sympy, scipy, mpmath and matplotlib, from ``envs/sandbox/requirements-sandbox.txt``);
3. ``/usr/bin/python3`` (the system Python: usually without the math stack; ``probe_modules`` reports it).

An interpreter inside a virtualenv (``pyvenv.cfg`` one level above its ``bin/``) has that virtualenv bound
read-only into the sandbox at the same path (``venv_root``); its base interpreter must be visible there too
(under ``/usr``, as ``make sandbox-python`` builds it).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MATH_MODULES", "SYSTEM_PYTHON", "missing_modules_code", "project_sandbox_python", "resolve_python",
           "venv_root"]

SYSTEM_PYTHON = "/usr/bin/python3"
MATH_MODULES = ("numpy", "sympy", "scipy", "mpmath", "matplotlib")
_ROOT = Path(__file__).resolve().parents[2]


def project_sandbox_python() -> Path:
    """Where ``make sandbox-python`` puts the sandbox interpreter (it may not exist)."""
    return _ROOT / ".venv-sandbox" / "bin" / "python"


def resolve_python(python: str) -> str:
    """The host path of the interpreter to run (see the module docstring); ``python`` is returned unchanged
    unless it is ``"auto"``. Never raises; the result may not exist (the sandbox probe then says so)."""
    if python != "auto":
        return python
    env = os.environ.get("STARE_SANDBOX_PYTHON", "").strip()
    if env.startswith("/"):
        return env
    venv = project_sandbox_python()
    if os.access(venv, os.X_OK):
        return str(venv)
    return SYSTEM_PYTHON


def venv_root(python: str) -> str | None:
    """The virtualenv directory holding ``python`` (``<venv>/bin/python`` with ``<venv>/pyvenv.cfg``), or None.
    Symlinks are not resolved: a venv's ``bin/python`` is usually a link to its base interpreter."""
    p = Path(os.path.abspath(python))
    root = p.parent.parent
    return str(root) if p.parent.name == "bin" and (root / "pyvenv.cfg").is_file() else None


def missing_modules_code(modules: tuple[str, ...] | list[str]) -> str:
    """A program that prints the names (one line, space-separated) of those of ``modules`` the interpreter
    cannot import, without importing them (``importlib.util.find_spec``: milliseconds)."""
    names = [m for m in modules if m.replace("_", "").replace(".", "").isalnum()]
    return (
        "import importlib.util as u\n"
        f"print(' '.join(m for m in {names!r} if u.find_spec(m) is None))\n"
    )
