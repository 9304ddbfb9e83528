"""Multi-turn cold-start SFT data for the tool-use family, in the layout of verl's ``MultiTurnSFTDataset``.

verl 0.9.1's ``verl.trainer.sft_trainer`` reads parquet rows with a ``messages`` column (a chat list) and a
``tools`` column (the OpenAI tool schemas handed to the chat template as ``tools=``); its dataset renders each
message on its own with the tokenizer's chat template and puts the loss on assistant messages only (tool,
user and system tokens get ``loss_mask`` 0). A row here is::

    {"messages": [system, user, assistant(tool_calls=[code_interpreter]), tool, ..., assistant(\\boxed{..})],
     "tools": [CODE_INTERPRETER_SCHEMA_JSON], "data_source": "<where the row came from>"}

Every conversation is checked by :func:`check_conversation` (the shape that renders identically message by
message and as a whole, which verl's dataset asserts, and that the RL agent loop produces: one
``code_interpreter`` call per assistant turn, its output in the next ``tool`` message, a final answer in
``\\boxed{}``). The system message is ``envs.tool_use.TOOL_USE_SYSTEM``, the one the RL rows
(``envs.tool_use.task.to_tool_use_row``) carry, so the SFT model sees the prompt it will see in RL.

Sources:

- :func:`retool_conversation` / :func:`build_retool_sft`: the public ReTool cold-start set
  (``JoeYing/ReTool-SFT`` on Hugging Face; Feng et al. 2025, "ReTool: Reinforcement Learning for Strategic
  Tool Use in LLMs", arXiv:2504.11536). Its rows are two messages: a user message whose question follows the
  marker ``*user question:*`` after an instruction block, and one assistant message in which code runs are
  ``<code>```python ...```</code>`` followed by their output in ``<interpreter>...</interpreter>``, and the
  final answer is in ``<answer>...</answer>``. Each code block becomes a ``code_interpreter`` call, each
  interpreter block a ``tool`` message. Broken rows are rejected with a reason (never an exception).
- :func:`conversation_from_demo`: one programmatic demonstration (question, code, the sandbox's real output,
  answer), e.g. ``stare_verl.jobs.families.tooluse.Demo``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.tool_use import TOOL_USE_SYSTEM
from envs.tools.schema import CODE_INTERPRETER_SCHEMA_JSON, TOOL_NAME

__all__ = [
    "RETOOL_REPO",
    "ConversationError",
    "SFTBuildReport",
    "check_conversation",
    "conversation_from_demo",
    "build_retool_sft",
    "load_retool_records",
    "retool_conversation",
    "sft_row",
    "split_rows",
    "write_sft_parquet",
]

RETOOL_REPO = "JoeYing/ReTool-SFT"
RETOOL_DATA_SOURCE = "retool_sft"
_QUESTION_MARKER = "*user question:*"
_TAG = re.compile(r"<(/?)(code|interpreter|answer)>")
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n?(.*?)```", re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{")


class ConversationError(ValueError):
    """A conversation or source row that cannot become an SFT row; the message is the reason."""


@dataclass
class SFTBuildReport:
    """Kept SFT rows, and the rejected source rows as ``(index, reason)``; ``duplicates`` counts repeated
    questions that were dropped."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    duplicates: int = 0

    def reasons(self) -> Counter:
        """How many rows were rejected for each reason."""
        return Counter(reason for _, reason in self.rejected)

    def summary(self) -> str:
        """One line: kept, rejected (by reason), duplicates."""
        why = ", ".join(f"{n} {r}" for r, n in self.reasons().most_common())
        return f"{len(self.rows)} kept, {len(self.rejected)} rejected" + (f" ({why})" if why else "") + (
            f", {self.duplicates} duplicates dropped"
        )


# --------------------------------------------------------------------------------------- conversations


