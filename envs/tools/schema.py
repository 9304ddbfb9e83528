"""The ``code_interpreter`` tool's name, OpenAI function schema and hermes call text, as plain data.

Importing this module imports nothing heavy (no verl), so dataset builders and the CPU demo can use the
schema; ``envs.tools.code_interpreter.CODE_INTERPRETER_SCHEMA`` is the same schema validated as verl's
``OpenAIFunctionToolSchema``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CODE_INTERPRETER_SCHEMA_JSON", "TOOL_NAME", "tool_call_text"]

TOOL_NAME = "code_interpreter"

# The schema as verl's agent loop passes it to the chat template
# (``CODE_INTERPRETER_SCHEMA.model_dump(exclude_unset=True, exclude_none=True)`` gives this dict back).
CODE_INTERPRETER_SCHEMA_JSON: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Run a Python 3 program in a fresh sandbox (no network, no input, limited time and memory) "
            "and return what it prints. Use print() to see results."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}


def tool_call_text(code: str, name: str = TOOL_NAME) -> str:
    """The hermes text of one well-formed tool call running ``code``, as the project's chat templates
    render an assistant message's ``tool_calls``:
    ``<tool_call>{"name": ..., "arguments": {"code": ...}}</tool_call>``."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"code": code}}) + "</tool_call>"
