"""The multi-turn SFT data of the tool-use model (:func:`build_sft_data`, ``python -m stare_verl.jobs.sft data``):
programmatic demonstrations with real sandbox output and, optionally, the public ReTool-SFT set, written as the
parquet files verl's SFT trainer reads (rows of ``envs.tool_use.sft_data``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["build_sft_data"]


def build_sft_data(
    out_dir: str | os.PathLike,
    n_demos: int = 512,
    demo_seed: int = 0,
    retool: bool = False,
    retool_file: str | None = None,
    retool_limit: int | None = None,
    n_val: int = 64,
    seed: int = 0,
    tokenizer: str | None = None,
    max_length: int | None = None,
) -> dict[str, Any]:
    """Write ``tooluse_train.parquet`` and ``tooluse_val.parquet`` under ``out_dir``.

    Rows: ``n_demos`` programmatic demonstrations (reasoning-gym questions, the code run in the project's
    sandbox, its real output, ``\\boxed{}`` answer; the RL system prompt), plus ReTool-SFT conversations when
    ``retool`` (``retool_file``: a local copy, else Hugging Face). With ``tokenizer`` and ``max_length``,
    rows whose chat-template rendering is longer than ``max_length`` tokens are dropped (counted). ``n_val``
    rows (at most a tenth) are held out for verl's ``val/loss``.

    Returns:
        ``{"train": path, "val": path, "counts": {...}}`` (kept/rejected per source).
    Raises:
        ValueError: no rows at all; envs.datasets.DatasetUnavailableError: ReTool-SFT unavailable.
    """
    from envs.tool_use.sft_data import (
        ConversationError,
        build_retool_sft,
        conversation_from_demo,
        load_retool_records,
        sft_row,
        split_rows,
        write_sft_parquet,
    )

    rows: list[dict[str, Any]] = []
    counts: dict[str, Any] = {}
    if n_demos > 0:
        from stare_verl.jobs.families.problems import sample_problems
        from stare_verl.jobs.families.tooluse import build_demos

        demos, wrong = build_demos(sample_problems(n_demos, demo_seed))
        kept = 0
        for d in demos:
            try:
                msgs = conversation_from_demo(d.problem.question, d.problem.code, d.tool_output,
                                              f"\\boxed{{{d.tool_output}}}")
            except ConversationError:
                continue
            rows.append(sft_row(msgs, f"demo/{d.problem.task}"))
            kept += 1
        counts["demos"] = {"kept": kept, "rejected": n_demos - kept, "wrong_output": len(wrong)}
    if retool or retool_file:
        rep = build_retool_sft(load_retool_records(retool_file), limit=retool_limit)
        rows += rep.rows
        counts["retool"] = {"kept": len(rep.rows), "rejected": len(rep.rejected), "duplicates": rep.duplicates,
                            "reasons": dict(rep.reasons())}
    if tokenizer and max_length:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
        before = len(rows)
        rows = [r for r in rows if len(tok.apply_chat_template(r["messages"], tools=r["tools"], tokenize=True,
                                                               return_dict=True)["input_ids"]) <= max_length]
        counts["too_long"] = before - len(rows)
    if not rows:
        raise ValueError("no SFT rows: ask for demos (--demos N) and/or ReTool-SFT (--retool)")
    n_val = min(n_val, len(rows) // 10)
    train, val = split_rows(rows, n_val, seed)
    out = Path(out_dir)
    paths = {"train": write_sft_parquet(train, out / "tooluse_train.parquet")}
    paths["val"] = write_sft_parquet(val, out / "tooluse_val.parquet") if val else None
    counts["train"], counts["val"] = len(train), len(val)
    return {**paths, "counts": counts}