def _call(code: str) -> dict[str, Any]:
    # ``arguments`` is a dict: chat templates render it with ``tojson`` (a JSON string would be quoted twice)
    return {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": code}}}


def check_conversation(messages: Any) -> None:
    """Check that ``messages`` is one well-formed tool-use episode for verl's ``MultiTurnSFTDataset``.

    Shape: an optional ``system`` message, one ``user`` message, then assistant turns; an assistant turn
    with ``tool_calls`` has exactly one ``code_interpreter`` call whose ``arguments`` is a dict with a
    non-empty string ``code``, and is followed by exactly one ``tool`` message (its output, a string); the
    last message is an assistant turn without tool calls whose text contains ``\\boxed{``. Every ``content``
    is a string. (Two tool messages in a row would render differently one by one than as a whole, which
    verl's dataset rejects with an AssertionError mid-training.)

    Raises:
        ConversationError: the first rule broken, as a short reason.
    """
    if not isinstance(messages, list) or not messages:
        raise ConversationError("messages is not a non-empty list")
    for m in messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ConversationError("a message without a role")
        if not isinstance(m.get("content"), str):
            raise ConversationError(f"a {m['role']} message without string content")
    i = 1 if messages[0]["role"] == "system" else 0
    if i >= len(messages) or messages[i]["role"] != "user" or not messages[i]["content"].strip():
        raise ConversationError("no user question")
    i += 1
    if i >= len(messages):
        raise ConversationError("no assistant turn")
    while i < len(messages):
        m = messages[i]
        if m["role"] != "assistant":
            raise ConversationError(f"{m['role']} message where an assistant turn was expected")
        calls = m.get("tool_calls") or []
        if not calls:
            if i != len(messages) - 1:
                raise ConversationError("an assistant turn without a tool call before the end")
            if not _BOXED.search(m["content"]):
                raise ConversationError("final answer without \\boxed{}")
            return
        if len(calls) != 1:
            raise ConversationError("more than one tool call in one turn")
        fn = (calls[0] or {}).get("function") or {}
        args = fn.get("arguments")
        if fn.get("name") != TOOL_NAME:
            raise ConversationError(f"a call to a tool other than {TOOL_NAME}")
        if not isinstance(args, Mapping) or not isinstance(args.get("code"), str) or not args["code"].strip():
            raise ConversationError("a tool call without code")
        if i + 1 >= len(messages) or messages[i + 1]["role"] != "tool":
            raise ConversationError("a tool call without its output")
        i += 2
    raise ConversationError("ends with tool output instead of an answer")


def sft_row(messages: list[dict[str, Any]], data_source: str) -> dict[str, Any]:
    """One ``MultiTurnSFTDataset`` row: ``messages``, ``tools`` (the ``code_interpreter`` schema) and
    ``data_source``. Raises ConversationError (from :func:`check_conversation`)."""
    check_conversation(messages)
    return {"messages": messages, "tools": [CODE_INTERPRETER_SCHEMA_JSON], "data_source": data_source}


def conversation_from_demo(
    question: str, code: str, tool_output: str, answer_text: str, system: str | None = TOOL_USE_SYSTEM
) -> list[dict[str, Any]]:
    """A one-call episode: (system), user question, a ``code_interpreter`` call running ``code``, the tool's
    real output, and the final assistant text (which must contain ``\\boxed{}``).

    Raises:
        ConversationError: the episode is malformed (e.g. no ``\\boxed{}`` in ``answer_text``).
    """
    msgs: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    msgs += [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [_call(code)]},
        {"role": "tool", "content": tool_output},
        {"role": "assistant", "content": answer_text},
    ]
    check_conversation(msgs)
    return msgs


# --------------------------------------------------------------------------------------------- ReTool


def _extract_code(block: str) -> str:
    m = _FENCE.search(block)
    return (m.group(1) if m else block).strip()


def retool_conversation(record: Mapping[str, Any], system: str | None = TOOL_USE_SYSTEM) -> list[dict[str, Any]]:
    """Convert one raw ReTool-SFT record (module docstring) into a checked tool-use episode.

    The question is the user text after ``*user question:*`` (the whole user text when the marker is absent),
    without ``<answer>`` tags; the instruction block before the marker is replaced by ``system``. In the
    assistant text, the prose before each ``<code>`` block becomes that turn's content, the code (inside a
    Markdown fence if there is one) its ``code_interpreter`` call, the next ``<interpreter>`` block the tool
    message; the prose before ``<answer>`` plus the answer's inside is the final turn.

    Raises:
        ConversationError: the record does not have that shape (missing messages, unclosed or misplaced
            tags, code without output, empty code, final answer without ``\\boxed{}``...).
    """
    raw = record.get("messages") if isinstance(record, Mapping) else None
    if hasattr(raw, "tolist"):  # numpy array from pandas
        raw = raw.tolist()
    if not isinstance(raw, list) or len(raw) < 2:
        raise ConversationError("source row has no [user, assistant] messages")
    user, assistant = raw[0], raw[1]
    if not (isinstance(user, Mapping) and isinstance(assistant, Mapping)):
        raise ConversationError("source messages are not dicts")
    if user.get("role") != "user" or assistant.get("role") != "assistant":
        raise ConversationError("source messages are not [user, assistant]")
    u, a = user.get("content"), assistant.get("content")
    if not isinstance(u, str) or not isinstance(a, str):
        raise ConversationError("source message content is not text")
    question = u.split(_QUESTION_MARKER, 1)[1] if _QUESTION_MARKER in u else u
    question = question.replace("<answer>", "").replace("</answer>", "").strip()

    msgs: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    msgs.append({"role": "user", "content": question})
    pos, pending_call = 0, False
    final: str | None = None
    for m in _TAG.finditer(a):
        closing, tag = m.group(1) == "/", m.group(2)
        if m.start() < pos:
            continue
        if closing:
            raise ConversationError(f"</{tag}> without <{tag}>")
        end = a.find(f"</{tag}>", m.end())
        if end < 0:
            raise ConversationError(f"unclosed <{tag}>")
        inner, before = a[m.end() : end], a[pos : m.start()].strip()
        if _TAG.search(inner):
            raise ConversationError(f"a tag inside <{tag}>")
        if final is not None:
            raise ConversationError(f"<{tag}> after the answer")
        if tag == "code":
            if pending_call:
                raise ConversationError("code without interpreter output")
            code = _extract_code(inner)
            if not code:
                raise ConversationError("empty code block")
            msgs.append({"role": "assistant", "content": before, "tool_calls": [_call(code)]})
            pending_call = True
        elif tag == "interpreter":
            if not pending_call:
                raise ConversationError("interpreter output without code")
            if before:
                raise ConversationError("text between code and its output")
            msgs.append({"role": "tool", "content": inner.strip()})
            pending_call = False
        else:  # answer
            if pending_call:
                raise ConversationError("code without interpreter output")
            final = (before + "\n\n" + inner.strip()).strip() if before else inner.strip()
        pos = end + len(f"</{tag}>")
    if pending_call:
        raise ConversationError("code without interpreter output")
    tail = a[pos:].strip()
    if final is None:
        final = tail
    elif tail:
        final = f"{final}\n\n{tail}"
    msgs.append({"role": "assistant", "content": final})
    if len(msgs) - (0 if system is None else 1) < 4:
        raise ConversationError("no tool call")
    check_conversation(msgs)
    return msgs


