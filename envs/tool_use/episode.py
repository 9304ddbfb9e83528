"""One tool-call runner and one episode-statistics type for every tool-use episode (verl-free at import).

Used by the training loop (``envs.tool_use.agent_loop.StareToolAgentLoop``) and by the evaluations, so a "tool
error", the observation cut, the deadline and the per-turn call limit mean the same everywhere:

- **tool error** = a malformed call (bad JSON, no name, unknown tool, bad arguments, unclosed, or beyond the
  per-turn limit) + a tool that raised + a call past its deadline or reported ``timed_out`` by the tool. Code
  that ran and failed (a traceback, a non-zero exit) is a *result* the model reads, not a tool error.
- **per-turn limit**: calls after the first ``max_parallel_calls`` of a turn are answered with an error and
  counted as malformed; nothing is run for them.
- **deadline**: ``tool_timeout_s`` seconds of wall clock around create -> execute -> release of one call, on top
  of the tool's own limits; a call past it is cancelled and answered "did not finish". It starts once the tool
  has a free slot: a tool that says how many calls it runs at once (``max_concurrent_calls``, e.g. the sandbox's
  ``max_concurrency``) gets at most that many at a time, so a call queued behind others (800 evaluation episodes
  on 8 sandbox slots, a loaded machine) waits for its turn instead of timing out while it waits.
- **observation cut**: every observation (tool output, a tool's error or warning, a timeout notice, the error
  written for a malformed call) is cut to at most ``max_tool_response_chars`` characters, marker included, on
  ``truncate_side`` (``"left"`` keeps the end, ``"right"`` the start, ``"middle"`` both ends): one rule,
  ``envs.tools.observation.cut_text``.
- **no control tokens from text**: every observation, and every assistant message put back into the chat
  history (:meth:`ToolCallRunner.history_message`: content, reasoning, tool-call names and arguments), has its
  control-token strings broken (``envs.tools.observation``), so a tokenizer encodes them as text, never as
  ``<|im_end|>`` and the like. This runner is where all three paths (training loop, API evaluation, local and
  held-out evaluations) get the text they encode, so the rule holds in all of them.

Tools are verl ``BaseTool``-shaped objects (``create``/``execute``/``release``, optional
``release_trajectory(request_id)``), read by duck typing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Literal

from envs.contract import END_OF_TURN_TOKENS
from envs.tool_use.parser import ParsedCall
from envs.tools.observation import ControlTokenEscaper, cut_text

__all__ = ["EpisodeStats", "ToolCallRunner", "end_token_ids", "turn_termination"]

logger = logging.getLogger(__name__)
TURN_MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>")
"""The markup of an assistant turn that its history message keeps (the model's own structure, not forged text)."""
_MARKUP_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in TURN_MARKUP) + ")")


def _escape_turn_text(text: str, escape) -> str:
    """``text`` with ``escape`` applied between the pieces of :data:`TURN_MARKUP` (the tags themselves kept)."""
    parts = _MARKUP_SPLIT.split(text)
    return "".join(p if i % 2 else escape(p) for i, p in enumerate(parts))

TruncateSide = Literal["left", "middle", "right"]

