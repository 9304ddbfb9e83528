"""The ``code_interpreter`` verl tool: built from the tool config YAML by verl's own loader, concise
observations, fence tolerance, optional persistent sessions, config validation."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from pydantic import ValidationError
from verl.tools.schemas import ToolResponse
from verl.tools.tool_registry import initialize_tools_from_config

from envs.sandbox import ExecResult
from envs.tools.code_interpreter import (
    CodeInterpreterConfig,
    CodeInterpreterTool,
    format_observation,
    strip_code_fence,
)
from tests.support import REPO

pytestmark = pytest.mark.integration

YAML = REPO / "recipes" / "tool_use" / "tool_config.yaml"


def _tool(**config) -> CodeInterpreterTool:
    base = {"type": "native", "sandbox": {"limits": {"timeout_s": 5}}}  # calls that must finish do under load
    base.update(config)
    return CodeInterpreterTool(base, None)


async def _call(tool: CodeInterpreterTool, *codes: str, **kw) -> list[tuple[ToolResponse, float, dict]]:
    instance_id, created = await tool.create()
    assert created.is_empty()
    try:
        return [await tool.execute(instance_id, {"code": c}, **kw) for c in codes]
    finally:
        await tool.release(instance_id)


def test_verl_builds_the_tool_from_the_yaml():
    (tool,) = initialize_tools_from_config(str(YAML))
    assert isinstance(tool, CodeInterpreterTool) and tool.name == "code_interpreter"
    fn = tool.get_openai_tool_schema().function
    assert fn.parameters.required == ["code"] and fn.parameters.properties["code"].type == "string"
    assert list(fn.parameters.properties) == ["code"]
    assert tool.sandbox.network_isolated and tool.cfg.persistent_session is False
    section = OmegaConf.to_container(OmegaConf.load(YAML).tools[0].config)
    assert CodeInterpreterConfig.model_validate(section).sandbox.limits.timeout_s == 10
    ((resp, reward, metrics),) = asyncio.run(_call(tool, "print(2 ** 10)"))
    assert resp.text == "1024" and reward == 0.0 and metrics["exit_code"] == 0


def test_observation_is_concise_and_fences_are_tolerated():
    tool = _tool()
    fenced, err, timeout, silent, bad = asyncio.run(_call(
        tool,
        "```python\nprint(6 * 7)\n```",
        "def f():\n    return 1 / 0\n\nprint('before')\nf()",
        "import time; time.sleep(30)",
        "x = 1",
        "print(1",
    ))
    assert fenced[0].text == "42"
    text = err[0].text
    assert text.startswith("before\n") and text.endswith("ZeroDivisionError: division by zero")
    assert "_driver" not in text and len(text.splitlines()) <= 1 + 8
    assert timeout[0].text.startswith("TimeoutError") and timeout[2]["timed_out"] is True
    assert silent[0].text == "(no output)"
    assert "SyntaxError" in bad[0].text


def test_bad_arguments_give_an_error_text_not_an_exception():
    tool = _tool()

    async def go():
        iid, _ = await tool.create()
        out = [await tool.execute(iid, p) for p in ({}, {"code": 3}, {"code": "   "}, {"cmd": "print(1)"})]
        await tool.release(iid)
        return out

    for resp, reward, _ in asyncio.run(go()):
        assert resp.text.startswith("Error: the 'code' argument") and reward == 0.0


def test_persistent_session_per_instance_is_off_by_default_and_released():
    off = asyncio.run(_call(_tool(), "x = 5", "print(x)"))
    assert "NameError" in off[1][0].text

    tool = _tool(persistent_session=True)
    on = asyncio.run(_call(tool, "x = 5", "print(x * 2)"))
    assert on[1][0].text == "10"
    assert tool.sandbox.session_keys == []  # release() closed it


def test_persistent_session_per_trajectory_survives_create_release_per_call():
    tool = _tool(persistent_session=True, session_key="trajectory")
    traj_a, traj_b = SimpleNamespace(request_id="req-a"), SimpleNamespace(request_id="req-b")

    async def go():
        # verl's ToolAgentLoop: create -> execute -> release around every single call
        await _call(tool, "total = 40", agent_data=traj_a)
        await _call(tool, "total = 0", agent_data=traj_b)
        (a,) = await _call(tool, "total += 2; print(total)", agent_data=traj_a)
        keys = sorted(tool.sandbox.session_keys)
        await tool.release_trajectory("req-a")
        await tool.release_trajectory("req-b")
        return a, keys, tool.sandbox.session_keys

    a, keys, after = asyncio.run(go())
    assert a[0].text == "42" and keys == ["trajectory:req-a", "trajectory:req-b"] and after == []


@pytest.mark.parametrize(
    "config",
    [
        {"type": "mcp"},
        {"type": "native", "sandbox": {"limits": {"timeout_s": -1}}},
        {"type": "native", "persistent": True},
        {"type": "native", "persistent_session": True, "sandbox": {"backend": "remote", "remote": {"url": "http://x"}}},
    ],
)
def test_bad_tool_config_is_rejected(config):
    with pytest.raises(ValidationError):
        CodeInterpreterTool(config, None)


def test_strip_code_fence():
    assert strip_code_fence("```python\na = 1\nprint(a)\n```") == "a = 1\nprint(a)"
    assert strip_code_fence("```py\nprint(1)\n```\n") == "print(1)"
    assert strip_code_fence("```\nprint(1)") == "print(1)"  # unclosed
    assert strip_code_fence("print('```')") == "print('```')"  # a fence inside code is left alone
    assert strip_code_fence("x = 1") == "x = 1"


def test_format_observation_cases():
    tb = "Traceback (most recent call last):\n" + "".join(f'  File "<code>", line {i}\n' for i in range(20))
    failed = ExecResult(stdout="partial\n", stderr=tb + "ValueError: bad\n", exit_code=1)
    text = format_observation(failed, stderr_tail_lines=3)
    assert text == 'partial\n  File "<code>", line 18\n  File "<code>", line 19\nValueError: bad'
    oom = ExecResult(stderr="", exit_code=1, oom=True)
    assert "MemoryError" in format_observation(oom)
    assert "SIGXCPU" in format_observation(ExecResult(exit_code=128 + 24))
    assert "segmentation fault" in format_observation(ExecResult(exit_code=128 + 11))
    assert format_observation(ExecResult(sandbox_error="down")) == "Sandbox error: down"
    long = format_observation(ExecResult(stdout="z" * 5000, exit_code=0), max_chars=200)
    assert len(long) == 200 and "...(truncated)..." in long  # the one observation rule: marker included
    warn = ExecResult(stdout="1\n", stderr="a\nb\nc\nd\nUserWarning: w\n", exit_code=0)
    assert format_observation(warn) == "1\nc\nd\nUserWarning: w"
    restarted = ExecResult(stdout="ok\n", exit_code=0, session_restarted=True)
    assert format_observation(restarted).startswith("[session restarted")


def test_verl_tool_agent_loop_call_path_with_trajectory_sessions():
    # ToolAgentLoop._call_tool is verl's real per-call path: parse JSON arguments, create, execute with
    # agent_data=..., release, truncate to max_tool_response_length. Driven here without a model server.
    import json

    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.experimental.agent_loop.tool_parser import FunctionCall

    (tool,) = initialize_tools_from_config(str(YAML))
    tool.cfg = tool.cfg.model_copy(update={"persistent_session": True, "session_key": "trajectory"})
    loop = SimpleNamespace(tools={tool.name: tool}, max_tool_response_length=256, tool_response_truncate_side="right")
    agent_data = SimpleNamespace(request_id="traj-1")

    def call(code: str):
        fc = FunctionCall(name="code_interpreter", arguments=json.dumps({"code": code}))
        return ToolAgentLoop._call_tool(loop, fc, {}, agent_data)

    async def go():
        first = await call("```python\nacc = [1, 2]\nprint(len(acc))\n```")
        second = await call("acc.append(3); print(sum(acc))")
        flood = await call("print('w' * 5000)")
        await tool.release_trajectory("traj-1")
        return first, second, flood

    first, second, flood = asyncio.run(go())
    assert first[0].text == "2" and second[0].text == "6" and second[1] == 0.0
    assert len(flood[0].text) <= 256 + len("...(truncated)") and flood[0].text.endswith("...(truncated)")
    assert tool.sandbox.session_keys == []


# Issue 14.7: a non-zero exit without a traceback is shown with its exit status (cold calls and sessions).
_EXITS = [
    ("import sys\nprint('checked')\nsys.exit(1)", "checked\nThe program exited with status 1."),
    ("import sys\nsys.exit(3)", "The program exited with status 3."),
    ("import sys\nsys.exit('no solution found')", "no solution found\nThe program exited with status 1."),
    ("import os\nprint('partial', flush=True)\nos._exit(1)", "partial\nThe program exited with status 1."),
    ("import ctypes\nctypes.CDLL(None).exit(2)", "The program exited with status 2."),  # a native library exits
    ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", "The program was killed by SIGTERM (exit status 143)."),
    ("import os\nos.abort()", "The program was killed by SIGABRT (exit status 134)."),
    # a traceback printed and handled does not hide a later exit's status (in the tail or scrolled out of it)
    ("import sys, traceback\ntry:\n    1/0\nexcept Exception:\n    traceback.print_exc()\nsys.exit(2)",
     "ZeroDivisionError: division by zero\nThe program exited with status 2."),
    ("import sys, traceback\ntry:\n    1/0\nexcept Exception:\n    traceback.print_exc()\n"
     "for i in range(12):\n    print('warn', i, file=sys.stderr)\nsys.exit(4)", "warn 11\nThe program exited with status 4."),
    ("import sys\nprint('Traceback (most recent call last):', file=sys.stderr)\nfor i in range(9):\n"
     "    print('w', i, file=sys.stderr)\nsys.exit(1)", "w 8\nThe program exited with status 1."),
]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_failed_run_says_so_with_its_exit_status(persistent):
    tool = _tool(persistent_session=persistent)
    codes = [c for c, _ in _EXITS] + ["import sys\nsys.exit(0)", "raise SystemExit", "raise ValueError('bad')", "print(1"]
    results = asyncio.run(_call(tool, *codes))
    for (code, expected), (resp, _, metrics) in zip(_EXITS, results, strict=False):
        assert resp.text.endswith(expected), (code, resp.text)
        assert metrics["exit_code"] == int(expected.rstrip(").").split()[-1]), code
    clean0, clean_none, raised, syntax = (r[0].text for r in results[len(_EXITS):])
    assert "status" not in clean0 and "status" not in clean_none  # exit status 0 is no failure
    if not persistent:  # (a session was restarted by the os.abort() before: the next call says so)
        assert clean0 == "(no output)" and clean_none == "(no output)"
    assert raised.endswith("ValueError: bad") and "status" not in raised  # the traceback speaks for itself
    assert "SyntaxError" in syntax and "status" not in syntax
    asyncio.run(tool.aclose())


def test_exit_status_formatting_without_a_sandbox():
    assert format_observation(ExecResult(exit_code=1)) == "The program exited with status 1."
    assert format_observation(ExecResult(stdout="4\n", stderr="fatal: lapack\n", exit_code=255)) == (
        "4\nfatal: lapack\nThe program exited with status 255."
    )
    tb = 'Traceback (most recent call last):\n  File "<code>", line 1, in <module>\nKeyError: 3\n'
    assert format_observation(ExecResult(stderr=tb, exit_code=1)).endswith("KeyError: 3")
    # an uncaught ExceptionGroup's report (parts indented with "|" and "+-") speaks for itself too
    eg = ("  + Exception Group Traceback (most recent call last):\n  |   File \"<code>\", line 1, in <module>\n"
          "  | ExceptionGroup: eg (1 sub-exception)\n  +-+---------------- 1 ----------------\n"
          "    | ValueError: x\n    +------------------------------------\n")
    assert "status" not in format_observation(ExecResult(stderr=eg, exit_code=1))
    # ... but a report scrolled out of the shown tail, or a status other than 1, does not hide the exit
    assert format_observation(ExecResult(stderr=tb + "w\n" * 9, exit_code=1)).endswith("exited with status 1.")
    assert format_observation(ExecResult(stderr=tb, exit_code=3)).endswith("exited with status 3.")
    assert format_observation(ExecResult(exit_code=128 + 9)) == "The program was killed by SIGKILL (exit status 137)."
    assert format_observation(ExecResult(exit_code=200)) == "The program exited with status 200."  # no signal 72
    assert format_observation(ExecResult(exit_code=0)) == "(no output)"
