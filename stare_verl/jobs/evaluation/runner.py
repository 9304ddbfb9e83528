"""Sample k answers per problem from a chat-completions server, run tool calls, score, and write JSONL.

Data: a verl RLHF parquet written by the project (``envs.datasets`` / ``envs.tool_use.task`` /
``stare_verl.jobs.demo``): ``prompt`` (chat messages), ``data_source``, ``reward_model.ground_truth``,
``extra_info``; :func:`load_problems` checks the schema and says what is wrong.

One sample = one episode:

- plain rows (short / long CoT): one request; the answer (with ``reasoning_content`` put back inside
  ``<think>...</think>`` when the server splits it off) is scored by ``envs.reward.compute_score`` with the
  row's ``extra_info`` (its ``family`` picks the options) and the finish reason (``length`` = truncated =
  no answer), as in training.
- tool-use rows (``agent_name: stare_tool_agent``, ``extra_info.family: tool_use`` or ``tools_kwargs``): the
  training loop's logic over the API. The request carries the tool schemas (``tools``); each assistant turn
  is parsed with ``envs.tool_use.parser.parse_tool_calls`` (hermes ``<tool_call>`` in the content, calls inside
  ``<think>`` ignored, malformed calls answered with an error observation; a server that parses tool calls
  itself returns ``tool_calls``, which are read the same way); every call is answered by the training loop's
  tool-call runner (``envs.tool_use.episode.ToolCallRunner``: the ``code_interpreter`` tool in the sandbox, the
  loop-side deadline, the observation cut to ``max_tool_response_chars``) and sent back as a ``tool``
  message. The episode ends on a turn without a tool call, a turn cut by the length limit (never run), at
  ``max_turns`` assistant turns, or when the token budget ``max_tokens`` (model + tool tokens of all turns,
  as verl's ``response_length``; measured from the server's ``usage``) is spent. Only the model-generated
  text, tool calls removed, is scored (``envs.tool_use.task.compute_score``): tool output is never credited.

Results: one JSON line per sample (:data:`RECORD_KEYS`) appended as soon as the sample is scored; a
``<out>.meta.json`` next to it records the settings. Run again with the same output and settings to
resume: answered (problem_id, sample_index) pairs are not asked again, a torn last line is dropped;
different settings raise :class:`ResumeMismatch` (a larger ``k`` is allowed: only the new samples run).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envs.contract import AGENT_NAME
from stare_verl.jobs.evaluation.client import ChatClient, ChatResult, RequestFailed

__all__ = [
    "RECORD_KEYS",
    "DatasetError",
    "EvalProblem",
    "EvalSettings",
    "ResultsBusy",
    "ResultsFile",
    "ResumeMismatch",
    "load_problems",
    "load_tools",
    "pending_samples",
    "run_api_eval",
    "sample_seed",
    "score_sample",
]

logger = logging.getLogger(__name__)

SEED_STRIDE = 1_000_003  # seeds of one problem's samples: base + problem_index * SEED_STRIDE + sample_index

RECORD_KEYS = (
    "problem_id",  # str: data_source/split/index (row position when the row has no index)
    "problem_index",  # int: row position in the data file
    "sample_index",  # int: 0..k-1
    "data_source",  # str
    "ground_truth",  # str or list
    "seed",  # int or None: the request seed
    "response",  # str: the scored model text (tool calls removed; tool output never included)
    "extracted_answer",  # str: the normalised answer the scorer read ("" when none)
    "has_answer",  # bool
    "correct",  # bool: envs.reward acc
    "score",  # float: the training reward (overlong penalty included when configured)
    "finish_reason",  # str: of the last turn ("stop", "length", ...)
    "truncated",  # bool: the last turn was cut by the length limit
    "termination",  # str: answer | length | max_assistant_turns
    "tokens",  # int or None: model-generated tokens (usage.completion_tokens summed over turns)
    "response_tokens",  # int or None: model + tool/template tokens after the prompt (verl's response length)
    "chars",  # int: characters of "response"
    "turns",  # int: assistant turns
    "tool_calls",  # int: call attempts (malformed included)
    "tool_executed",  # int
    "malformed_calls",  # int
    "tool_errors",  # int: malformed + exceptions + timeouts
    "tool_timeouts",  # int
    "tool_time_s",  # float
    "reflections",  # dict: envs.scoring.reflection counts of "response" (per word and "total")
    "error",  # str or None: why a sample ended early (e.g. the server's context-length message)
)

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

    def fingerprint(self, model: str, data: str) -> dict[str, Any]:
        """What must match for earlier samples to be reused (``k`` may grow)."""
        d = self.model_dump(exclude={"k"})
        return {"model": model, "data": data, **d}


def sample_seed(base: int | None, problem_index: int, sample_index: int) -> int | None:
    """Request seed of sample ``sample_index`` of problem ``problem_index`` (None when ``base`` is None)."""
    if base is None:
        return None
    return int(base) + int(problem_index) * SEED_STRIDE + int(sample_index)


# ---------------------------------------------------------------------------------------------- data


@dataclass
class EvalProblem:
    """One evaluation problem (a data row).

    Attributes:
        index: row position; problem_id: stable id (see ``RECORD_KEYS``); data_source; prompt: chat messages;
        ground_truth: as in ``reward_model.ground_truth``; extra_info: the row's (plain Python types);
        tool_use: the row asks for the tool loop.
    """

    index: int
    problem_id: str
    data_source: str
    prompt: list[dict[str, Any]]
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    tool_use: bool = False


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
        info = dict(row.get("extra_info") or {})
        src = str(row.get("data_source") or "")
        if info.get("index") is not None:
            pid = f"{src}/{info.get('split', '')}/{info['index']}"
        else:
            pid = f"{src}/row{i}"
        is_tool = (
            row.get("agent_name") == AGENT_NAME or info.get("family") == "tool_use" or bool(info.get("tools_kwargs"))
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


class ResultsFile:
    """The per-sample JSONL file and its ``.meta.json`` (settings fingerprint).

    Args:
        path: the JSONL file (its folder is created).
        fingerprint: ``EvalSettings.fingerprint(...)`` of this run.
        overwrite: discard an existing file instead of resuming.
    Raises:
        ResumeMismatch: the existing file was written with another fingerprint (and not ``overwrite``).
        ResultsBusy: another process has the file open (an exclusive ``flock`` on ``<path>.lock``, held until
            :meth:`close`).
    """

    def __init__(self, path: str | Path, fingerprint: Mapping[str, Any], overwrite: bool = False):
        self.path = Path(path)
        self.meta_path = self.path.with_name(self.path.name + ".meta.json")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fp = json.loads(json.dumps(dict(fingerprint), default=str))
        self._f = None
        self._lock = self.path.with_name(self.path.name + ".lock").open("w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            self._lock.close()
            raise ResultsBusy(f"another evaluation is writing {self.path}; wait for it or use another --out") from err
        if overwrite:
            self.path.unlink(missing_ok=True)
        elif self.path.exists() and self.meta_path.exists():
            old = json.loads(self.meta_path.read_text())
            if old != fp:
                self.close()
                diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
                raise ResumeMismatch(
                    f"{self.path} holds samples drawn with other settings ({', '.join(diff)} differ: "
                    f"{ {k: old.get(k) for k in diff} } vs { {k: fp.get(k) for k in diff} }). "
                    "Use another --out, or --overwrite to start over."
                )
        self.meta_path.write_text(json.dumps(fp, indent=1, sort_keys=True))

    def load(self) -> list[dict[str, Any]]:
        """The records already in the file; a torn (unterminated or unreadable) last line is cut off."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1]
        out = []
        for line in keep.splitlines():
            try:
                rec = json.loads(line)
                if isinstance(rec, dict) and "problem_id" in rec and "sample_index" in rec:
                    out.append(rec)
            except ValueError:
                continue
        if len(keep) != len(data):
            logger.warning("%s: dropped an unfinished last line (interrupted run)", self.path)
            with self.path.open("r+b") as f:
                f.truncate(len(keep))
        return out

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


