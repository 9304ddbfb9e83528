"""The CPU default's problems and tool-use demonstrations under one name, for the tests.

They live with the families (``stare_verl.jobs.families``): problems, splits and rows in ``families.problems``, the
tool-use task table and demonstrations in ``families.tooluse``. This module names them for the tests.
"""

from __future__ import annotations

from envs.contract import AGENT_NAME
from stare_verl.jobs.families.problems import (
    DATA_SOURCE_PREFIX,
    SPLIT_SEED_OFFSET,
    DemoError,
    Problem,
    heldout_problems,
    problem_row,
    problems_to_json,
    sample_problems,
    split_problems,
    task_table,
    write_rl_parquet,
)
from stare_verl.jobs.families.tooluse import (
    CODE_INTERPRETER_SCHEMA,
    TASKS,
    TOOL_NAME,
    Demo,
    build_demos,
    format_observation,
    run_prints,
    tool_call_text,
)

__all__ = [
    "AGENT_NAME",
    "CODE_INTERPRETER_SCHEMA",
    "DATA_SOURCE_PREFIX",
    "SPLIT_SEED_OFFSET",
    "TASKS",
    "TOOL_NAME",
    "Demo",
    "DemoError",
    "Problem",
    "build_demos",
    "format_observation",
    "heldout_problems",
    "problem_row",
    "problems_to_json",
    "run_prints",
    "sample_problems",
    "split_problems",
    "task_table",
    "tool_call_text",
    "write_rl_parquet",
]
