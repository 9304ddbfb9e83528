"""``code_interpreter``: a verl ``BaseTool`` that runs model-written Python in the sandbox.

Tool config YAML (``multi_turn.tool_config_path``), see ``recipes/tool_use/tool_config.yaml``::

    tools:
      - class_name: envs.tools.code_interpreter.CodeInterpreterTool
        config: {type: native, sandbox: {backend: auto, limits: {timeout_s: 10}}, persistent_session: false}
        tool_schema: {...}   # optional; CODE_INTERPRETER_SCHEMA when omitted

The ``config`` dict is validated by :class:`CodeInterpreterConfig` (unknown keys raise). The text returned
to the model is short: the program's stdout, then (on failure) the last lines of its traceback, or a
one-line timeout / memory / signal notice, cut to at most ``max_observation_chars`` (marker included) by the
observation rule every tool-use path applies (``envs.tools.observation.cut_text``).
The step reward is always 0.0: the tool never scores the answer.
"""

from __future__ import annotations

import logging
import re
import signal
from typing import Any, Literal
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, model_validator
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from envs.sandbox import ExecResult, SandboxConfig, make_sandbox
from envs.tools.observation import cut_text
from envs.tools.schema import CODE_INTERPRETER_SCHEMA_JSON, TOOL_NAME  # noqa: F401  (TOOL_NAME re-exported)

logger = logging.getLogger(__name__)

CODE_INTERPRETER_SCHEMA = OpenAIFunctionToolSchema.model_validate(CODE_INTERPRETER_SCHEMA_JSON)


class CodeInterpreterConfig(BaseModel):
    """The tool's ``config`` section (validated; unknown keys raise)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["native"] = Field("native", description="verl's tool type; only 'native' exists")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    persistent_session: bool = Field(False, description="keep variables between the calls of one rollout")
    session_key: Literal["instance", "trajectory"] = Field(
        "instance",
        description=(
            "'instance': one session per tool instance id, closed in release() (for agent loops that "
            "create one instance per trajectory). 'trajectory': keyed by agent_data.request_id, which "
            "survives verl's ToolAgentLoop create/release around every call; closed by "
            "release_trajectory() or evicted (least recently used) beyond sandbox.max_sessions."
        ),
    )
    stderr_tail_lines: int = Field(8, ge=1, le=200, description="traceback lines shown on failure")
    max_observation_chars: int = Field(2000, ge=100, le=1 << 20)

    @model_validator(mode="after")
    def _check(self) -> CodeInterpreterConfig:
        if self.persistent_session and self.sandbox.backend == "remote":
            raise ValueError("persistent_session is not available with the remote backend")
        return self


_FENCE = re.compile(r"^```[^\n]*\n(.*?)(?:\n?```\s*)?$", re.S)


def strip_code_fence(code: str) -> str:
    """Return the code inside a markdown fence (```python ... ```) when ``code`` is wrapped in one;
    otherwise ``code`` unchanged. An unclosed opening fence is tolerated."""
    stripped = code.strip()
    if not stripped.startswith("```"):
        return code
    match = _FENCE.match(stripped)
    return match.group(1) if match else code


def _cut(text: str, max_chars: int) -> str:
    # the one observation rule (envs.tools.observation.cut_text): at most max_chars, marker included
    return cut_text(text, max_chars, "middle")


def _tail_lines(text: str, n: int) -> str:
    # 'File "<string>"' lines are the sandbox driver's frames in faulthandler dumps: noise for the model.
    lines = [line for line in text.rstrip().splitlines() if line.strip() and 'File "<string>"' not in line]
    return "\n".join(lines[-n:])


# An uncaught exception's report (the sandbox driver prints it with the model's frames named "<code>"; a
# SyntaxError has no "Traceback" header but names the line).
_EXCEPTION_REPORT_RE = re.compile(
    r'^[\s|+-]*(?:Exception Group )?Traceback \(most recent call last\):$|^[\s|]*File "<code>", line \d+', re.M
)  # an ExceptionGroup's report indents its parts with "|" and "+-


def _signal_name(number: int) -> str | None:
    """``SIGTERM`` for 15; None when ``number`` names no signal (status 128 + that is an ordinary exit)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def format_observation(result: ExecResult, stderr_tail_lines: int = 8, max_chars: int = 2000) -> str:
    """The concise text shown to the model for one :class:`ExecResult`.

    stdout first; then, when the program failed, the last ``stderr_tail_lines`` non-empty lines of
    stderr (the end of the traceback) or a notice for timeouts, memory and signals; ``(no output)`` when
    there is nothing to show. The whole is cut to at most ``max_chars`` (head and tail kept, marker between).

    A non-zero exit that is not an uncaught exception (``sys.exit(1)``, ``sys.exit("message")``,
    ``os._exit(3)``, a native library exiting) ends with ``The program exited with status N.``; a death by
    signal (a status of 128 + a signal number, as the shell reports it) with ``The program was killed by
    SIGNAME (exit status 128+N).`` An uncaught exception's traceback speaks for itself: the status line is
    left out only when the status is 1 (Python's for an uncaught exception) and the shown tail holds the
    exception report; a traceback printed earlier and handled, or one scrolled out of the tail, does not hide
    the status.
    """
    if result.sandbox_error:
        return _cut(f"Sandbox error: {result.sandbox_error}", max_chars)
    parts = []
    if result.session_restarted:
        parts.append("[session restarted: variables from earlier calls are lost]")
    if result.stdout.strip():
        parts.append(result.stdout.rstrip("\n"))
    err_tail = _tail_lines(result.stderr, stderr_tail_lines)
    if result.timed_out:
        if err_tail:
            parts.append(err_tail)
        parts.append(f"TimeoutError: the program was stopped after {result.duration_s:.1f} s (time limit).")
    elif result.exit_code != 0:
        if err_tail:
            parts.append(err_tail)
        if result.oom and "MemoryError" not in err_tail:
            parts.append("MemoryError: the program exceeded the memory limit.")
        status = result.exit_code
        name = _signal_name(status - 128) if status is not None and status > 128 else None
        if name is not None:
            notes = {"SIGSEGV": ", segmentation fault", "SIGXCPU": ", CPU time limit", "SIGPROF": ", CPU time limit"}
            parts.append(f"The program was killed by {name} (exit status {status}{notes.get(name, '')}).")
        elif status is not None and not (status == 1 and _EXCEPTION_REPORT_RE.search(err_tail)):
            parts.append(f"The program exited with status {status}.")
    elif err_tail:  # success with warnings: a short tail only
        parts.append(_tail_lines(result.stderr, min(3, stderr_tail_lines)))
    text = "\n".join(parts) if parts else "(no output)"
    return _cut(text, max_chars)