# ---------------------------------------------------------------------------------------------- scoring


def score_sample(problem: EvalProblem, text: str, info: Mapping[str, Any], reward_kwargs: Mapping[str, Any]) -> dict:
    """Score one sample's model text with the training reward (``envs.tool_use.task.compute_score`` for tool-use
    rows, which scores ``info["model_response_text"]``; ``envs.reward.compute_score`` otherwise)."""
    extra = {**problem.extra_info, **info}
    if problem.tool_use:
        from envs.tool_use.task import compute_score

        extra["model_response_text"] = text
    else:
        from envs.reward import compute_score
    return compute_score(problem.data_source, text, problem.ground_truth, extra, **dict(reward_kwargs))


def _turn_text(res: ChatResult) -> str:
    """The assistant turn as the model wrote it: reasoning back inside think tags, structured tool calls back
    as hermes blocks (so ``parse_tool_calls`` applies the training loop's rules to them)."""
    text = res.content
    if res.reasoning:
        text = f"<think>{res.reasoning}</think>{text}"
    for tc in res.tool_calls:
        fn = tc.get("function") or {}
        text += "\n<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}) + "\n</tool_call>"
    return text


def _record(problem: EvalProblem, j: int, seed: int | None, text: str, score: Mapping[str, Any], ep: dict) -> dict:
    from envs.scoring.reflection import REFLECTION_PATTERNS

    refl = {k: int(score.get(f"reflect_{k}", 0)) for k in REFLECTION_PATTERNS}
    refl["total"] = int(score.get("reflect_total", 0))
    st = ep["stats"]
    rec = {
        "problem_id": problem.problem_id,
        "problem_index": problem.index,
        "sample_index": j,
        "data_source": problem.data_source,
        "ground_truth": problem.ground_truth,
        "seed": seed,
        "response": text,
        "extracted_answer": score.get("pred", ""),
        "has_answer": bool(score.get("has_answer", False)),
        "correct": bool(score.get("acc", False)),
        "score": float(score.get("score", 0.0)),
        "finish_reason": ep["finish_reason"],
        "truncated": ep["truncated"],
        "termination": ep["termination"],
        "tokens": ep["tokens"],
        "response_tokens": ep["response_tokens"],
        "chars": len(text),
        "turns": ep["turns"],
        "tool_calls": st.num_tool_calls,
        "tool_executed": st.num_tool_executed,
        "malformed_calls": st.num_malformed_calls,
        "tool_errors": st.num_tool_errors,
        "tool_timeouts": st.num_tool_timeouts,
        "tool_time_s": round(float(st.tool_time_s), 4),
        "reflections": refl,
        "error": ep["error"],
    }
    return rec


