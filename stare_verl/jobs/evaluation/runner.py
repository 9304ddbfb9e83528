"""Sample k answers per problem from a chat-completions server, run tool calls, score, and write JSONL.

Data: a verl RLHF parquet written by the project (``envs.datasets`` / ``envs.tool_use.task`` /
``stare_verl.jobs.demo``): ``prompt`` (chat messages), ``data_source``, ``reward_model.ground_truth``,
``extra_info``; :func:`load_problems` checks the schema and says what is wrong.

One sample = one episode of the evaluation episode driver (``stare_verl.jobs.evaluation.episode``: the training
loop's parser, tool-call runner, stop rules and reward), with :class:`ChatGenerate` as its ``generate``: each
turn is one chat-completions request.

- plain rows (short / long CoT): one request; the answer (with ``reasoning_content`` put back inside
  ``<think>...</think>`` when the server splits it off) is scored by ``envs.reward.compute_score`` with the
  row's ``extra_info`` (its ``family`` picks the options) and the finish reason (``length`` = truncated =
  no answer), as in training.
- tool-use rows (``agent_name: stare_tool_agent``, ``extra_info.family: tool_use`` or ``tools_kwargs``): the
  request carries the tool schemas (``tools``); calls in the content are hermes ``<tool_call>`` blocks (a
  server that parses tool calls itself returns ``tool_calls``, read the same way); every call is answered by
  the tools of :func:`load_tools` (the ``code_interpreter`` tool in the sandbox) and sent back as a ``tool``
  message. The token budget ``max_tokens`` (model + tool tokens of all turns, as verl's ``response_length``)
  is measured from the server's ``usage``.

Results: one JSON line per sample (:data:`RECORD_KEYS`) appended as soon as the sample is scored; a
``<out>.meta.json`` next to it records the settings (:meth:`EvalSettings.fingerprint`: the model, the data
file's path and the SHA-256 of its bytes, the sampling and episode settings). Run again with the same output
and settings to resume: answered (problem_id, sample_index) pairs are not asked again, a torn last line is
dropped, a line that is no valid record (bad JSON, a missing key, a field of the wrong type) is skipped, counted
and warned about (its sample runs again), and of two records of one pair the first in the file counts
(``metrics.unique_records``, the one rule of every count). A sample the answer checker gave no verdict
(``verdict: "unverified"``: a timeout or a failed checker) is scored again from its stored response
(:func:`rescore_unverified`) and its line rewritten, until it has been scored ``episode.MAX_SCORE_ATTEMPTS`` times; a record of an earlier version without a ``verdict``
is read as correct when ``correct``, else as unverified (scored again). Other settings, data whose content changed, or
samples without their settings file raise :class:`ResumeMismatch` naming what differs and how to start
afresh (a larger ``k`` is allowed: only the new samples run).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envs.contract import AGENT_NAME
from envs.families import is_tool_family
from envs.tool_use.history import assistant_message, with_reasoning
from stare_verl.jobs.evaluation.client import ChatClient, ChatResult, RequestFailed
from stare_verl.jobs.evaluation.episode import (
    CONTEXT_FULL,
    MAX_SCORE_ATTEMPTS,
    NO_BUDGET,
    RECORD_KEYS,
    UNVERIFIED,
    EvalProblem,
    EvalRecord,
    Sample,
    TurnRequest,
    TurnResult,
    rescore_record,
    run_samples,
    score_sample,
)
from stare_verl.jobs.evaluation.metrics import unique_records

__all__ = [
    "RECORD_KEYS",
    "SEED_STRIDE",
    "ChatGenerate",
    "DatasetError",
    "EvalProblem",
    "EvalRecord",
    "EvalSettings",
    "ResultsBusy",
    "ResultsFile",
    "ResumeMismatch",
    "data_digest",
    "load_problems",
    "load_tools",
    "pending_samples",
    "record_order",
    "record_samples",
    "rescore_unverified",
    "resume_split",
    "run_api_eval",
    "sample_seed",
    "score_sample",
    "tool_runner",
]

logger = logging.getLogger(__name__)

SEED_STRIDE = 1_000_003  # seeds of one problem's samples: base + problem_index * SEED_STRIDE + sample_index

_CONTEXT_ERR = re.compile(r"context length|context window|maximum context|too long|max_model_len|exceeds", re.I)
_CTX_LEN = re.compile(r"maximum context length is (\d+)", re.I)
_CTX_PROMPT = re.compile(r"(\d+) (?:tokens )?in the messages", re.I)


def _fitted_max_tokens(message: str) -> int | None:
    """From vLLM's context-length rejection ("maximum context length is C tokens ... P in the messages, ..."),
    the largest max_tokens that fits (C - P); None when the message does not say."""
    c, p = _CTX_LEN.search(message), _CTX_PROMPT.search(message)
    return int(c.group(1)) - int(p.group(1)) if c and p else None


class DatasetError(ValueError):
    """The data file is missing, unreadable, or not a verl RLHF dataset the evaluation can use."""


class ResumeMismatch(ValueError):
    """A results file exists with samples drawn under other settings."""


class ResultsBusy(ResumeMismatch):
    """Another process holds the results file (its ``.lock``)."""


class EvalSettings(BaseModel):
    """Sampling and episode settings (reference validation: k = 32, temperature 1.0, top_p 0.7).

    Attributes:
        k: samples per problem.
        temperature, top_p: sampling.
        max_tokens: response budget per sample in tokens (one turn for plain rows; model + tool tokens of all
            turns for tool-use rows, like verl's ``response_length``); None: the server's limit.
        seed: base seed; sample j of problem i is asked with ``sample_seed(seed, i, j)``; None: no seed sent.
        max_turns: most assistant turns of a tool-use episode (verl's ``max_assistant_turns``).
        tools: "auto" (tool loop for tool-use rows), "on" (every row), "off" (never; single turn).
        tool_choice: sent as ``tool_choice`` ("omit": not sent, the server's default). vLLM answers requests
            with tools and the default "auto" only when started with ``--enable-auto-tool-choice
            --tool-call-parser hermes``; ``none`` keeps the tools in the prompt and parses nothing there.
        max_tool_response_chars, tool_response_truncate_side: observation cut (verl's
            ``multi_turn.max_tool_response_length`` / ``tool_response_truncate_side``).
        max_parallel_calls: calls run per turn (verl's ``multi_turn.max_parallel_calls``); extra ones are
            answered with an error.
        tool_timeout_s: loop-side deadline of one tool call.
        reward_kwargs: options for ``envs.reward`` (as the recipe's ``reward_kwargs``).
    """

    model_config = ConfigDict(extra="forbid")

    k: int = Field(32, ge=1, le=100_000)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.7, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = 0
    max_turns: int = Field(8, ge=1)
    tools: Literal["auto", "on", "off"] = "auto"
    tool_choice: Literal["omit", "auto", "none"] = "omit"
    max_tool_response_chars: int = Field(1024, ge=1)
    tool_response_truncate_side: Literal["left", "middle", "right"] = "middle"
    max_parallel_calls: int = Field(1, ge=1)
    tool_timeout_s: float = Field(60.0, gt=0)
    reward_kwargs: dict[str, Any] = Field(default_factory=dict)

    def fingerprint(self, model: str, data: str | Path) -> dict[str, Any]:
        """What must match for earlier samples to be reused (``k`` may grow): the model, the data file's path and
        the SHA-256 of its bytes (``data_sha256``: :func:`data_digest`, None when ``data`` names no file), and
        every setting but ``k``. Data edited in place (new ground truths) has another digest, so its old
        records are never reused."""
        d = self.model_dump(exclude={"k"})
        return {"model": model, "data": str(data), "data_sha256": data_digest(data), **d}


def data_digest(path: str | Path) -> str | None:
    """SHA-256 (hex) of the bytes of the file at ``path``; None when there is no such file."""
    path = Path(path)
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sample_seed(base: int | None, problem_index: int, sample_index: int) -> int | None:
    """Request seed of sample ``sample_index`` of problem ``problem_index`` (None when ``base`` is None)."""
    if base is None:
        return None
    return int(base) + int(problem_index) * SEED_STRIDE + int(sample_index)


# ---------------------------------------------------------------------------------------------- data


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DatasetError(
            f"data file {path} does not exist (build one with `python -m envs.datasets ...` or "
            "`python -m envs.tool_use.task ...`)"
        )
    try:
        if path.suffix in (".jsonl", ".json"):
            with path.open() as f:
                return [json.loads(line) for line in f if line.strip()]
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    except Exception as err:  # noqa: BLE001 - any reader failure: one clear message
        raise DatasetError(f"cannot read {path} as {'JSONL' if path.suffix != '.parquet' else 'parquet'}: "
                           f"{type(err).__name__}: {err}") from err


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


# ------------------------------------------------------------------------------------------- results


def _legacy_verdict(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict of a record written before records kept one: ``correct`` when it was correct, else
    ``unverified`` (a checker that gave no verdict was then stored as wrong: it is scored again)."""
    return {"verdict": "correct" if rec.get("correct") is True else UNVERIFIED, "verify_method": "not_recorded"}


class ResultsFile:
    """The per-sample JSONL file and its ``.meta.json`` (settings fingerprint).

    Args:
        path: the JSONL file (its folder is created).
        fingerprint: ``EvalSettings.fingerprint(...)`` of this run.
        overwrite: discard an existing file (and its settings) instead of resuming.
    Raises:
        ResumeMismatch: the existing file was written with another fingerprint (other model, settings or data
            content), its settings file is missing or unreadable while it holds samples (nothing says how they
            were drawn), and not ``overwrite``. The message names what differs and how to start afresh.
        ResultsBusy: another process has the file open (an exclusive ``flock`` on ``<path>.lock``, held until
            :meth:`close`).

    Attributes:
        skipped: lines of the last :meth:`load` that were no valid record (their samples run again).
        duplicates: records of the last :meth:`load` dropped as repeats of an earlier (problem_id, sample_index).
    """

    def __init__(self, path: str | Path, fingerprint: Mapping[str, Any], overwrite: bool = False):
        self.path = Path(path)
        self.meta_path = self.path.with_name(self.path.name + ".meta.json")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fp = json.loads(json.dumps(dict(fingerprint), default=str))
        self._f = None
        self.skipped = 0
        self.duplicates = 0
        self._lock = self.path.with_name(self.path.name + ".lock").open("w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            self._lock.close()
            raise ResultsBusy(f"another evaluation is writing {self.path}; wait for it or use another --out") from err
        if overwrite:
            self.path.unlink(missing_ok=True)
        elif self.path.exists() and self.path.stat().st_size > 0:
            try:
                self._check_settings(fp)
            except ResumeMismatch:
                self.close()
                raise
        tmp = self.meta_path.with_name(self.meta_path.name + ".tmp")
        tmp.write_text(json.dumps(fp, indent=1, sort_keys=True))
        os.replace(tmp, self.meta_path)  # never a torn settings file

    def _afresh(self) -> str:
        n = self.path.read_bytes().count(b"\n")
        return (f"To start afresh, run again with --overwrite (overwrite=True in Python), which discards the {n} "
                f"line(s) of {self.path}, or write to another --out.")

    def _check_settings(self, fp: Mapping[str, Any]) -> None:
        """Raise ResumeMismatch unless the settings file next to the (non-empty) results matches ``fp``."""
        if not self.meta_path.exists():
            raise ResumeMismatch(
                f"{self.path} holds samples but their settings file {self.meta_path} is missing, so nothing says "
                "which model, data and sampling settings drew them; they are not reused. " + self._afresh()
            )
        try:
            old = json.loads(self.meta_path.read_text())
        except ValueError as err:
            old = err
        if not isinstance(old, dict):
            raise ResumeMismatch(
                f"{self.meta_path} (the settings of the samples in {self.path}) is not a JSON object. " + self._afresh()
            )
        if old != fp:
            diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
            why = ("; the data file's content changed since those samples were drawn (their ground truths may be "
                   "stale)" if "data_sha256" in diff else "")
            raise ResumeMismatch(
                f"{self.path} holds samples drawn with other settings ({', '.join(diff)} differ: "
                f"{ {k: old.get(k) for k in diff} } vs { {k: fp.get(k) for k in diff} }){why}. " + self._afresh()
            )

    def load(self) -> list[dict[str, Any]]:
        """The records already in the file, in file order, one per (problem_id, sample_index) (the first;
        ``metrics.unique_records``). A line that is no valid :class:`EvalRecord` (bad JSON, a missing key, a
        field of the wrong type such as ``sample_index: "abc"`` or ``problem_id: [1]``, a negative index) is
        skipped and counted (``skipped``), with one warning naming the first such lines; its sample runs again.
        A torn (unterminated) last line is cut off."""
        self.skipped = self.duplicates = 0
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1]
        out: list[dict[str, Any]] = []
        bad: list[str] = []
        for n, line in enumerate(keep.splitlines(), 1):
            why = None
            try:
                rec = json.loads(line)
            except ValueError:
                rec, why = None, "not JSON"
            if why is None and not isinstance(rec, dict):
                why = f"a JSON {type(rec).__name__}, not an object"
            if why is None and "verdict" not in rec:  # an earlier version's record: no verdict kept
                rec = {**rec, **_legacy_verdict(rec)}
            if why is None:
                missing = [k for k in RECORD_KEYS if k not in rec]
                if missing:
                    why = f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
            if why is None:
                try:
                    row = EvalRecord.model_validate({k: rec[k] for k in RECORD_KEYS}, strict=True).model_dump()
                except ValidationError as err:
                    e = err.errors()[0]
                    why = f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                else:
                    if row["sample_index"] < 0 or row["problem_index"] < 0:
                        why = "negative sample_index or problem_index"
            if why is None:
                out.append(row)
            else:
                bad.append(f"line {n}: {why}")
        self.skipped = len(bad)
        if bad:
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            logger.warning("%s: skipped %d line(s) that are no valid record (%s%s); their samples run again",
                           self.path, len(bad), "; ".join(bad[:3]), more)
        unique = unique_records(out)
        self.duplicates = len(out) - len(unique)
        if self.duplicates:
            logger.warning("%s: %d repeated record(s) of a (problem_id, sample_index) ignored (the first in the file "
                           "counts)", self.path, self.duplicates)
        if len(keep) != len(data):
            logger.warning("%s: dropped an unfinished last line (interrupted run)", self.path)
            with self.path.open("r+b") as f:
                f.truncate(len(keep))
        return unique

    def replace(self, records: Mapping[tuple[str, int], Mapping[str, Any]]) -> int:
        """Rewrite the line of each ``(problem_id, sample_index)`` of ``records`` (its first valid record in the
        file, the one :meth:`load` reads) with the new record; every other line stays as it is. Atomic (a
        temporary file renamed over the results). Returns the number of lines replaced."""
        if self._f is not None:
            self._f.close()
            self._f = None
        if not records or not self.path.exists():
            return 0
        data = self.path.read_bytes()
        lines = data[: data.rfind(b"\n") + 1].splitlines()
        todo = {(str(k[0]), int(k[1])): v for k, v in records.items()}
        out, n = [], 0
        for line in lines:
            try:
                rec = json.loads(line)
                key = (str(rec["problem_id"]), int(rec["sample_index"])) if isinstance(rec, dict) else None
            except (ValueError, KeyError, TypeError):
                key = None
            if key is not None and key in todo:
                line = json.dumps(todo.pop(key), ensure_ascii=False, default=str).encode()
                n += 1
            out.append(line + b"\n")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(b"".join(out))
        os.replace(tmp, self.path)
        return n

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as a line and flush it (a crash afterwards keeps it)."""
        if self._f is None:
            self._f = self.path.open("a")
        self._f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file and release the lock."""
        if self._f is not None:
            self._f.close()
            self._f = None
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


# ----------------------------------------------------------------------------------------------- tools


def load_tools(tool_config: str | Path | None = None) -> dict[str, Any]:
    """The tools of a verl tool config YAML (``multi_turn.tool_config_path``), by name.

    ``None``: the project's ``recipes/tool_use/tool_config.yaml`` when present, else ``code_interpreter`` with
    its defaults. Tools are built with verl's ``initialize_tools_from_config``.

    Raises:
        FileNotFoundError: ``tool_config`` given but missing; envs.sandbox.SandboxUnavailable: no sandbox.
    """
    from verl.tools.tool_registry import initialize_tools_from_config

    if tool_config is None:
        from stare_verl.recipe_files import recipes_dir

        default = recipes_dir() / "tool_use" / "tool_config.yaml"
        if default.is_file():
            tool_config = default
    if tool_config is None:
        from envs.tools.code_interpreter import CodeInterpreterTool

        tool = CodeInterpreterTool({"type": "native", "session_key": "trajectory"})
        return {tool.tool_schema.function.name: tool}
    if not Path(tool_config).is_file():
        raise FileNotFoundError(f"tool config {tool_config} does not exist")
    with contextlib.redirect_stdout(sys.stderr):  # verl prints each tool schema
        tools = initialize_tools_from_config(str(tool_config))
    return {t.tool_schema.function.name: t for t in tools}


# --------------------------------------------------------------------------------------- generate


def _turn_text(res: ChatResult) -> str:
    """The assistant turn as the model wrote it: reasoning back inside think tags, structured tool calls back
    as hermes blocks (so ``parse_tool_calls`` applies the training loop's rules to them)."""
    text = with_reasoning(res.content, res.reasoning)
    for tc in res.tool_calls:
        fn = tc.get("function") or {}
        text += "\n<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}) + "\n</tool_call>"
    return text


class ChatGenerate:
    """The episode driver's ``generate`` (``episode.GenerateFn``) over an OpenAI-compatible chat-completions
    client: one ``chat`` request per turn with the chat so far.

    The request carries ``max_tokens`` (what is left of the episode budget), ``temperature``, ``top_p``, the
    sample's ``seed`` (the same on every turn) and, for tool-use rows, ``tools`` (and ``tool_choice`` unless
    "omit"). The answer becomes the turn's text (:func:`_turn_text`) and the next turn's history message
    (``envs.tool_use.history.assistant_message``, the training loop's): a turn's ``reasoning_content`` stays in
    the history, back inside ``<think>...</think>`` in front of the content, as training keeps the turn's own
    tokens; a server that parsed the calls gets them back in its own format (assistant ``tool_calls``, each
    observation with its ``tool_call_id``).

    The episode's token budget, as training counts it (``max_tokens``: model + tool/template tokens after the
    prompt; the local engine's rule, ``engine.EngineGenerate``): the tool observations and template tokens
    appended since the last turn are only known from the server's ``usage`` of the next request (its
    ``prompt_tokens`` minus the previous request's prompt and completion tokens). When they leave no budget, the
    turn is dropped and the episode ends without it (``episode.NO_BUDGET``, as training ends it); when the turn
    is longer than what they leave, it is asked again with that ``max_tokens`` (the same seed, so a server that
    samples deterministically per seed, as vLLM does, returns the same turn cut there). Without ``usage`` the
    observations are not counted.

    Errors: a 400 whose message gives the context numbers is asked again with the ``max_tokens`` that fits; a
    400 about ``tool_choice`` is re-raised with what to do; a context-window 400 on a later turn ends the
    episode as cut (``episode.CONTEXT_FULL``); anything else is raised (``RequestFailed``, ``ServerUnreachable``).

    Args:
        client: an open ``ChatClient`` (or any object with its ``chat(messages, **params)``).
        settings: the sampling settings.
    """

    def __init__(self, client: Any, settings: EvalSettings):
        self.client = client
        self.s = settings

    async def _chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> ChatResult:
        try:
            return await self.client.chat(messages, **params)
        except RequestFailed as err:
            msg = str(err)
            if "HTTP 400" not in msg:
                raise
            if "tool" in msg.lower() and "choice" in msg.lower():
                raise RequestFailed(
                    f"{msg}\nThe server refuses tool requests with its default tool_choice: pass --tool-choice none "
                    "(tools stay in the prompt, calls are parsed here), or start vLLM with --enable-auto-tool-choice "
                    "--tool-call-parser hermes."
                ) from err
            fit = _fitted_max_tokens(msg)
            max_tokens = params.get("max_tokens")
            if fit is not None and max_tokens is not None and 0 < fit < max_tokens:
                # vLLM/SGLang reject prompt + max_tokens beyond the context window instead of capping it (as
                # verl's rollout servers do): ask again for what fits
                return await self.client.chat(messages, **{**params, "max_tokens": fit})
            raise

    @staticmethod
    def _added_tokens(req: TurnRequest, res: ChatResult) -> int:
        """Tokens of the context appended since the episode's previous turn (observations, template), from
        ``usage``: this request's prompt tokens minus the previous request's prompt + completion tokens; 0 on
        the first turn or when the server reports no usage."""
        before = req.state.get("next_context")
        if before is None or res.prompt_tokens is None:
            return 0
        return max(0, int(res.prompt_tokens) - int(before))

    async def __call__(self, req: TurnRequest) -> TurnResult:
        """One turn through the server (see the class docstring)."""
        params: dict[str, Any] = {
            "max_tokens": req.max_tokens,
            "temperature": self.s.temperature,
            "top_p": self.s.top_p,
            "seed": req.seed,
        }
        if req.tools:
            params["tools"] = req.tools
            if self.s.tool_choice != "omit":
                params["tool_choice"] = self.s.tool_choice
        try:
            res = await self._chat(req.messages, params)
            added = self._added_tokens(req, res)
            if added and req.max_tokens is not None:
                left = req.max_tokens - added
                if left <= 0:  # the observations fill the budget: training ends the episode without this turn
                    return TurnResult(generated=False, finish_reason=NO_BUDGET)
                if res.completion_tokens is not None and res.completion_tokens > left:  # cut where training cuts
                    res = await self._chat(req.messages, {**params, "max_tokens": left})
        except RequestFailed as err:
            if req.turn == 0 or "HTTP 400" not in str(err) or not _CONTEXT_ERR.search(str(err)):
                raise  # the first turn must fit: a setting (--max-tokens) or the data is wrong
            return TurnResult(generated=False, finish_reason=CONTEXT_FULL, error=str(err)[:300])
        if res.prompt_tokens is not None and res.completion_tokens is not None:
            req.state["next_context"] = res.prompt_tokens + res.completion_tokens
        # the training loop's history message: the reasoning the server split off goes back in front of the
        # content; calls the server parsed go back in its format (ids included), others stay in the text
        message = assistant_message(res.content, res.tool_calls or None, reasoning=res.reasoning)
        return TurnResult(
            text=_turn_text(res),
            finish_reason=res.finish_reason,
            prompt_tokens=res.prompt_tokens,
            completion_tokens=res.completion_tokens,
            message=message,
            tool_call_ids=[tc.get("id") for tc in res.tool_calls],
        )


# ------------------------------------------------------------------------------------------------ run


def pending_samples(problems: Sequence[EvalProblem], k: int, done: Sequence[Mapping[str, Any]]) -> list[tuple]:
    """(problem, sample_index) pairs not yet in ``done``, problem-major."""
    have = {(str(r["problem_id"]), int(r["sample_index"])) for r in done}
    return [(p, j) for p in problems for j in range(k) if (p.problem_id, j) not in have]


def rescore_unverified(
    problems: Sequence[EvalProblem], settings: EvalSettings, results: ResultsFile, done: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``done`` with every ``unverified`` record (the answer checker gave no verdict) scored again from its stored
    response (``episode.rescore_record``, ``settings.reward_kwargs``); the records whose scoring changed are
    rewritten in ``results`` (:meth:`ResultsFile.replace`). A sample still unverified stays so: scored again on
    the next resume while its ``score_attempts`` is below :data:`MAX_SCORE_ATTEMPTS`, then never again (its
    "unverified" is final: a checker that fails every time on it would be run on every resume). Logs how many were
    scored again, how many are left unverified and how many of those for good.

    Raises:
        ValueError: invalid reward options.
    """
    by_id = {p.problem_id: p for p in problems}
    out, changed, n_again = [], {}, 0
    for r in done:
        problem = by_id.get(str(r["problem_id"]))
        again = int(r.get("score_attempts") or 1) < MAX_SCORE_ATTEMPTS
        if r.get("verdict") == UNVERIFIED and problem is not None and again:
            n_again += 1
            row = EvalRecord.model_validate(rescore_record(problem, r, settings.reward_kwargs)).model_dump()
            if row != r:
                changed[(str(r["problem_id"]), int(r["sample_index"]))] = row
            r = row
        out.append(r)
    if changed:
        results.replace(changed)
    if n_again:
        left = [r for r in out if r["verdict"] == UNVERIFIED]
        final = sum(int(r.get("score_attempts") or 1) >= MAX_SCORE_ATTEMPTS for r in left)
        logger.warning("%s: scored %d unverified sample(s) again from their stored responses; %d still unverified "
                       "(%d of them scored %d times: unverified for good)", results.path, n_again, len(left), final,
                       MAX_SCORE_ATTEMPTS)
    return out


def resume_split(
    problems: Sequence[EvalProblem], settings: EvalSettings, results: ResultsFile
) -> tuple[list[dict[str, Any]], list[Sample]]:
    """What ``results`` already holds for ``problems`` (records with sample_index < k; unverified ones scored
    again, :func:`rescore_unverified`) and the samples still to run (problem-major; sample j of problem i asked
    with ``sample_seed(settings.seed, i, j)``)."""
    wanted = {p.problem_id for p in problems}
    done = [r for r in results.load() if r["problem_id"] in wanted and int(r["sample_index"]) < settings.k]
    done = rescore_unverified(problems, settings, results, done)
    todo = [Sample(p, j, sample_seed(settings.seed, p.index, j)) for p, j in pending_samples(problems, settings.k, done)]
    return done, todo


async def record_samples(
    problems: Sequence[EvalProblem],
    settings: EvalSettings,
    results: ResultsFile,
    generate: Any,
    *,
    done: Sequence[dict[str, Any]],
    todo: Sequence[Sample],
    concurrency: int,
    runner: Any = None,
    max_tokens: int | None = None,
    special_tokens: Sequence[str] = (),
    desc: str = "eval",
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``todo`` through the episode driver (``episode.run_samples``) and append each record to ``results``
    as soon as it is scored (a tqdm bar on stderr with the running accuracy when ``progress``).

    Args:
        problems, settings, results: of the evaluation; ``done``, ``todo``: from :func:`resume_split`.
        generate: the driver's ``generate`` (:class:`ChatGenerate`, ``engine.EngineGenerate``).
        concurrency: episodes in flight.
        runner: the ``ToolCallRunner`` of tool-use rows; max_tokens: the episode budget (default
            ``settings.max_tokens``); special_tokens: removed from the scored text.
        on_record: called with each new record (a dict, :data:`RECORD_KEYS`) after it is written.
    Returns:
        every record of ``problems`` with sample_index < k (earlier and new, as dicts), in problem/sample order.
    Raises:
        whatever an episode raises first (what was written stays; run again to resume).
    """
    from tqdm.auto import tqdm

    new: list[dict[str, Any]] = []
    total = len(problems) * settings.k
    bar = tqdm(total=total, initial=total - len(todo), desc=desc, unit="sample", disable=not progress,
               dynamic_ncols=True)
    n_correct = sum(bool(r["correct"]) for r in done)
    n_unverified = sum(r.get("verdict") == UNVERIFIED for r in done)

    def written(rec: EvalRecord) -> None:
        nonlocal n_correct, n_unverified
        row = rec.model_dump()
        results.append(row)
        new.append(row)
        n_correct += row["correct"]
        n_unverified += row["verdict"] == UNVERIFIED
        bar.update(1)
        post = {"acc": f"{n_correct / max(1, len(done) + len(new)):.3f}"}
        if n_unverified:
            post["unverified"] = n_unverified
        bar.set_postfix(post, refresh=False)
        if on_record is not None:
            on_record(row)

    try:
        await run_samples(todo, generate, concurrency=concurrency, on_record=written,
                          max_tokens=settings.max_tokens if max_tokens is None else max_tokens,
                          max_turns=settings.max_turns, runner=runner, reward_kwargs=settings.reward_kwargs,
                          special_tokens=special_tokens)
    finally:
        bar.close()
    return record_order(problems, settings.k, [*done, *new])


def record_order(
    problems: Sequence[EvalProblem], k: int, records: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """``records`` of ``problems`` (sample_index < k), one per (problem_id, sample_index) (the first:
    ``metrics.unique_records``), in problem/sample order (file order of the problems); others are left out."""
    order = {(p.problem_id, j): (p.index, j) for p in problems for j in range(k)}
    recs = {}
    for r in unique_records(records):
        key = (str(r["problem_id"]), r["sample_index"])
        if key in order:
            recs[key] = r
    return [recs[key] for key in sorted(recs, key=lambda key: order[key])]


def tool_runner(tools: dict[str, Any], settings: EvalSettings, tool_timeout_s: float | None = None) -> Any:
    """The training loop's ``envs.tool_use.episode.ToolCallRunner`` over ``tools`` with the settings' per-turn
    call limit, observation cut and deadline (``tool_timeout_s`` overrides ``settings.tool_timeout_s``)."""
    from envs.tool_use.episode import ToolCallRunner

    return ToolCallRunner(
        tools,
        max_parallel_calls=settings.max_parallel_calls,
        tool_timeout_s=settings.tool_timeout_s if tool_timeout_s is None else tool_timeout_s,
        max_tool_response_chars=settings.max_tool_response_chars,
        truncate_side=settings.tool_response_truncate_side,
    )


async def run_api_eval(
    problems: Sequence[EvalProblem],
    client: ChatClient,
    settings: EvalSettings,
    results: ResultsFile,
    *,
    tools: dict[str, Any] | None = None,
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Draw the missing samples of ``problems`` through ``client`` and append them to ``results``.

    ``client.check_model()`` must have been called (it fixes the model name). Samples run ``max_concurrency``
    at a time (:class:`ChatGenerate` under the episode driver); the first error that is not the sample's own
    (unreachable server, a rejected request, a failure after all retries) stops the run, keeping what was
    written (run again to resume).

    Args:
        problems: from :func:`load_problems`.
        client: an open :class:`ChatClient`.
        settings: sampling and episode settings.
        results: the output file (already-answered samples are skipped).
        tools: name -> verl tool (:func:`load_tools`); needed when a problem is a tool-use one.
        progress: show a tqdm bar on stderr.
        on_record: called with each new record (a dict) after it is written.
    Returns:
        every record of ``problems`` with sample_index < k (earlier and new, dicts of :data:`RECORD_KEYS`), in
        problem/sample order.
    Raises:
        EvalClientError: see above. ValueError: tool-use problems without ``tools``.
    """
    if any(p.tool_use for p in problems) and not tools:
        raise ValueError("tool-use problems need tools (load_tools())")
    done, todo = resume_split(problems, settings, results)
    return await record_samples(
        problems, settings, results, ChatGenerate(client, settings), done=done, todo=todo,
        concurrency=client.config.max_concurrency, runner=tool_runner(tools or {}, settings), progress=progress,
        on_record=on_record,
    )
