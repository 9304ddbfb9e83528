"""Sample k answers per problem from a chat-completions server, run tool calls, score, and write JSONL
(:func:`run_api_eval`); the evaluation's names, importable from here.

One sample = one episode of the evaluation episode driver (``stare_verl.jobs.evaluation.episode``: the training
loop's parser, tool-call runner, stop rules and reward), with :class:`ChatGenerate` (``chat``) as its ``generate``:
each turn is one chat-completions request.

- plain rows (short / long CoT): one request; the answer (with ``reasoning_content`` put back inside
  ``<think>...</think>`` when the server splits it off) is scored by ``envs.reward.compute_score`` with the
  row's ``extra_info`` (its ``family`` picks the options) and the finish reason (``length`` = truncated =
  no answer), as in training.
- tool-use rows (``agent_name: stare_tool_agent``, ``extra_info.family: tool_use`` or ``tools_kwargs``): the
  request carries the tool schemas (``tools``); calls in the content are hermes ``<tool_call>`` blocks (a
  server that parses tool calls itself returns ``tool_calls``, read the same way); every call is answered by
  the tools of :func:`load_tools` (``tools``: the ``code_interpreter`` tool in the sandbox) and sent back as a
  ``tool`` message. The token budget ``max_tokens`` (model + tool tokens of all turns, as verl's
  ``response_length``) is measured from the server's ``usage``.

The pieces: ``settings`` (:class:`EvalSettings`, the seeds), ``data`` (:func:`load_problems`: the verl RLHF dataset,
checked), ``tools``, ``chat`` (:class:`ChatGenerate`), ``results`` (:class:`ResultsFile`: the JSONL, its settings
and resuming from it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stare_verl.jobs.evaluation.chat import ChatGenerate
from stare_verl.jobs.evaluation.client import ChatClient
from stare_verl.jobs.evaluation.data import DatasetError, load_problems
from stare_verl.jobs.evaluation.episode import (
    RECORD_KEYS,
    UNVERIFIED,
    EvalProblem,
    EvalRecord,
    Sample,
    run_samples,
    score_sample,
)
from stare_verl.jobs.evaluation.results import (
    ResultsBusy,
    ResultsFile,
    ResumeMismatch,
    pending_samples,
    record_order,
    rescore_unverified,
    resume_split,
)
from stare_verl.jobs.evaluation.settings import SEED_STRIDE, EvalSettings, data_digest, sample_seed
from stare_verl.jobs.evaluation.tools import load_tools, tool_runner

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