# ------------------------------------------------------------------------------------------------ run


class _Runner:
    def __init__(self, client: ChatClient, settings: EvalSettings, tools: dict[str, Any] | None):
        from envs.tool_use.episode import ToolCallRunner

        self.client = client
        self.s = settings
        self.tools = tools or {}
        self.calls = ToolCallRunner(
            self.tools,
            max_parallel_calls=settings.max_parallel_calls,
            tool_timeout_s=settings.tool_timeout_s,
            max_tool_response_chars=settings.max_tool_response_chars,
            truncate_side=settings.tool_response_truncate_side,
        )
        self.schemas = self.calls.schemas
        self.tool_dicts = [s.model_dump(exclude_unset=True, exclude_none=True) for s in self.schemas.values()]

    async def _chat(self, messages, tool_use: bool, max_tokens: int | None, seed: int | None) -> ChatResult:
        params: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": self.s.temperature,
            "top_p": self.s.top_p,
            "seed": seed,
        }
        if tool_use and self.tool_dicts:
            params["tools"] = self.tool_dicts
            if self.s.tool_choice != "omit":
                params["tool_choice"] = self.s.tool_choice
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
            if fit is not None and max_tokens is not None and 0 < fit < max_tokens:
                # vLLM/SGLang reject prompt + max_tokens beyond the context window instead of capping it (as
                # verl's rollout servers do): ask again for what fits
                params["max_tokens"] = fit
                return await self.client.chat(messages, **params)
            raise

    async def run_sample(self, p: EvalProblem, j: int) -> dict[str, Any]:
        from envs.tool_use.episode import EpisodeStats, turn_termination
        from envs.tool_use.parser import parse_tool_calls, turn_reward_text

        seed = sample_seed(self.s.seed, p.index, j)
        messages = [dict(m) for m in p.prompt]
        st = EpisodeStats()
        agent_data = SimpleNamespace(
            tools_kwargs=p.extra_info.get("tools_kwargs") or {},
            tool_rewards=[],
            request_id=f"eval-{p.problem_id}-{j}-{os.getpid()}",
        )
        ep = {"finish_reason": "", "truncated": False, "termination": "answer", "tokens": 0, "response_tokens": 0,
              "turns": 0, "stats": st, "error": None}
        budget_total = self.s.max_tokens
        first_prompt: int | None = None
        used = 0  # response tokens so far (model + tool/template), from usage
        usage_known = True
        parts: list[str] = []
        try:
            while True:
                budget = None if budget_total is None else budget_total - used
                if budget is not None and budget <= 0:
                    ep["termination"] = "length"
                    break
                try:
                    res = await self._chat(messages, p.tool_use, budget, seed)
                except RequestFailed as err:
                    if ep["turns"] == 0 or "HTTP 400" not in str(err) or not _CONTEXT_ERR.search(str(err)):
                        raise  # the first turn must fit: a setting (--max-tokens) or the data is wrong
                    # a later turn: the conversation outgrew the server's context window, a cut episode
                    ep.update(truncated=True, termination="length", finish_reason="context_length",
                              error=str(err)[:300])
                    st.hit_eos = False
                    break
                ep["turns"] += 1
                st.num_assistant_turns = ep["turns"]
                ep["finish_reason"] = res.finish_reason
                if res.completion_tokens is None:
                    usage_known = False
                else:
                    ep["tokens"] += int(res.completion_tokens)
                    if res.prompt_tokens is not None:
                        first_prompt = res.prompt_tokens if first_prompt is None else first_prompt
                        used = int(res.prompt_tokens) - first_prompt + int(res.completion_tokens)
                    else:
                        used += int(res.completion_tokens)
                text = _turn_text(res)
                if not p.tool_use:
                    parts.append(text)
                else:
                    visible = turn_reward_text(text)
                    if visible:
                        parts.append(visible)
                if res.finish_reason in ("length", "max_tokens", "abort", "aborted"):
                    # a cut turn is never executed; an aborted one ends as "aborted" (the training loop's rule)
                    cut = "aborted" if res.finish_reason in ("abort", "aborted") else "length"
                    ep.update(truncated=True, termination=cut)
                    st.hit_eos, st.termination = False, cut
                    break
                if not p.tool_use:
                    break
                _, calls = parse_tool_calls(text, self.schemas)
                reason = turn_termination(
                    st, calls=calls, assistant_turns=ep["turns"], user_turns=ep["turns"] - 1,
                    max_assistant_turns=self.s.max_turns, max_user_turns=None,
                    budget_spent=budget_total is not None and used >= budget_total,
                )
                if reason is not None:
                    ep["termination"] = reason
                    break
                observations = await self.calls.answer_turn(calls, st, agent_data)
                if res.tool_calls:  # the server parsed the calls: send them back in its format
                    messages.append({"role": "assistant", "content": res.content or "", "tool_calls": res.tool_calls})
                    ids = [tc.get("id") for tc in res.tool_calls]
                    for i, obs in enumerate(observations):
                        msg = {"role": "tool", "content": obs}
                        if i < len(ids) and ids[i]:
                            msg["tool_call_id"] = ids[i]
                        messages.append(msg)
                else:
                    messages.append({"role": "assistant", "content": res.content})
                    messages.extend({"role": "tool", "content": obs} for obs in observations)
        finally:
            await self.calls.release_trajectory(agent_data.request_id)
        if not usage_known:
            ep["tokens"] = ep["response_tokens"] = None
        else:
            ep["response_tokens"] = used
        text = "\n".join(parts) if p.tool_use else (parts[0] if parts else "")
        info: dict[str, Any] = {"hit_eos": not ep["truncated"], "finish_reason": ep["finish_reason"] or None}
        if ep["tokens"] is not None:
            info["response_length"] = ep["tokens"]
        if p.tool_use:
            info.update(num_assistant_turns=ep["turns"], num_tool_calls=st.num_tool_calls,
                        num_tool_executed=st.num_tool_executed, num_malformed_calls=st.num_malformed_calls,
                        num_tool_timeouts=st.num_tool_timeouts, num_tool_errors=st.num_tool_errors,
                        tool_time_s=st.tool_time_s)
        score = await asyncio.to_thread(score_sample, p, text, info, self.s.reward_kwargs)
        return _record(p, j, seed, text, score, ep)


