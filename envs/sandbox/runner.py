"""Backend selection and the simple async entry point ``run_code``."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from .config import ExecLimits, ExecResult, SandboxConfig
from .interpreter import missing_modules_code, project_sandbox_python, resolve_python
from .local import LocalSandbox, SandboxUnavailable
from .remote import RemoteSandbox

logger = logging.getLogger(__name__)

Sandbox = LocalSandbox | RemoteSandbox
_PROBE_TIMEOUT_S = 20


def probe_backend(kind: str, config: SandboxConfig | None = None, separate_uids: bool = True) -> str | None:
    """Run ``print(1+1)`` through backend ``kind`` synchronously; return None if it works, else why not.

    Used once at start-up; takes tens of milliseconds when the backend works.
    """
    config = config or SandboxConfig()
    tool = {"bwrap": "bwrap", "unshare": "unshare", "subprocess": "timeout"}[kind]
    if shutil.which(tool) is None:
        return f"{tool} not found on PATH"
    sandbox = LocalSandbox(kind, config, separate_uids=separate_uids)
    uid = sandbox._uids.take()
    argv, kwargs, workdir = sandbox._launch_spec(config.limits, "cold", uid)
    try:
        proc = subprocess.run(argv, input=b"print(1+1)", capture_output=True, timeout=_PROBE_TIMEOUT_S,
                              start_new_session=True, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{kind} probe failed: {exc}"
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    if proc.returncode != 0 or proc.stdout != b"2\n":
        return f"{kind} probe failed (status {proc.returncode}): {proc.stderr.decode('utf-8', 'replace')[-300:]}"
    return None


def probe_modules(sandbox: LocalSandbox, modules: tuple[str, ...] | list[str]) -> list[str] | None:
    """The names of ``modules`` the sandbox's interpreter cannot import (checked inside the sandbox with
    ``importlib.util.find_spec``, synchronously, tens of milliseconds); None when the probe itself failed."""
    if not modules:
        return []
    uid = sandbox._uids.take()
    argv, kwargs, workdir = sandbox._launch_spec(sandbox.config.limits, "cold", uid)
    try:
        proc = subprocess.run(argv, input=missing_modules_code(modules).encode(), capture_output=True,
                              timeout=_PROBE_TIMEOUT_S, start_new_session=True, **kwargs)
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        sandbox._uids.give(uid)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "replace").split()


def report_modules(sandbox: LocalSandbox) -> list[str] | None:
    """Probe ``sandbox.config.expected_modules``, store the result as ``sandbox.missing_modules`` and warn
    (never raise) when some are missing, naming them, the interpreter and the fix. Returns the missing names."""
    missing = probe_modules(sandbox, sandbox.config.expected_modules)
    sandbox.missing_modules = missing
    if missing is None:
        logger.warning("sandbox: could not check which modules %s can import", sandbox.python)
    elif missing:
        hint = (
            "run `make sandbox-python` (it builds " + str(project_sandbox_python().parents[1]) + ")"
            if sandbox.config.python == "auto" else "point sandbox.python at an interpreter that has them"
        )
        logger.warning(
            "sandbox: the interpreter %s cannot import %s: model-written code that imports them fails with "
            "ModuleNotFoundError; %s, or set STARE_SANDBOX_PYTHON", sandbox.python, ", ".join(missing), hint,
        )
    else:
        logger.info("sandbox: interpreter %s has %s", sandbox.python, ", ".join(sandbox.config.expected_modules))
    return missing


def _working_local(kind: str, config: SandboxConfig) -> tuple[LocalSandbox | None, str]:
    reason = probe_backend(kind, config)
    if reason is None:
        return LocalSandbox(kind, config), ""
    if os.geteuid() == 0:  # e.g. unprivileged user namespaces disabled: launch as root, code still unprivileged
        if probe_backend(kind, config, separate_uids=False) is None:
            logger.warning("sandbox: %s works only without separate uids (RLIMIT_NPROC not applied): %s",
                           kind, reason)
            return LocalSandbox(kind, config, separate_uids=False), ""
    return None, reason


def make_sandbox(config: SandboxConfig | dict | None = None) -> Sandbox:
    """Build the sandbox backend named by ``config.backend`` (validated with pydantic).

    ``auto`` picks the first working of bwrap, unshare; then the plain subprocess backend only when
    ``allow_unsafe`` is set. A local backend then probes its interpreter for ``config.expected_modules`` and
    warns, naming the missing ones (``sandbox.missing_modules``; see ``report_modules``). Raises :class:`SandboxUnavailable` when the requested backend does not work
    here, when the subprocess backend (no network isolation) is asked for without ``allow_unsafe``, or when
    the interpreter ``config.python`` names does not exist.
    """
    if not isinstance(config, SandboxConfig):
        config = SandboxConfig.model_validate(config or {})
    if config.backend == "remote":
        return RemoteSandbox(config)
    if config.backend == "subprocess" and not config.allow_unsafe:
        raise SandboxUnavailable(
            "the subprocess backend is not network- or filesystem-isolated; set allow_unsafe=true to use it"
        )
    python = resolve_python(config.python)
    if not os.access(python, os.X_OK):
        raise SandboxUnavailable(f"the sandbox interpreter {python} (sandbox.python={config.python!r}) does not exist "
                                 "or is not executable")
    candidates = ["bwrap", "unshare"] if config.backend == "auto" else [config.backend]
    if config.backend == "auto" and config.allow_unsafe:
        candidates.append("subprocess")
    reasons = []
    for kind in candidates:
        sandbox, reason = _working_local(kind, config)
        if sandbox is not None:
            if kind == "subprocess":
                logger.warning("sandbox: using the subprocess backend: code is NOT network-isolated")
            report_modules(sandbox)
            return sandbox
        reasons.append(reason)
        logger.warning("sandbox: %s", reason)
    hint = "" if config.allow_unsafe else " (the unisolated subprocess backend needs allow_unsafe=true)"
    raise SandboxUnavailable("no sandbox backend works here: " + "; ".join(reasons) + hint)


_default: Sandbox | None = None


def default_sandbox() -> Sandbox:
    """The process-wide sandbox built from ``SandboxConfig()`` (bwrap or unshare), created on first use."""
    global _default
    if _default is None:
        _default = make_sandbox(SandboxConfig())
    return _default


async def run_code(code: str, limits: ExecLimits | dict | None = None, *, sandbox: Sandbox | None = None) -> ExecResult:
    """Run Python ``code`` once in a sandbox and return its :class:`ExecResult`.

    Args:
        code: the program text.
        limits: per-call :class:`ExecLimits` (or a dict of its fields); the sandbox's defaults if None.
        sandbox: a backend from :func:`make_sandbox`; the process-wide default one if None.
    """
    if isinstance(limits, dict):
        limits = ExecLimits.model_validate(limits)
    sandbox = sandbox or default_sandbox()
    return await sandbox.run(code, limits)
