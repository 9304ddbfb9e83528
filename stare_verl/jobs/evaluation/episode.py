"""The evaluation episode driver: one turn loop for every evaluation, over a ``generate`` function.

One sample = one episode of one problem (:class:`EvalProblem`), driven by :func:`run_episode`:

1. ``generate`` makes an assistant turn from the chat so far (:class:`TurnRequest` -> :class:`TurnResult`);
   each turn asks for what is left of the episode's token budget ``max_tokens`` (model + tool/template tokens
   of all turns after the prompt, as verl's ``response_length``).
2. Plain rows (short / long CoT) stop after that turn. Tool-use rows (``EvalProblem.tool_use``): the turn's
   calls are read with the training loop's parser (``envs.tool_use.parser.parse_tool_calls``: hermes
   ``<tool_call>``, calls inside ``<think>`` ignored, malformed calls answered with an error observation) and
   answered by the training loop's tool-call runner (``envs.tool_use.episode.ToolCallRunner``: per-turn call
   limit, loop-side deadline, observation cut); the assistant turn (the training loop's history message,
   ``envs.tool_use.history.assistant_message``: its reasoning kept) and one ``tool`` message per call are
   appended to the chat and the loop goes on.
3. Stop rules (the training loop's, ``envs.tool_use.episode.turn_termination``): a turn without a call
   ("answer"), ``max_turns`` assistant turns ("max_assistant_turns"), the budget spent ("length"); a turn cut
   by the length limit ("length") or aborted ("aborted") is never executed and marks the episode truncated.
4. Only the model-generated text is scored, once (:func:`score_sample`, the training reward): for tool-use rows
   each turn without its tool calls and special-token strings (``envs.tool_use.parser.turn_reward_text``,
   joined with newlines, as the training loop's ``model_response_text``); for plain rows the turn's text
   without special-token strings (verl's single-turn reward decodes without special tokens). Tool output is
   never credited. The record keeps the verdict's kind (:func:`verdict_of`): ``correct``, ``wrong``, or
   ``unverified`` when the answer checker gave none (its time ran out, its worker crashed or failed): such a
   sample scores as wrong, as in training, but is counted apart and scored again (:func:`rescore_record`, from
   the stored response) when the evaluation resumes, at most :data:`MAX_SCORE_ATTEMPTS` times in all
   (``score_attempts``): a checker that fails the same way every time (an error the input always causes) leaves
   the sample unverified for good instead of scoring it again on every resume.

The result is one :class:`EvalRecord` (the evaluation's only record schema; :data:`RECORD_KEYS`), written by
the API evaluation (``runner.run_api_eval``), the local-checkpoint evaluation (``local.run_local_eval``) and
returned by the CPU held-out evaluation (``stare_verl.jobs.demo.evaluate.run_episodes``).

Two ``generate`` implementations: the OpenAI-compatible chat client (``runner.ChatGenerate``: messages in,
the server's answer out) and the local engine (``engine.EngineGenerate``: token-in / token-out through verl's
Continuous Token builder, as the training loop). Batching: :func:`run_samples` keeps ``concurrency``
episodes in flight; a client sends their requests concurrently, the local engine decodes the concurrent
requests as one continuous batch.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CONTEXT_FULL",
    "CUT_REASONS",
    "NO_BUDGET",
    "RECORD_KEYS",
    "EvalProblem",
    "EvalRecord",
    "GenerateFn",
    "MAX_SCORE_ATTEMPTS",
    "Sample",
    "TurnRequest",
    "TurnResult",
    "UNVERIFIED",
    "VERDICTS",
    "rescore_record",
    "run_episode",
    "run_samples",
    "score_sample",
    "tool_schema_dicts",
    "verdict_of",
]

CUT_REASONS = ("length", "max_tokens", "abort", "aborted")  # finish reasons of a turn cut (or aborted) by the server
CONTEXT_FULL = "context_length"  # no turn: the server's context window is full (the episode counts as cut)
NO_BUDGET = "budget"  # no turn: the context already fills the token budget (the episode ends on "length")
VERDICTS = ("correct", "wrong", "unverified")  # EvalRecord.verdict
UNVERIFIED = "unverified"  # the answer checker gave no verdict: scored as wrong, counted apart, re-scored on resume
NO_VERDICT_METHODS = ("timeout", "error")  # envs.scoring.verify's methods of a checker that gave no verdict
MAX_SCORE_ATTEMPTS = 3  # an unverified sample is scored at most this often in all (then its verdict is final)


@dataclass
class EvalProblem:
    """One evaluation problem (a data row).

    Attributes:
        index: row position; problem_id: stable id (``data_source/split/index``, or ``data_source/row<i>``);
        data_source; prompt: chat messages; ground_truth: as in ``reward_model.ground_truth``; extra_info: the
        row's (plain Python types; ``tools_kwargs`` reach the tools, ``family`` picks the reward options);
        tool_use: the row asks for the tool loop.
    """

    index: int
    problem_id: str
    data_source: str
    prompt: list[dict[str, Any]]
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    tool_use: bool = False


@dataclass
class Sample:
    """One episode to run: ``problem``'s sample ``index`` (0..k-1), asked with ``seed`` (None: no seed)."""

    problem: EvalProblem
    index: int
    seed: int | None = None