def pending_samples(problems: Sequence[EvalProblem], k: int, done: Sequence[Mapping[str, Any]]) -> list[tuple]:
    """(problem, sample_index) pairs not yet in ``done``, problem-major."""
    have = {(str(r["problem_id"]), int(r["sample_index"])) for r in done}
    return [(p, j) for p in problems for j in range(k) if (p.problem_id, j) not in have]


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
    at a time; the first error that is not the sample's own (unreachable server, a rejected request, a
    failure after all retries) stops the run, keeping what was written (run again to resume).

    Args:
        problems: from :func:`load_problems`.
        client: an open :class:`ChatClient`.
        settings: sampling and episode settings.
        results: the output file (already-answered samples are skipped).
        tools: name -> verl tool (:func:`load_tools`); needed when a problem is a tool-use one.
        progress: show a tqdm bar on stderr.
        on_record: called with each new record after it is written.
    Returns:
        every record of ``problems`` with sample_index < k (earlier and new), in problem/sample order.
    Raises:
        EvalClientError: see above. ValueError: tool-use problems without ``tools``.
    """
    from tqdm.auto import tqdm

    if any(p.tool_use for p in problems) and not tools:
        raise ValueError("tool-use problems need tools (load_tools())")
    done = results.load()
    wanted = {p.problem_id for p in problems}
    done = [r for r in done if r["problem_id"] in wanted and int(r["sample_index"]) < settings.k]
    todo = pending_samples(problems, settings.k, done)
    runner = _Runner(client, settings, tools)
    queue: asyncio.Queue = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    new: list[dict[str, Any]] = []
    total = len(problems) * settings.k
    bar = tqdm(total=total, initial=total - len(todo), desc="eval", unit="sample", disable=not progress,
               dynamic_ncols=True)
    n_correct = sum(bool(r["correct"]) for r in done)

    async def worker() -> None:
        nonlocal n_correct
        while True:
            try:
                p, j = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            rec = await runner.run_sample(p, j)
            results.append(rec)
            new.append(rec)
            n_correct += rec["correct"]
            bar.update(1)
            bar.set_postfix(acc=f"{n_correct / max(1, len(done) + len(new)):.3f}", refresh=False)
            if on_record is not None:
                on_record(rec)

    n_workers = max(1, min(client.config.max_concurrency, len(todo)))
    tasks = [asyncio.create_task(worker()) for _ in range(n_workers)] if todo else []
    try:
        if tasks:
            finished, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in finished:
                if t.exception() is not None:
                    raise t.exception()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        bar.close()
    order = {(p.problem_id, j): (p.index, j) for p in problems for j in range(settings.k)}
    recs = {(r["problem_id"], int(r["sample_index"])): r for r in done + new}
    return [recs[key] for key in sorted(recs, key=lambda key: order[key])]

