"""Sandboxed execution of model-written Python (bubblewrap / unshare / subprocess / SandboxFusion HTTP).

Quick use::

    from envs.sandbox import run_code, make_sandbox, ExecLimits
    result = await run_code("print(1 + 1)", ExecLimits(timeout_s=5))
    result.stdout, result.exit_code, result.timed_out
"""

from .config import ExecLimits, ExecResult, RemoteConfig, SandboxConfig
from .local import LocalSandbox, PythonSession, SandboxUnavailable
from .remote import RemoteSandbox
from .runner import (
    Sandbox,
    default_sandbox,
    make_sandbox,
    probe_backend,
    probe_modules,
    report_modules,
    run_code,
)

__all__ = [
    "ExecLimits", "ExecResult", "LocalSandbox", "PythonSession", "RemoteConfig", "RemoteSandbox", "Sandbox",
    "SandboxConfig", "SandboxUnavailable", "default_sandbox", "make_sandbox", "probe_backend", "probe_modules",
    "report_modules", "run_code",
]