class EvalRecord(BaseModel):
    """One evaluated sample: a line of the results file (JSON of :meth:`model_dump`, keys in this order).

    Counters are those of the episode's ``envs.tool_use.episode.EpisodeStats`` (the training loop's counting:
    a tool error is a malformed call, a tool that raised or a call past its deadline). Token counts are
    ``None`` when a server reports no ``usage``.
    """

    model_config = ConfigDict(extra="forbid")

    problem_id: str = Field(description="data_source/split/index (row position when the row has no index)")
    problem_index: int = Field(description="row position in the data file")
    sample_index: int = Field(description="0..k-1")
    data_source: str
    ground_truth: Any = Field(description="str or list, as in reward_model.ground_truth")
    seed: int | None = Field(None, description="the sample's seed (None: none sent)")
    response: str = Field("", description="the scored model text (tool calls removed; tool output never included)")
    extracted_answer: str = Field("", description="the normalised answer the scorer read ('' when none)")
    has_answer: bool = False
    correct: bool = Field(False, description="envs.reward acc")
    verdict: Literal["correct", "wrong", "unverified"] = Field(
        "wrong", description="correct | wrong | unverified (the answer checker gave no verdict: its time ran out or "
        "it failed; scored as wrong, counted apart in the summary and scored again on resume)")
    verify_method: str = Field("", description="how the checker decided (envs.scoring.verify: exact, numeric, "
                               "math_verify, empty, ...) or why it did not (timeout, error)")
    score_attempts: int = Field(1, ge=1, description="how often the response was scored: an unverified sample is "
                                "scored again on resume until MAX_SCORE_ATTEMPTS, then stays unverified for good")
    score: float = Field(0.0, description="the training reward (overlong penalty included when configured)")
    finish_reason: str = Field("", description="of the last turn ('stop', 'length', ..., 'context_length')")
    truncated: bool = Field(False, description="the last turn was cut by the length limit (or aborted)")
    termination: str = Field("answer", description="answer | length | max_assistant_turns | aborted")
    tokens: int | None = Field(0, description="model-generated tokens, summed over turns")
    response_tokens: int | None = Field(0, description="model + tool/template tokens after the prompt")
    chars: int = Field(0, description='characters of "response"')
    turns: int = Field(0, description="assistant turns")
    tool_calls: int = Field(0, description="call attempts (malformed included)")
    tool_executed: int = 0
    malformed_calls: int = 0
    tool_errors: int = Field(0, description="malformed + exceptions + timeouts")
    tool_timeouts: int = 0
    tool_time_s: float = Field(0.0, description="seconds spent answering calls (wall clock)")
    reflections: dict[str, int] = Field(
        default_factory=dict, description='envs.scoring.reflection counts of "response" (per word and "total")'
    )
    error: str | None = Field(None, description="why a sample ended early (e.g. the server's context message)")

    @model_validator(mode="before")
    @classmethod
    def _default_verdict(cls, data: Any) -> Any:
        """A record built without a verdict takes it from ``correct`` (correct / wrong)."""
        if isinstance(data, dict) and "verdict" not in data:
            data = {**data, "verdict": "correct" if data.get("correct") is True else "wrong"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> EvalRecord:
        if (self.verdict == "correct") != self.correct:
            raise ValueError(f"verdict {self.verdict!r} contradicts correct={self.correct}")
        return self


RECORD_KEYS: tuple[str, ...] = tuple(EvalRecord.model_fields)


@dataclass
class TurnRequest:
    """What ``generate`` is asked for one assistant turn.

    Attributes:
        messages: the chat so far: the problem's prompt, then each assistant turn (``TurnResult.message``) and
            its ``tool`` messages. Read only.
        tools: OpenAI tool schemas offered (tool-use rows), None for plain rows.
        max_tokens: what is left of the episode's token budget after the tokens reported so far (> 0), None:
            no budget (the server's limit). An implementation that adds context tokens itself (tool
            observations) subtracts them and answers ``NO_BUDGET`` when nothing is left.
        seed: the sample's seed (None: none); turn: 0-based index of this assistant turn.
        state: per-episode scratch space owned by the implementation (empty on the first turn, the same dict on
            every later turn of the episode).
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    max_tokens: int | None
    seed: int | None
    turn: int
    state: dict[str, Any]


@dataclass
class TurnResult:
    """One assistant turn made by ``generate`` (or why none was made).

    Attributes:
        text: the turn as the model wrote it, special tokens kept (reasoning inside ``<think>...</think>``, tool
            calls as hermes ``<tool_call>`` blocks): what the parser and the reward text read.
        finish_reason: "stop" (or any reason the model ended the turn with), "length" / "max_tokens" (cut by
            the length limit), "abort" / "aborted"; with ``generated`` False, :data:`CONTEXT_FULL` or
            :data:`NO_BUDGET`.
        prompt_tokens: tokens of the context the turn was generated from (prompt + earlier turns and
            observations); None: unknown.
        completion_tokens: tokens of this turn; None: unknown (the episode's token counts are then None).
        message: the assistant message appended to the chat, in the implementation's format, built by
            ``envs.tool_use.history.assistant_message`` as in training (reasoning kept); None: that function's
            message of ``text`` with the parsed calls.
        tool_call_ids: ids of the turn's calls when the server parsed them (each observation answers its id).
        generated: False: no turn was made; the episode ends.
        error: why no turn was made (kept in the record).
    """

    text: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    message: dict[str, Any] | None = None
    tool_call_ids: list[str | None] = field(default_factory=list)
    generated: bool = True
    error: str | None = None


GenerateFn = Callable[[TurnRequest], Awaitable[TurnResult]]


def score_sample(problem: EvalProblem, text: str, info: Mapping[str, Any], reward_kwargs: Mapping[str, Any]) -> dict:
    """Score one sample's model text with the training reward.

    Args:
        problem: the row (``extra_info`` is merged under ``info``).
        text: the model text to score.
        info: episode fields (``hit_eos``, ``response_length``, tool counters) as the training loop reports them.
        reward_kwargs: options of ``envs.reward`` (as the recipe's ``reward_kwargs``).
    Returns:
        the dict of the row's family's reward (``envs.families.row_env_family``: ``envs.tool_use.task.compute_score``
        for tool-use rows, which scores ``model_response_text``; ``envs.reward.compute_score`` for the CoT rows).
    Raises:
        ValueError: invalid reward options.
    """
    from envs.contract import MODEL_TEXT_KEY
    from envs.families import row_env_family

    fam = row_env_family(problem.extra_info.get("family"), problem.tool_use)
    extra = {**problem.extra_info, **info}
    if fam.tool_use:
        extra[MODEL_TEXT_KEY] = text
    return fam.compute_score(problem.data_source, text, problem.ground_truth, extra, **dict(reward_kwargs))


def verdict_of(score: Mapping[str, Any]) -> tuple[str, str]:
    """``(verdict, verify_method)`` of a reward dict (``envs.reward.compute_score``'s keys ``acc``,
    ``timed_out``, ``verify_method``): ``"correct"`` when ``acc``; ``"unverified"`` when the checker gave no
    verdict (``timed_out``, or a method of :data:`NO_VERDICT_METHODS`: its time ran out, its worker crashed or it
    failed); else ``"wrong"`` (an empty ground truth, ``no_ground_truth``, is the data's fault: wrong, as the
    reward scores it). Never raises."""
    method = str(score.get("verify_method", "") or "")
    if bool(score.get("acc", False)):
        return "correct", method
    if bool(score.get("timed_out", False)) or method in NO_VERDICT_METHODS:
        return UNVERIFIED, method
    return "wrong", method


def rescore_record(problem: EvalProblem, record: Mapping[str, Any], reward_kwargs: Mapping[str, Any]) -> dict:
    """``record`` (a dict of :data:`RECORD_KEYS`) of ``problem`` scored again from its stored ``response``, as the
    episode scored it: ``hit_eos`` is ``not truncated``, the finish reason and the model-token count (``tokens``)
    as recorded. Returns a new dict whose ``extracted_answer``, ``has_answer``, ``correct``, ``verdict``,
    ``verify_method`` and ``score`` are the new scoring's and whose ``score_attempts`` is one more than the record's
    (1 when it has none); the rest is ``record``'s.

    Raises:
        ValueError: invalid reward options.
    """
    info: dict[str, Any] = {"hit_eos": not record.get("truncated", False),
                            "finish_reason": record.get("finish_reason") or None}
    if record.get("tokens") is not None:
        info["response_length"] = int(record["tokens"])
    score = score_sample(problem, str(record.get("response", "")), info, reward_kwargs)
    verdict, method = verdict_of(score)
    return {**record, "extracted_answer": str(score.get("pred", "") or ""),
            "has_answer": bool(score.get("has_answer", False)), "correct": verdict == "correct",
            "verdict": verdict, "verify_method": method, "score": float(score.get("score", 0.0)),
            "score_attempts": int(record.get("score_attempts") or 1) + 1}


def tool_schema_dicts(runner: Any) -> list[dict[str, Any]]:
    """The OpenAI tool schemas (plain dicts, unset/None fields dropped) of a ``ToolCallRunner``'s tools."""
    out = []
    for schema in runner.schemas.values():
        if schema is None:
            continue
        out.append(schema.model_dump(exclude_unset=True, exclude_none=True) if hasattr(schema, "model_dump")
                   else dict(schema))
    return out


def _strip(text: str, special_tokens: Sequence[str]) -> str:
    for s in special_tokens:
        text = text.replace(s, "")
    return text


async def run_episode(
    sample: Sample,
    generate: GenerateFn,
    *,
    max_tokens: int | None,
    max_turns: int,
    runner: Any = None,
    reward_kwargs: Mapping[str, Any] | None = None,
    special_tokens: Sequence[str] = (),
) -> EvalRecord:
    """Run, score and record one episode (module docstring).

    Args:
        sample: the problem, sample index and seed.
        generate: makes one assistant turn (:data:`GenerateFn`).
        max_tokens: the episode's token budget (model + tool/template tokens after the prompt); None: none.
        max_turns: most assistant turns of a tool-use episode (verl's ``max_assistant_turns``).
        runner: the ``envs.tool_use.episode.ToolCallRunner`` answering calls (needed for tool-use rows).
        reward_kwargs: options of ``envs.reward``.
        special_tokens: strings removed from the scored text (a tokenizer's special tokens; () for a server).
    Returns:
        the sample's :class:`EvalRecord` (scored once).
    Raises:
        ValueError: a tool-use row without ``runner``. Whatever ``generate`` raises (the episode is dropped).
    """
    from envs.scoring.reflection import REFLECTION_PATTERNS
    from envs.tool_use.episode import EpisodeStats, turn_termination
    from envs.tool_use.history import assistant_message, tool_call_dicts
    from envs.tool_use.parser import parse_tool_calls, turn_reward_text

    p = sample.problem
    if p.tool_use and runner is None:
        raise ValueError(f"{p.problem_id} is a tool-use row: run_episode needs a tool runner")
    schemas = runner.schemas if p.tool_use else {}
    tools = tool_schema_dicts(runner) if p.tool_use else None
    messages = [dict(m) for m in p.prompt]
    st = EpisodeStats()
    state: dict[str, Any] = {}
    context = SimpleNamespace(  # the tools' agent_data: per-row tools_kwargs, a trajectory id
        tools_kwargs=p.extra_info.get("tools_kwargs") or {},
        tool_rewards=[],
        request_id=f"eval-{p.problem_id}-{sample.index}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
    )
    finish_reason, error = "", None
    tokens, used, first_prompt, usage_known = 0, 0, None, True
    parts: list[str] = []
    try:
        while True:
            budget = None if max_tokens is None else max_tokens - used
            if budget is not None and budget <= 0:
                st.termination = "length"
                break
            res = await generate(TurnRequest(messages, tools, budget, sample.seed, st.num_assistant_turns, state))
            if not res.generated:
                if res.finish_reason == CONTEXT_FULL:  # the conversation outgrew the server's window: a cut
                    st.hit_eos, finish_reason, error = False, res.finish_reason, res.error
                st.termination = "length"
                break
            st.num_assistant_turns += 1
            finish_reason = res.finish_reason
            if res.completion_tokens is None:
                usage_known = False
            else:
                tokens += int(res.completion_tokens)
                if res.prompt_tokens is not None:
                    first_prompt = res.prompt_tokens if first_prompt is None else first_prompt
                    used = int(res.prompt_tokens) - first_prompt + int(res.completion_tokens)
                else:
                    used += int(res.completion_tokens)
            parts.append(turn_reward_text(res.text, special_tokens) if p.tool_use else _strip(res.text, special_tokens))
            if res.finish_reason in CUT_REASONS:  # a cut turn is never executed
                st.hit_eos = False
                st.termination = "aborted" if res.finish_reason in ("abort", "aborted") else "length"
                break
            if not p.tool_use:
                break
            _, calls = parse_tool_calls(res.text, schemas)
            reason = turn_termination(
                st, calls=calls, assistant_turns=st.num_assistant_turns, user_turns=st.num_assistant_turns - 1,
                max_assistant_turns=max_turns, max_user_turns=None,
                budget_spent=max_tokens is not None and used >= max_tokens,
            )
            if reason is not None:
                break
            observations = await runner.answer_turn(calls, st, context)
            # the model's text goes back into the history with its control-token strings broken (the runner's rule)
            messages.append(runner.history_message(res.message or assistant_message(res.text, tool_call_dicts(calls))))
            for i, obs in enumerate(observations):
                msg = {"role": "tool", "content": obs}
                if i < len(res.tool_call_ids) and res.tool_call_ids[i]:
                    msg["tool_call_id"] = res.tool_call_ids[i]
                messages.append(msg)
    finally:
        if p.tool_use:
            await runner.release_trajectory(context.request_id)

    text = "\n".join(x for x in parts if x) if p.tool_use else (parts[0] if parts else "")
    info: dict[str, Any] = {"hit_eos": st.hit_eos, "finish_reason": finish_reason or None}
    if usage_known:
        info["response_length"] = tokens
    if p.tool_use:
        info.update({k: v for k, v in st.counters().items() if k != "tool_call_log"})
    score = await asyncio.to_thread(score_sample, p, text, info, reward_kwargs or {})
    refl = {k: int(score.get(f"reflect_{k}", 0)) for k in REFLECTION_PATTERNS}
    refl["total"] = int(score.get("reflect_total", 0))
    verdict, method = verdict_of(score)
    return EvalRecord(
        problem_id=p.problem_id,
        problem_index=p.index,
        sample_index=sample.index,
        data_source=p.data_source,
        ground_truth=p.ground_truth,
        seed=sample.seed,
        response=text,
        extracted_answer=str(score.get("pred", "") or ""),
        has_answer=bool(score.get("has_answer", False)),
        correct=verdict == "correct",
        verdict=verdict,
        verify_method=method,
        score=float(score.get("score", 0.0)),
        finish_reason=finish_reason,
        truncated=st.truncated,
        termination=st.termination,
        tokens=tokens if usage_known else None,
        response_tokens=used if usage_known else None,
        chars=len(text),
        turns=st.num_assistant_turns,
        tool_calls=st.num_tool_calls,
        tool_executed=st.num_tool_executed,
        malformed_calls=st.num_malformed_calls,
        tool_errors=st.num_tool_errors,
        tool_timeouts=st.num_tool_timeouts,
        tool_time_s=round(float(st.tool_time_s), 4),
        reflections=refl,
        error=error,
    )


async def run_samples(
    samples: Sequence[Sample],
    generate: GenerateFn,
    *,
    concurrency: int,
    on_record: Callable[[EvalRecord], None] | None = None,
    **episode_kwargs: Any,
) -> list[EvalRecord]:
    """Run :func:`run_episode` for every sample, ``concurrency`` episodes in flight at a time.

    Args:
        samples: the episodes to run.
        generate: see :func:`run_episode`.
        concurrency: episodes in flight (>= 1): a client's requests in flight, or the local engine's batch.
        on_record: called (in the event loop) with each record as soon as it is scored, in finishing order.
        **episode_kwargs: :func:`run_episode`'s keyword arguments.
    Returns:
        the records, in the order of ``samples``.
    Raises:
        The first exception of any episode; the episodes still running are cancelled (records already passed
        to ``on_record`` stay written).
    """
    records: list[EvalRecord | None] = [None] * len(samples)
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(len(samples)):
        queue.put_nowait(i)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            rec = await run_episode(samples[i], generate, **episode_kwargs)
            records[i] = rec
            if on_record is not None:
                on_record(rec)

    n_workers = max(1, min(int(concurrency), len(samples)))
    tasks = [asyncio.create_task(worker()) for _ in range(n_workers)] if samples else []
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
    return [r for r in records if r is not None]
