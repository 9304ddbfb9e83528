"""The local evaluations' ``code_interpreter`` tool and the one deadline rule of their tool-call runner.

Both the demo's held-out evaluation (``stare_verl.jobs.demo.evaluate``) and the local-checkpoint evaluation
(``local``) run the real tool in this machine's sandbox with a wall-clock limit per program; the runner's own
deadline per call (``envs.tool_use.episode.ToolCallRunner``'s ``tool_timeout_s``) is that limit plus
``DEADLINE_MARGIN_S``, so the sandbox's limit always reports first (a timed-out program is the tool's answer, not a
call the loop gave up on).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

__all__ = ["DEADLINE_MARGIN_S", "loop_deadline_s", "sandbox_tool"]

DEADLINE_MARGIN_S = 5.0
"""Seconds the tool-call runner's deadline leaves the sandbox's own limit to report first."""


def loop_deadline_s(tool_timeout_s: float) -> float:
    """The tool-call runner's deadline for a sandbox limit of ``tool_timeout_s`` seconds per program."""
    return tool_timeout_s + DEADLINE_MARGIN_S


def sandbox_tool(timeout_s: float) -> Any:
    """The real ``code_interpreter`` tool (``envs.tools``, native sandbox) with a ``timeout_s`` wall-clock limit
    per program (CPU limit the same, at least 1 s). Close it with ``await tool.aclose()``.

    Raises:
        envs.sandbox.SandboxUnavailable: no sandbox backend works here.
    """
    from envs.tools.code_interpreter import CodeInterpreterTool

    with contextlib.redirect_stdout(io.StringIO()):  # verl's BaseTool prints its schema when built
        return CodeInterpreterTool({"type": "native", "sandbox": {"limits": {
            "timeout_s": timeout_s, "cpu_s": max(1, int(timeout_s))}}})