_ADMISSION: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""tool -> (event loop, semaphore of its ``max_concurrent_calls``): shared by every runner over the same tool object
(the training loop builds a runner per sample), one per event loop (an evaluation runs one loop per temperature)."""


def _admission(tool: Any) -> Any:
    """An async context manager that waits for one of ``tool.max_concurrent_calls`` slots (a null context when the
    tool does not say, or says None / a number below 1, or cannot be weakly referenced)."""
    n = getattr(tool, "max_concurrent_calls", None)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return contextlib.nullcontext()
    loop = asyncio.get_running_loop()
    try:
        held = _ADMISSION.get(tool)
        if held is None or held[0] is not loop or held[2] != n:
            held = (loop, asyncio.Semaphore(n), n)
            _ADMISSION[tool] = held
    except TypeError:  # not weakly referenceable
        return contextlib.nullcontext()
    return held[1]


@dataclass
class EpisodeStats:
    """Counters of one tool-use episode.

    Attributes:
        termination: "answer" | "length" | "max_assistant_turns" | "max_user_turns" | "aborted".
        hit_eos: the last turn was ended by the model (False: cut by the length limit or aborted).
        num_assistant_turns: assistant turns generated.
        num_tool_calls: call attempts (malformed included).
        num_tool_executed: calls the tool ran to a result (timed-out-by-the-tool included).
        num_malformed_calls, num_tool_exceptions, num_tool_timeouts: see the module docstring.
        tool_time_s: seconds spent answering calls (wall clock, summed over calls).
        tool_call_log: one ``{"name", "arguments" (valid calls), "error" (None | "malformed" | "exception" |
            "timeout"), "seconds"}`` per call.
        pending: the calls of the last turn waiting to be answered (training loop state).
    """

    termination: str = "answer"
    hit_eos: bool = True
    num_assistant_turns: int = 0
    num_tool_calls: int = 0
    num_tool_executed: int = 0
    num_malformed_calls: int = 0
    num_tool_exceptions: int = 0
    num_tool_timeouts: int = 0
    tool_time_s: float = 0.0
    tool_call_log: list[dict[str, Any]] = field(default_factory=list)
    pending: list[ParsedCall] = field(default_factory=list)

    @property
    def num_tool_errors(self) -> int:
        """Calls that did not produce a normal tool result: malformed + exceptions + timeouts."""
        return self.num_malformed_calls + self.num_tool_exceptions + self.num_tool_timeouts

    @property
    def truncated(self) -> bool:
        """The last turn was cut (not ended by the model)."""
        return not self.hit_eos

    def counters(self) -> dict[str, Any]:
        """The per-episode fields the training loop puts in ``extra_fields`` (and the reward sees)."""
        return {
            "hit_eos": bool(self.hit_eos),
            "termination": self.termination,
            "num_assistant_turns": int(self.num_assistant_turns),
            "num_tool_calls": self.num_tool_calls,
            "num_tool_executed": self.num_tool_executed,
            "num_malformed_calls": self.num_malformed_calls,
            "num_tool_exceptions": self.num_tool_exceptions,
            "num_tool_timeouts": self.num_tool_timeouts,
            "num_tool_errors": self.num_tool_errors,
            "tool_time_s": float(self.tool_time_s),
            "tool_call_log": self.tool_call_log,
        }


def turn_termination(
    stats: EpisodeStats,
    *,
    calls: list[ParsedCall],
    assistant_turns: int,
    user_turns: int,
    max_assistant_turns: int | None,
    max_user_turns: int | None,
    budget_spent: bool,
) -> str | None:
    """After an assistant turn that was not cut: why the episode ends now, or None to answer its calls.

    Order (the training loop's): no call -> "answer"; ``assistant_turns >= max_assistant_turns`` ->
    "max_assistant_turns"; ``user_turns >= max_user_turns`` -> "max_user_turns"; the response budget spent ->
    "length". A returned reason is also stored in ``stats.termination``. A limit of None or 0 is no limit.
    """
    reason = None
    if not calls:
        reason = "answer"
    elif max_assistant_turns and assistant_turns >= max_assistant_turns:
        reason = "max_assistant_turns"
    elif max_user_turns and user_turns >= max_user_turns:
        reason = "max_user_turns"
    elif budget_spent:
        reason = "length"
    if reason is not None:
        stats.termination = reason
    return reason


def end_token_ids(tokenizer: Any) -> set[int]:
    """Token ids that end a model turn: the tokenizer's EOS id(s) and those of ``envs.contract.END_OF_TURN_TOKENS``
    in its vocabulary (a turn that stops on one of them was ended by the model, not cut)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = {int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos]) if t is not None}
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: EOS only
        vocab = {}
    ids.update(int(vocab[t]) for t in END_OF_TURN_TOKENS if t in vocab)
    return ids


