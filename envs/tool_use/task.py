"""The tool-use family: system prompt, dataset builder and reward entry point for multi-turn Python tool use.

Rows are verl RLHF parquet rows (``envs.datasets``) with ``family: tooluse`` plus what the agent loop
needs: ``agent_name: stare_tool_agent`` (``envs.tool_use.agent_loop``) and ``extra_info.tools_kwargs`` for the
``code_interpreter`` tool. Sources:

    offline      reasoning-gym arithmetic where running code helps a small model (no network), the
                 calibrated CPU demo set (``docs/cpu-demo-calibration.md``): basic_arithmetic
                 (+, -, *; 2-4 terms, 1-3 digits), chain_sum (2-5 terms), products (2 terms, 1-4 digits).
                 ``extra_info.expression`` holds the Python expression of each problem.
    aime2024, aime2025, dapo_math, math500, gsm8k
                 ``envs.datasets`` hub loaders (GPU recipes), converted to tool-use rows.

Reward: ``compute_score`` (``reward.custom_reward_function: {path: <this file>, name: compute_score}``)
scores the model-generated text the agent loop hands over in ``extra_info["model_response_text"]``
(response_mask == 1 tokens only, tool calls removed), so text printed by the tool can never earn credit.
Use it with a reward manager that merges the agent loop's ``extra_fields`` into ``extra_info``: verl's
``naive`` (the default), ``limited``, ``remote``, or ``envs.reward_manager.MathRewardManager`` (a naive
subclass); verl's ``dapo`` manager does not (``compute_score`` then falls back, see there). Recipe::

    reward:
      custom_reward_function: {path: pkg://envs.tool_use.task, name: compute_score,
                               reward_kwargs: {family: tool_use}}

CLI (files land in ``<out>/tool_use/``, the layout of ``python -m envs.datasets``; a hub file is the
same rows ``envs.datasets`` writes for ``--family tool_use`` plus ``agent_name``/``tools_kwargs``)::

    python -m envs.tool_use.task offline [--out data] [--n-train 2000 --n-test 200]   # rg_arith_{train,test}.parquet
    python -m envs.tool_use.task hub aime2024 [--out data] [--from-file aime24.jsonl]  # aime2024_test.parquet
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envs.contract import AGENT_NAME, MODEL_TEXT_KEY, TOOL_USE
from envs.datasets import BadRow, BuildReport, DatasetUnavailableError, build_hub, make_row, write_parquet
from envs.tool_use import TOOL_USE_SYSTEM
from envs.tool_use.episode import EpisodeStats
from envs.tools.schema import TOOL_NAME

__all__ = [
    "AGENT_NAME",
    "OFFLINE_TOOL_TASKS",
    "TOOL_NAME",
    "TOOL_STAT_KEYS",
    "TOOL_USE_SYSTEM",
    "build_offline_tool_use",
    "build_tool_use_hub",
    "compute_score",
    "main",
    "strip_tool_turns",
    "to_tool_use_row",
]

logger = logging.getLogger(__name__)


# reasoning-gym tasks of the offline set: (task, config). No division (float output vs integer oracle).
OFFLINE_TOOL_TASKS: list[tuple[str, dict[str, Any]]] = [
    (
        "basic_arithmetic",
        {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 3, "operators": ("+", "-", "*")},
    ),
    ("chain_sum", {"min_terms": 2, "max_terms": 5}),
    ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 4}),
]
_SPLIT_SEED = {"train": 0, "test": 1_000_003}

# Per-episode tool statistics the agent loop reports (``EpisodeStats.counters()``'s numbers: turns, calls, errors by
# kind, tool seconds) with their values in an episode without calls; compute_score returns them (these defaults when
# absent) so they reach verl's reward metrics with the same keys on every sample.
TOOL_STAT_KEYS: dict[str, Any] = {
    key: value for key, value in EpisodeStats().counters().items()
    if isinstance(value, (int, float)) and not isinstance(value, bool)
}


# ----------------------------------------------------------------------------------------------- rows


def to_tool_use_row(
    row: Mapping[str, Any], create_kwargs: Mapping[str, Any] | None = None, system: str | None = TOOL_USE_SYSTEM
) -> dict[str, Any]:
    """Make a verl row a tool-use row (``envs.tool_use.TOOL_USE_FAMILY.make_row``): ``agent_name``,
    ``extra_info.tools_kwargs``, ``family: tooluse``, and ``system`` (default ``TOOL_USE_SYSTEM``; None: none) as
    the system message (replacing any other).

    Args:
        row: an ``envs.datasets`` row (``prompt``, ``reward_model``, ``extra_info``, ...).
        create_kwargs: passed to the tool's ``create`` for this row (``tools_kwargs[tool]["create_kwargs"]``);
            default ``{"data_source": <row data_source>}`` (informational: ``code_interpreter`` takes no
            per-row options; parquet cannot store an empty struct).
        system: the system message (None: the prompt without one, e.g. the CPU demo's rows).

    Returns:
        a new row (the input is not changed).

    Raises:
        ValueError: the row has no user message.
    """
    from envs.tool_use import TOOL_USE_FAMILY

    return TOOL_USE_FAMILY.make_row(row, system=system, create_kwargs=create_kwargs)


def build_offline_tool_use(
    split: str = "train", n: int = 1000, seed: int = 0, exclude: set[str] | None = None
) -> BuildReport:
    """The offline (reasoning-gym) tool-use set, mixed evenly over ``OFFLINE_TOOL_TASKS``.

    Args:
        split: "train" or "test" (a different seed stream, so the splits do not share generator draws).
        n: number of rows asked for (duplicates and questions in ``exclude`` are dropped and counted).
        seed: base seed.
        exclude: question texts to leave out (e.g. the train split's, to keep test uncontaminated).

    Returns:
        BuildReport; ``data_source`` is ``"rg/<task>"``; ``extra_info`` has ``task``, ``expression``,
        ``source_id``.

    Raises:
        ValueError: unknown split or n < 1.
    """
    import reasoning_gym

    if split not in _SPLIT_SEED:
        raise ValueError(f"unknown split {split!r}; choose train or test")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    excluded = {" ".join(q.split()) for q in exclude or ()}
    report = BuildReport(rows=[])
    seen: set[str] = set()
    k = len(OFFLINE_TOOL_TASKS)
    for t, (task, cfg) in enumerate(OFFLINE_TOOL_TASKS):
        size = n // k + (1 if t < n % k else 0)
        if size == 0:
            continue
        ds = reasoning_gym.create_dataset(task, seed=seed + _SPLIT_SEED[split] + t, size=size, **cfg)
        for j in range(size):
            entry = ds[j]
            q, a = str(entry["question"]).strip(), str(entry["answer"]).strip()
            key = " ".join(q.split())
            if key in seen or key in excluded:
                report.duplicates += 1
                continue
            if not q or not a:
                report.bad.append(BadRow(j, f"{task}: empty question or answer"))
                continue
            seen.add(key)
            expr = str((entry.get("metadata") or {}).get("expression") or "")
            row = make_row(
                q,
                a,
                f"rg/{task}",
                len(report.rows),
                split,
                family=TOOL_USE,
                extra={"task": task, "expression": expr, "source_id": f"{task}/{seed}/{j}"},
            )
            report.rows.append(to_tool_use_row(row))
    return report


def build_tool_use_hub(name: str, split: str | None = None, **kwargs: Any) -> BuildReport:
    """A hub math set (``envs.datasets.SOURCES``: aime2024, aime2025, dapo_math, math500, gsm8k) as
    tool-use rows. ``kwargs`` go to ``envs.datasets.build_hub`` (from_file, offline, limit, cache_dir).

    Raises:
        KeyError: unknown source/split; DatasetUnavailableError: not reachable and not cached.
    """
    rep = build_hub(name, split=split, family=TOOL_USE, **kwargs)
    rep.rows = [to_tool_use_row(r) for r in rep.rows]
    return rep


# --------------------------------------------------------------------------------------------- reward

_TOOL_RESPONSE = re.compile(r"<tool_response>.*?(</tool_response>|\Z)", re.DOTALL)
_warned_fallback = False


def strip_tool_turns(solution_str: str) -> str:
    """Best-effort removal of tool output and tool calls from a whole decoded response (hermes tags).

    Only a fallback for when the agent loop's model text is missing: a template that does not wrap tool
    output in ``<tool_response>`` tags cannot be cleaned this way, and tool output that itself prints
    ``</tool_response>`` ends its block early (the loop's model text has neither problem).
    """
    from envs.tool_use.parser import remove_tool_calls

    # calls first: their extents come from their JSON, so code that prints "<tool_response>" wipes nothing
    return _TOOL_RESPONSE.sub("", remove_tool_calls(solution_str or ""))


def compute_score(
    data_source: str | None = None,
    solution_str: str | None = None,
    ground_truth: Any = None,
    extra_info: Mapping | None = None,
    **reward_kwargs: Any,
) -> dict[str, Any]:
    """verl custom reward for tool use: ``envs.reward.compute_score`` on the model-generated text only.

    Args:
        data_source, ground_truth, reward_kwargs: as ``envs.reward.compute_score``.
        solution_str: verl's decoded response (tool output included); used only as a fallback.
        extra_info: row info merged with the agent loop's ``extra_fields`` (verl's naive manager does this):
            ``model_response_text`` is scored when present; else ``solution_str`` with ``<tool_response>``
            and ``<tool_call>`` blocks removed (a warning is logged once; e.g. verl's ``dapo`` manager).

    Returns:
        ``envs.reward.compute_score``'s dict plus ``TOOL_STAT_KEYS`` and ``reward_text_from_loop`` (bool),
        the same keys on every call.

    Raises:
        ValueError: only for invalid reward options (``envs.reward``).
    """
    global _warned_fallback
    from envs.reward import compute_score as score_math

    info = dict(extra_info) if isinstance(extra_info, Mapping) else {}
    info.setdefault("family", TOOL_USE)
    text = info.get(MODEL_TEXT_KEY)
    from_loop = isinstance(text, str)
    if not from_loop:
        if not _warned_fallback:
            logger.warning(
                "envs.tool_use.task.compute_score: extra_info has no %r (not produced by the stare_tool_agent loop, "
                "or a reward manager that does not pass agent-loop extra_fields); scoring the decoded "
                "response with tool tags stripped",
                MODEL_TEXT_KEY,
            )
            _warned_fallback = True
        text = strip_tool_turns(solution_str if isinstance(solution_str, str) else "")
    out = score_math(data_source, text, ground_truth, info, **reward_kwargs)
    for key, default in TOOL_STAT_KEYS.items():
        value = info.get(key, default)
        try:
            out[key] = type(default)(value)
        except (TypeError, ValueError, OverflowError):  # e.g. int(inf): a broken statistic never stops scoring
            out[key] = default
    out["reward_text_from_loop"] = from_loop
    return out


# ------------------------------------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (module docstring). Returns the exit status: 0 done; 2 refused (an unknown source, a missing or
    malformed file, a source neither reachable nor cached: as ``python -m envs.datasets``); 1 another failure."""
    p = argparse.ArgumentParser(prog="python -m envs.tool_use.task", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    off = sub.add_parser("offline", help="reasoning-gym arithmetic (no network)")
    off.add_argument("--out", default="data")
    off.add_argument("--n-train", type=int, default=2000)
    off.add_argument("--n-test", type=int, default=200)
    off.add_argument("--seed", type=int, default=0)
    hub = sub.add_parser("hub", help="a hub math set as tool-use rows")
    hub.add_argument("name")
    hub.add_argument("--out", default="data")
    hub.add_argument("--split", default=None)
    hub.add_argument("--from-file", default=None)
    hub.add_argument("--limit", type=int, default=None)
    args = p.parse_args(argv)
    out = Path(args.out) / TOOL_USE
    try:
        if args.cmd == "offline":
            train = build_offline_tool_use("train", args.n_train, args.seed)
            test = build_offline_tool_use(
                "test", args.n_test, args.seed, exclude={r["extra_info"]["question"] for r in train.rows}
            )
            reports = [("train", train), ("test", test)]
            named = [(f"rg_arith_{split}", rep) for split, rep in reports]
        else:
            rep = build_tool_use_hub(args.name, split=args.split, from_file=args.from_file, limit=args.limit)
            split = rep.rows[0]["extra_info"]["split"] if rep.rows else args.split
            named = [(f"{args.name}_{split}", rep)]
        for stem, rep in named:
            path = write_parquet(rep.rows, out / f"{stem}.parquet")
            print(f"{stem}: {len(rep.rows)} rows -> {path} (bad {len(rep.bad)}, duplicates {rep.duplicates})")
    except (DatasetUnavailableError, KeyError, ValueError, FileNotFoundError) as err:  # refused: as envs.datasets
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - CLI: one clear line, non-zero status
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