class CodeInterpreterTool(BaseTool):
    """Runs the ``code`` argument in the sandbox chosen at construction (see :mod:`envs.sandbox`).

    Raises :class:`envs.sandbox.SandboxUnavailable` at construction when no allowed backend works, and
    pydantic's ``ValidationError`` for a bad config. ``execute`` never raises for anything the code does.
    """

    def __init__(self, config: dict | None, tool_schema: OpenAIFunctionToolSchema | None = None):
        self.cfg = CodeInterpreterConfig.model_validate(config or {})
        super().__init__(config or {"type": "native"}, tool_schema or CODE_INTERPRETER_SCHEMA)
        self.sandbox = make_sandbox(self.cfg.sandbox)
        self._instances: set[str] = set()
        logger.info("code_interpreter: sandbox backend %s", self.sandbox.name)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    @property
    def max_concurrent_calls(self) -> int | None:
        """Programs the sandbox runs at once (its ``max_concurrency``; a remote service's for ``remote``), which
        ``envs.tool_use.episode.ToolCallRunner`` admits before a call's deadline starts, so a call waiting for a
        free slot is not timed out; None for persistent sessions (each has its own interpreter, no shared slots)."""
        if self.cfg.persistent_session:
            return None
        remote = getattr(self.sandbox, "remote", None)
        return remote.max_concurrency if remote is not None else self.sandbox.config.max_concurrency

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instances.add(instance_id)
        return instance_id, ToolResponse()

    def _session_key(self, instance_id: str, kwargs: dict) -> str:
        if self.cfg.session_key == "trajectory":
            agent_data = kwargs.get("agent_data")
            request_id = getattr(agent_data, "request_id", None)
            if request_id:
                return f"trajectory:{request_id}"
        return f"instance:{instance_id}"

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run ``parameters["code"]``; return (observation, 0.0, metrics).

        metrics: ``exit_code`` (int, -1 when none), ``timed_out``, ``oom``, ``truncated`` (bools),
        ``duration_s`` (float, wall clock).
        """
        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: the 'code' argument must be a non-empty string."), 0.0, {}
        code = strip_code_fence(code)
        if self.cfg.persistent_session:
            result = await self.sandbox.run_in_session(self._session_key(instance_id, kwargs), code)
        else:
            result = await self.sandbox.run(code)
        text = format_observation(result, self.cfg.stderr_tail_lines, self.cfg.max_observation_chars)
        metrics = {
            "exit_code": -1 if result.exit_code is None else result.exit_code,
            "timed_out": result.timed_out,
            "oom": result.oom,
            "truncated": result.truncated,
            "duration_s": result.duration_s,
        }
        return ToolResponse(text=text), 0.0, metrics

    async def release(self, instance_id: str, **kwargs) -> None:
        """Forget the instance; with ``session_key='instance'`` its session is closed too."""
        self._instances.discard(instance_id)
        if self.cfg.persistent_session and self.cfg.session_key == "instance":
            await self.sandbox.close_session(f"instance:{instance_id}")

    async def release_trajectory(self, request_id: str) -> None:
        """Close the session of one trajectory (``session_key='trajectory'``); no-op when there is none."""
        if self.cfg.persistent_session:
            await self.sandbox.close_session(f"trajectory:{request_id}")

    async def aclose(self) -> None:
        """Close every session and client of the sandbox."""
        await self.sandbox.aclose()
