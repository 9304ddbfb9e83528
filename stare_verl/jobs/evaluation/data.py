"""The problems of an evaluation: a verl RLHF dataset read and checked (:func:`load_problems`).

Data: a verl RLHF parquet written by the project (``envs.datasets`` / ``envs.tool_use.task`` /
``stare_verl.jobs.demo``): ``prompt`` (chat messages), ``data_source``, ``reward_model.ground_truth``,
``extra_info``; :func:`load_problems` checks the schema and says what is wrong. A row is a tool-use problem when its
``agent_name`` is ``stare_tool_agent``, its ``extra_info.family`` a tool family or it has ``tools_kwargs``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envs.contract import AGENT_NAME
from envs.families import is_tool_family
from stare_verl.jobs.evaluation.episode import EvalProblem

__all__ = ["DatasetError", "load_problems"]


class DatasetError(ValueError):
    """The data file is missing, unreadable, or not a verl RLHF dataset the evaluation can use."""


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.is_dir():
        raise DatasetError(f"data file {path} is a folder: give the .parquet (or .jsonl) file in it")
    if not path.is_file():
        raise DatasetError(
            f"data file {path} does not exist (build one with `python -m envs.datasets ...` or "
            "`python -m envs.tool_use.task ...`)"
        )
    try:
        if path.suffix in (".jsonl", ".json"):
            rows = []
            with path.open() as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line.rstrip("\r\n"))  # a column past the text, not "line 2"
                    except json.JSONDecodeError as err:  # the file's line, not the position inside the row
                        raise DatasetError(f"cannot read {path} as JSONL: line {number}: {err.msg} (column "
                                           f"{err.colno})") from err  # fmt: skip
                    if not isinstance(row, dict):
                        raise DatasetError(f"cannot read {path} as JSONL: line {number} is a JSON "
                                           f"{type(row).__name__}, not an object (one problem per line)")  # fmt: skip
                    rows.append(row)
            return rows
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    except DatasetError:
        raise
    except Exception as err:  # noqa: BLE001 - any reader failure: one clear message
        if path.suffix in (".jsonl", ".json", ".parquet"):
            kind = "JSONL" if path.suffix != ".parquet" else "parquet"
            raise DatasetError(f"cannot read {path} as {kind}: {type(err).__name__}: {err}") from err
        suffix = path.suffix or "no suffix"
        raise DatasetError(f"cannot read {path}: a data file is .parquet, .jsonl or .json, and this one ({suffix}) "
                           "is not readable as parquet either") from err  # fmt: skip


def load_problems(path: str | Path, limit: int | None = None, tools: str = "auto") -> list[EvalProblem]:
    """Read and check a verl RLHF dataset (.parquet, or .jsonl with the same fields).

    Args:
        path: the file.
        limit: keep the first ``limit`` rows.
        tools: see ``EvalSettings.tools``.
    Returns:
        the problems, in file order.
    Raises:
        DatasetError: missing/unreadable file, missing columns (``prompt``, ``data_source``,
            ``reward_model.ground_truth``), a prompt that is not a list of {role, content} messages with a user
            message, an empty ground truth, or no rows. The message names the first bad rows.
    """
    path = Path(path)
    rows = _read_rows(path)
    if not rows:
        raise DatasetError(f"{path} has no rows")
    need = ("prompt", "data_source", "reward_model")
    missing = [c for c in need if c not in rows[0]]
    if missing:
        raise DatasetError(
            f"{path} is not a verl RLHF dataset: missing column(s) {missing} (has {sorted(rows[0])}). Expected "
            "prompt (chat messages), data_source, reward_model.ground_truth, extra_info, as written by "
            "envs.datasets / envs.tool_use.task."
        )
    if limit is not None:
        rows = rows[: max(0, int(limit))]
    problems: list[EvalProblem] = []
    bad: list[str] = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        gt = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
        ok_prompt = (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in prompt)
            and any(m.get("role") == "user" for m in prompt)
        )
        if not ok_prompt:
            bad.append(f"row {i}: prompt is not a list of {{role, content}} messages with a user message")
            continue
        if gt is None or (isinstance(gt, str) and not gt.strip()) or (isinstance(gt, list) and not gt):
            bad.append(f"row {i}: no reward_model.ground_truth")
            continue
        extra = row.get("extra_info")
        if extra is not None and not isinstance(extra, dict):
            bad.append(f"row {i}: extra_info is a {type(extra).__name__}, not a mapping")
            continue
        info = dict(extra or {})
        src = str(row.get("data_source") or "")
        if info.get("index") is not None:
            pid = f"{src}/{info.get('split', '')}/{info['index']}"
        else:
            pid = f"{src}/row{i}"
        is_tool = (
            row.get("agent_name") == AGENT_NAME or is_tool_family(info.get("family")) or bool(info.get("tools_kwargs"))
        )
        msgs = [{"role": m["role"], "content": m["content"]} for m in prompt]
        problems.append(EvalProblem(i, pid, src, msgs, gt, info, tools == "on" or (tools == "auto" and is_tool)))
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise DatasetError(f"{path}: {len(bad)} unusable row(s): " + "; ".join(bad[:5]) + more)
    ids = [p.problem_id for p in problems]
    if len(set(ids)) != len(ids):  # rows without unique indices: fall back to positions
        for p in problems:
            p.problem_id = f"{p.data_source}/row{p.index}"
    return problems