def load_retool_records(
    from_file: str | os.PathLike | None = None, offline: bool | None = None, cache_dir: str | None = None
) -> Iterable[dict[str, Any]]:
    """Raw ReTool-SFT records: from a local copy (parquet/jsonl/json with a ``messages`` column) or from
    Hugging Face (``JoeYing/ReTool-SFT``, split ``train``; the ``datasets`` cache is used when offline).

    Args:
        from_file: local file; no network is used.
        offline: True: cache only; False: hub; None: probe the hub and go offline when unreachable.
        cache_dir: ``datasets`` cache directory.
    Raises:
        envs.datasets.DatasetUnavailableError: not reachable and not cached, or an unreadable local file.
    """
    from envs.datasets import DatasetUnavailableError, hub_mode, hub_reachable, read_local_records

    if from_file is not None:
        return read_local_records(from_file)
    if offline is None:
        offline = not hub_reachable()
    import datasets

    with hub_mode(offline):
        try:
            ds = datasets.load_dataset(RETOOL_REPO, split="train", cache_dir=cache_dir)
        except Exception as err:  # noqa: BLE001 - one clear message
            why = "the hub is unreachable and it is not cached" if offline else f"{type(err).__name__}: {err}"
            raise DatasetUnavailableError(
                f"cannot load {RETOOL_REPO}: {why}. Pass a local copy with --retool-file PATH "
                "(parquet/jsonl with a 'messages' column of [user, assistant])."
            ) from err
    return (dict(r) for r in ds)


def build_retool_sft(
    records: Iterable[Mapping[str, Any]], system: str | None = TOOL_USE_SYSTEM, limit: int | None = None
) -> SFTBuildReport:
    """Convert raw ReTool-SFT records to SFT rows; a bad row is rejected with its reason, a repeated
    question dropped (counted), never raised. ``limit``: stop after this many kept rows."""
    rep = SFTBuildReport()
    seen: set[str] = set()
    for idx, rec in enumerate(records):
        if limit is not None and len(rep.rows) >= limit:
            break
        try:
            msgs = retool_conversation(rec, system=system)
        except ConversationError as err:
            rep.rejected.append((idx, str(err)))
            continue
        except Exception as err:  # noqa: BLE001 - a row of an unexpected type: reject it, keep going
            rep.rejected.append((idx, f"unreadable row ({type(err).__name__})"))
            continue
        key = " ".join(msgs[1 if system is not None else 0]["content"].split())
        if key in seen:
            rep.duplicates += 1
            continue
        seen.add(key)
        rep.rows.append(sft_row(msgs, RETOOL_DATA_SOURCE))
    return rep


# ------------------------------------------------------------------------------------------- writing


def split_rows(rows: list[dict[str, Any]], n_val: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Shuffle ``rows`` under ``seed`` and hold out ``n_val`` of them: ``(train, val)``.

    Raises:
        ValueError: ``n_val < 0`` or no training row would be left.
    """
    import random

    if n_val < 0 or n_val >= len(rows):
        raise ValueError(f"need 0 <= n_val < {len(rows)} rows, got n_val={n_val}")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    val = [rows[i] for i in order[:n_val]]
    train = [rows[i] for i in order[n_val:]]
    return train, val


def write_sft_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Write SFT rows to parquet (parent folders created); each row is checked again first.

    The ``tools`` column holds the schema as a JSON-compatible dict; ``arguments`` of each tool call is a
    dict, which parquet stores as a struct and verl reads back as a dict.

    Raises:
        ValueError: no rows; ConversationError: a malformed row.
    """
    import pandas as pd

    if not rows:
        raise ValueError(f"no rows to write to {path}")
    for r in rows:
        check_conversation(r["messages"])
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(p, index=False)
    return p