class ToolCallRunner:
    """Answers the parsed calls of a turn: runs the well-formed ones (within the per-turn limit and the deadline),
    explains the others, counts everything in an :class:`EpisodeStats` and cuts the observations.

    Args:
        tools: name -> tool (verl ``BaseTool`` shape).
        max_parallel_calls: calls run per turn (>= 1).
        tool_timeout_s: deadline of one call in seconds (> 0).
        max_tool_response_chars: longest observation in characters, marker included (>= 1).
        truncate_side: "left" | "middle" | "right".
        control_tokens: more strings to keep out of the encoded text, besides
            ``envs.tools.observation``'s defaults (a tokenizer's: ``tokenizer_control_tokens``).
    Raises:
        ValueError: a limit out of range or an unknown side.
    """

    def __init__(
        self,
        tools: dict[str, Any],
        *,
        max_parallel_calls: int = 1,
        tool_timeout_s: float = 60.0,
        max_tool_response_chars: int = 1024,
        truncate_side: TruncateSide = "middle",
        control_tokens: tuple[str, ...] | list[str] = (),
    ):
        if not tool_timeout_s or float(tool_timeout_s) <= 0:
            raise ValueError(f"tool_timeout_s must be > 0, got {tool_timeout_s!r}")
        if int(max_parallel_calls) < 1 or int(max_tool_response_chars) < 1:
            raise ValueError("max_parallel_calls and max_tool_response_chars must be >= 1")
        if truncate_side not in ("left", "middle", "right"):
            raise ValueError(f"truncate_side must be left, middle or right, got {truncate_side!r}")
        self.tools = tools
        self.max_parallel_calls = int(max_parallel_calls)
        self.tool_timeout_s = float(tool_timeout_s)
        self.max_tool_response_chars = int(max_tool_response_chars)
        self.truncate_side = truncate_side
        self.escape = ControlTokenEscaper(control_tokens)

    @property
    def schemas(self) -> dict[str, Any]:
        """name -> the tool's OpenAI function schema (what the parser checks arguments against)."""
        return {name: getattr(tool, "tool_schema", None) for name, tool in self.tools.items()}

    async def answer_turn(self, calls: list[ParsedCall], stats: EpisodeStats, context: Any) -> list[str]:
        """The observations of one turn's calls, in order (run concurrently).

        Args:
            calls: from ``envs.tool_use.parser.parse_tool_calls``.
            stats: updated in place.
            context: passed to the tools as ``agent_data`` (needs ``request_id``; ``tools_kwargs`` and
                ``tool_rewards`` are used when present).
        """
        return list(await asyncio.gather(*(self.answer(i, c, stats, context) for i, c in enumerate(calls))))

    async def answer(self, index: int, call: ParsedCall, stats: EpisodeStats, context: Any) -> str:
        """The observation text for the ``index``-th call of a turn; runs it when it is well-formed and within
        the per-turn limit. Never raises for a failing tool."""
        stats.num_tool_calls += 1
        entry: dict[str, Any] = {"name": call.name, "error": None, "seconds": 0.0}
        if call.ok:
            entry["arguments"] = json.dumps(call.arguments, ensure_ascii=False)
        if call.ok and index >= self.max_parallel_calls:
            call = ParsedCall(
                call.raw,
                name=call.name,
                error=f"Error: at most {self.max_parallel_calls} tool call(s) per turn; this one was not run.",
            )
        if not call.ok:
            stats.num_malformed_calls += 1
            entry["error"] = "malformed"
            stats.tool_call_log.append(entry)
            return self.observation(call.error or "Error: malformed tool call; nothing was run.")

        tool = self.tools[call.name]
        async with _admission(tool):  # the deadline starts once the tool has a slot for this call
            return await self._run_admitted(tool, call, stats, context, entry)

    async def _run_admitted(self, tool: Any, call: ParsedCall, stats: EpisodeStats, context: Any,
                            entry: dict[str, Any]) -> str:  # fmt: skip
        t0 = time.perf_counter()
        try:
            text, metrics = await asyncio.wait_for(self._execute(tool, call, context), timeout=self.tool_timeout_s)
        except asyncio.TimeoutError:
            stats.num_tool_timeouts += 1
            entry["error"] = "timeout"
            text = f"Error: the tool call did not finish within {self.tool_timeout_s:g} s and was stopped."
        except Exception as err:  # noqa: BLE001 - a failing tool must not end the episode
            logger.warning("tool %s failed: %r", call.name, err)
            stats.num_tool_exceptions += 1
            entry["error"] = "exception"
            text = f"Error: tool '{call.name}' failed: {type(err).__name__}: {err}"
        else:
            stats.num_tool_executed += 1
            if isinstance(metrics, dict) and metrics.get("timed_out"):
                stats.num_tool_timeouts += 1
                entry["error"] = "timeout"
        seconds = time.perf_counter() - t0
        stats.tool_time_s += seconds
        entry["seconds"] = round(seconds, 4)
        stats.tool_call_log.append(entry)
        return self.observation(text)

    async def _execute(self, tool: Any, call: ParsedCall, context: Any) -> tuple[str, dict]:
        """create -> execute -> release of one tool (release also on failure/cancellation)."""
        kwargs = (getattr(context, "tools_kwargs", None) or {}).get(call.name, {}) or {}
        instance_id, _ = await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
        try:
            response, reward, metrics = await tool.execute(instance_id, call.arguments, agent_data=context)
        finally:
            await asyncio.shield(tool.release(instance_id))
        rewards = getattr(context, "tool_rewards", None)
        if reward is not None and isinstance(rewards, list):
            rewards.append(reward)
        if hasattr(response, "text"):  # verl ToolResponse
            if getattr(response, "image", None) or getattr(response, "video", None):
                logger.warning("tool %s returned images/video; only its text is used", call.name)
            return response.text or "", metrics
        return str(response), metrics

    def truncate(self, text: str) -> str:
        """``text`` cut to at most ``max_tool_response_chars`` characters (marker included) on ``truncate_side``."""
        return cut_text(text or "", self.max_tool_response_chars, self.truncate_side)

    def observation(self, text: str) -> str:
        """The text of one observation as it enters the context: control tokens broken, then cut (every answer
        of :meth:`answer` goes through here)."""
        out = self.truncate(self.escape(str(text or "")))
        again = self.escape(out)  # a cut cannot join pieces into a token; checked anyway
        return out if again == out else again[: self.max_tool_response_chars]

    def history_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """A copy of an assistant ``message`` safe to put back into the chat history. The text the model wrote
        inside its tool calls (names and arguments, in ``tool_calls`` or between ``<tool_call>`` tags of the
        content) has every control-token string broken; the rest of its text (content, reasoning) too, except the
        turn's own markup (:data:`TURN_MARKUP`: think and tool-call tags), which stays as the model wrote it, so
        the history renders to the context the model generated in (what training keeps as token ids)."""
        out = dict(message)
        for key in ("content", "reasoning_content"):
            if isinstance(out.get(key), str):
                out[key] = _escape_turn_text(out[key], self.escape)
        if out.get("tool_calls"):
            out["tool_calls"] = [self.escape.message(c) if isinstance(c, dict) else c for c in out["tool_calls"]]
        return out

    async def release_trajectory(self, request_id: str) -> None:
        """Close per-trajectory tool state (tools with ``release_trajectory``); errors are logged, never raised."""
        for name, tool in self.tools.items():
            release = getattr(tool, "release_trajectory", None)
            if release is None:
                continue
            try:
                await release(request_id)
            except Exception:  # noqa: BLE001 - cleanup must not fail the episode
                logger.exception("release_trajectory of tool %s failed", name)
