"""Held-out evaluation of a checkpoint on a CPU default task: multi-turn with the real sandbox (tool use) or
single turn (the CoT families), scored with our scorer.

CoT families (``family`` ``shortcot`` / ``longcot``): one turn, like verl's ``single_turn_agent``: the prompt
ids from the Continuous Token builder over the question (no tools), one generation until ``<|im_end|>`` or the
token budget, the whole generated text scored with ``envs.reward.compute_score`` (family ``short_cot`` /
``long_cot``; a response cut by the budget scores 0).

Tool use:

Each held-out problem is one episode, token-in / token-out like verl's ``ToolAgentLoop``:

1. the prompt ids come from verl's Continuous Token builder (``model_type`` qwen2) over the question with
   ``tools=[code_interpreter]``;
2. the model generates until ``<|im_end|>`` (or the remaining token budget); tool calls are parsed with the
   project's parser (``envs.tool_use.parser.parse_tool_calls``: hermes, calls inside ``<think>``
   ignored, malformed calls answered with an error observation); each valid call runs through the real
   ``code_interpreter`` tool (``envs.tools``, sandboxed: create -> execute -> release) and the observations
   are appended through the Continuous Token builder (response_mask 0), as verl's agent loop appends them;
3. the episode ends on a turn without a tool call, at ``max_assistant_turns`` or at the length budget (a turn
   cut by the budget is never executed);
4. only the model-generated text (``envs.tool_use.parser.model_response_text``: mask-1 tokens, tool-call blocks
   removed) is scored with ``envs.reward.compute_score`` (family tool_use), so output printed by the tool
   earns nothing by itself.

This is a small loop of our own over those pieces rather than the project's ``stare_tool_agent`` itself,
which needs verl's agent-loop worker (Hydra trainer config, server manager, Ray-style reward handles); the
steps above are the same as that loop's. Generation is batched: all episodes run concurrently against the ``hf`` backend's
continuous-batching :class:`stare_verl.cpu.hf_server.GenerationEngine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stare_verl.jobs.demo.demos import (
    CODE_INTERPRETER_SCHEMA,
    REWARD_FAMILY,
    TOOL_NAME,
    Problem,
    heldout_problems,
)

__all__ = [
    "EpisodeResult",
    "EvalReport",
    "GenerateFn",
    "engine_generate_fn",
    "evaluate_checkpoint",
    "evaluate_model",
    "run_episodes",
]

# (prompt_ids, temperature, max_tokens, seed) -> generated ids (EOS included when the model stopped).
GenerateFn = Callable[[list[int], float, int, int], Awaitable[list[int]]]


@dataclass
class EpisodeResult:
    """One evaluated episode.

    Attributes:
        task, data_source, ground_truth: of the problem.
        response_ids: every token after the prompt (model and tool tokens); ``response_mask`` 1 for model
            tokens, 0 for tool/template tokens (same length).
        model_text: the model-generated text only (mask 1, special tokens dropped): what is scored.
        assistant_turns, tool_calls, tool_errors: counts, as in training (``envs.tool_use.episode``: a tool error
            is a malformed call, a tool that raised or a call past its deadline; code that ran and failed is a
            result the model reads).
        malformed_calls: unreadable calls (bad JSON, unknown tool, missing argument, unclosed tag, beyond the
            per-turn limit), each answered with the runner's error observation and counted in ``tool_calls`` and
            ``tool_errors``.
        truncated: the last turn was cut by the token budget (never executed), as training's ``hit_eos`` False.
        score, acc: from ``envs.reward.compute_score``.
        stats: the episode's ``envs.tool_use.episode.EpisodeStats`` (termination, executed calls, timeouts,
            tool time, call log).
    """

    task: str
    data_source: str
    ground_truth: str
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    model_text: str = ""
    assistant_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0
    truncated: bool = False
    score: float = 0.0
    acc: bool = False
    stats: Any = None


@dataclass
class EvalReport:
    """Aggregate of one evaluation (one temperature).

    Attributes:
        n: episodes; accuracy: share with ``acc``; mean_score; mean_turns: assistant turns per episode;
        mean_tool_calls; tool_error_rate: tool errors per call (0 without calls); truncated_rate;
        malformed_call_rate: unreadable tool calls per call;
        mean_response_tokens: model tokens per episode; per_task: accuracy per task; temperature;
        wall_s: seconds. With several samples per problem (``samples_per_problem`` k > 1, see
        :func:`evaluate_model`) the means are over all n = problems x k episodes (``accuracy`` is then avg@k)
        and ``pass_at_k`` maps each reported k' (powers of two below k, and k) to the mean unbiased pass@k'.
    """

    n: int
    temperature: float
    accuracy: float
    mean_score: float
    mean_turns: float
    mean_tool_calls: float
    tool_error_rate: float
    truncated_rate: float
    malformed_call_rate: float
    mean_response_tokens: float
    per_task: dict[str, float]
    wall_s: float = 0.0
    samples_per_problem: int = 1
    pass_at_k: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        return asdict(self)


def _report(results: Sequence[EpisodeResult], temperature: float, wall_s: float) -> EvalReport:
    if not results:
        raise ValueError("no episodes to report")
    calls = sum(r.tool_calls for r in results)
    tasks = sorted({r.task for r in results})
    return EvalReport(
        n=len(results),
        temperature=float(temperature),
        accuracy=statistics.fmean(float(r.acc) for r in results),
        mean_score=statistics.fmean(r.score for r in results),
        mean_turns=statistics.fmean(r.assistant_turns for r in results),
        mean_tool_calls=calls / len(results),
        tool_error_rate=(sum(r.tool_errors for r in results) / calls) if calls else 0.0,
        truncated_rate=statistics.fmean(float(r.truncated) for r in results),
        malformed_call_rate=(sum(r.malformed_calls for r in results) / calls) if calls else 0.0,
        mean_response_tokens=statistics.fmean(sum(r.response_mask) for r in results),
        per_task={t: statistics.fmean(float(r.acc) for r in results if r.task == t) for t in tasks},
        wall_s=wall_s,
    )


def _pass_at_ks(episodes: Sequence[EpisodeResult], n_problems: int, k: int) -> dict[int, float]:
    """Mean unbiased pass@k' over problems, for k' in ``default_ks(k)``, from ``k`` rounds of episodes over the
    same ``n_problems`` problems (episode ``j * n_problems + i`` is round j of problem i)."""
    from stare_verl.jobs.evaluation.metrics import default_ks, pass_at_k

    if len(episodes) != n_problems * k:
        raise ValueError(f"{len(episodes)} episodes are not {k} rounds of {n_problems} problems")
    correct = [sum(bool(episodes[j * n_problems + i].acc) for j in range(k)) for i in range(n_problems)]
    return {kk: statistics.fmean(pass_at_k(k, c, kk) for c in correct) for kk in default_ks(k)}


class _Episode:
    """State of one episode; tool calls go through the shared tool-call runner (``envs.tool_use.episode``)."""

    def __init__(self, problem: Problem, tokenizer, builder, runner, request_id: str):
        from envs.tool_use.episode import EpisodeStats

        self.p = problem
        self.tok = tokenizer
        self.builder = builder
        self.runner = runner
        self.request_id = request_id
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": problem.question}]
        self.result = EpisodeResult(problem.task, problem.data_source, problem.answer)
        self.stats = self.result.stats = EpisodeStats()


async def _run_episode(
    ep: _Episode,
    generate: GenerateFn,
    temperature: float,
    seed: int,
    max_assistant_turns: int,
    max_response_tokens: int,
) -> EpisodeResult:
    from envs.tool_use.episode import end_token_ids, turn_termination
    from envs.tool_use.parser import model_response_text, parse_tool_calls

    tools = [CODE_INTERPRETER_SCHEMA] if ep.runner is not None else None
    schemas = ep.runner.schemas if ep.runner is not None else {}
    r, st = ep.result, ep.stats
    ids = list(ep.builder.build_initial_tokens(ep.messages, tools=tools))
    n_prompt = len(ids)
    stop_ids = end_token_ids(ep.tok)
    while True:
        budget = max_response_tokens - (len(ids) - n_prompt)
        if budget <= 0:
            st.termination = "length"
            break
        out = [int(t) for t in await generate(ids, temperature, budget, seed + 7919 * r.assistant_turns)]
        ids.extend(out)
        r.response_mask.extend([1] * len(out))
        r.assistant_turns += 1
        st.num_assistant_turns = r.assistant_turns
        if not out or out[-1] not in stop_ids:  # cut by the budget: never executed
            st.hit_eos, st.termination = False, "length"
            break
        if ep.runner is None:  # single turn
            break
        content, calls = parse_tool_calls(ep.tok.decode(out, skip_special_tokens=False), schemas)
        if turn_termination(st, calls=calls, assistant_turns=r.assistant_turns, user_turns=r.assistant_turns - 1,
                            max_assistant_turns=max_assistant_turns, max_user_turns=None,
                            budget_spent=len(ids) - n_prompt >= max_response_tokens):
            break
        prev = ep.messages + [{"role": "assistant", "content": content}]
        observations = await ep.runner.answer_turn(calls, st, ep)
        messages = prev + [{"role": "tool", "content": o} for o in observations]
        merged = ep.builder.merge_context_tokens(prev, messages, ids, tools=tools)
        if len(merged.token_ids) - n_prompt >= max_response_tokens:  # the observation does not fit (as training)
            st.termination = "length"
            break
        ep.messages = messages
        r.response_mask.extend([0] * (len(merged.token_ids) - len(ids)))
        ids = list(merged.token_ids)
    r.response_ids = ids[n_prompt:]
    r.model_text = model_response_text(r.response_ids, r.response_mask, ep.tok)
    r.tool_calls, r.tool_errors, r.malformed_calls = st.num_tool_calls, st.num_tool_errors, st.num_malformed_calls
    r.truncated = st.truncated
    return r


async def run_episodes(
    problems: Sequence[Problem],
    generate: GenerateFn,
    tokenizer,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    max_assistant_turns: int = 3,
    max_response_tokens: int = 128,
    max_tool_response_chars: int = 256,
    tool_timeout_s: float = 5.0,
    family: str = "tooluse",
    max_parallel_calls: int = 1,
    tool_response_truncate_side: str = "middle",
) -> list[EpisodeResult]:
    """Run and score one episode per problem, all concurrently.

    Args:
        problems: held-out problems.
        generate: the policy (see :data:`GenerateFn`); must return the EOS id last when the model stopped.
        tokenizer: the run's tokenizer (chat template, eos).
        temperature: sampling temperature passed to ``generate`` (0 = greedy).
        seed: base seed of the episodes (episode ``i`` uses ``seed + i``).
        max_assistant_turns: most model turns per episode.
        max_response_tokens: token budget after the prompt (model and tool tokens), like verl's
            ``rollout.response_length``.
        max_tool_response_chars: observation text is cut to this many characters on
            ``tool_response_truncate_side`` (verl's ``multi_turn.max_tool_response_length`` /
            ``tool_response_truncate_side``, default "middle" as in training).
        tool_timeout_s: wall-clock limit of one tool call (the sandbox's ``timeout_s``; the runner's deadline is
            5 s more).
        max_parallel_calls: calls run per turn (verl's ``multi_turn.max_parallel_calls``, 1 as in training);
            later ones are answered with an error.
        family: ``tooluse`` (multi-turn with the tool), or ``shortcot`` / ``longcot`` (one turn, no tool;
            the tool arguments are unused).
    Returns:
        one :class:`EpisodeResult` per problem, in order.
    Raises:
        envs.sandbox.SandboxUnavailable: no sandbox backend works here.
    """
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from envs.reward import compute_score
    from envs.tool_use.episode import ToolCallRunner
    from envs.tools.code_interpreter import CodeInterpreterTool

    if family not in REWARD_FAMILY:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(REWARD_FAMILY)}")
    builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen2")
    tool = runner = None
    if family == "tooluse":
        with contextlib.redirect_stdout(io.StringIO()):  # verl's BaseTool prints its schema when built
            tool = CodeInterpreterTool({"type": "native", "sandbox": {"limits": {
                "timeout_s": tool_timeout_s, "cpu_s": max(1, int(tool_timeout_s))}}})
        # the loop-side deadline leaves the sandbox's own limit 5 s to report first
        runner = ToolCallRunner({TOOL_NAME: tool}, max_parallel_calls=max_parallel_calls,
                                tool_timeout_s=tool_timeout_s + 5, max_tool_response_chars=max_tool_response_chars,
                                truncate_side=tool_response_truncate_side)
    try:
        episodes = [_Episode(p, tokenizer, builder, runner, f"heldout-{seed + i}-{id(p)}")
                    for i, p in enumerate(problems)]
        results = await asyncio.gather(
            *(
                _run_episode(ep, generate, temperature, seed + i, max_assistant_turns, max_response_tokens)
                for i, ep in enumerate(episodes)
            )
        )
    finally:
        if tool is not None:
            await tool.aclose()
    for r in results:
        s = await asyncio.to_thread(
            compute_score,
            data_source=r.data_source,
            solution_str=r.model_text,
            ground_truth=r.ground_truth,
            extra_info={"family": REWARD_FAMILY[family], "hit_eos": not r.truncated},
        )
        r.score = float(s["score"])
        r.acc = bool(s["acc"])
    return list(results)


def engine_generate_fn(engine) -> GenerateFn:
    """A :data:`GenerateFn` over a :class:`stare_verl.cpu.hf_server.GenerationEngine` (batched)."""
    from stare_verl.cpu.hf_server import SamplingParams

    async def generate(prompt_ids: list[int], temperature: float, max_tokens: int, seed: int) -> list[int]:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
        result = await asyncio.wrap_future(engine.submit(prompt_ids, params))
        return result.token_ids

    return generate


def evaluate_model(
    model,
    tokenizer,
    problems: Sequence[Problem],
    temperatures: Sequence[float] = (0.0, 1.0),
    *,
    seed: int = 0,
    max_batch_size: int = 64,
    samples: int = 1,
    **episode_kwargs: Any,
) -> dict[float, tuple[EvalReport, list[EpisodeResult]]]:
    """Evaluate an in-memory causal LM (left in the mode it was in; weights untouched).

    Args:
        model: a transformers causal LM (CPU).
        tokenizer: its tokenizer.
        problems: the held-out problems.
        temperatures: one evaluation per temperature (0 = greedy).
        seed: sampling seed (episode ``i`` at a temperature uses ``seed + i``).
        max_batch_size: most sequences decoded together.
        samples: episodes per problem at temperatures > 0 (greedy: always one): the problems are run ``samples``
            times in a row (round j, problem i uses seed ``seed + j * len(problems) + i``, so round 0 is the
            single-sample evaluation), and the report adds ``pass_at_k`` (see :class:`EvalReport`).
        **episode_kwargs: passed to :func:`run_episodes` (family, max_assistant_turns, max_response_tokens, ...).
    Returns:
        ``{temperature: (report, episodes)}``.
    """
    import time

    from envs.tool_use.episode import end_token_ids
    from stare_verl.cpu.hf_server import GenerationEngine

    if not problems:
        raise ValueError("no problems to evaluate")
    max_len = int(getattr(model.config, "max_position_embeddings", 1024))
    eos = sorted(end_token_ids(tokenizer))  # what ends a turn in training (envs.contract.END_OF_TURN_TOKENS)
    engine = GenerationEngine(model, eos, max_model_len=max_len, max_batch_size=max_batch_size, seed=seed,
                              pad_token_id=int(tokenizer.pad_token_id or 0))
    out: dict[float, tuple[EvalReport, list[EpisodeResult]]] = {}
    try:
        gen = engine_generate_fn(engine)
        for t in temperatures:
            t0 = time.perf_counter()
            k = max(1, int(samples)) if t > 0 else 1
            episodes = asyncio.run(run_episodes(list(problems) * k, gen, tokenizer, temperature=float(t),
                                                seed=seed, **episode_kwargs))
            rep = _report(episodes, float(t), time.perf_counter() - t0)
            if k > 1:
                rep.samples_per_problem = k
                rep.pass_at_k = _pass_at_ks(episodes, len(problems), k)
            out[float(t)] = (rep, episodes)
    finally:
        engine.shutdown()
    return out


def evaluate_checkpoint(
    path: str | Path,
    n: int | None = None,
    data_seed: int | None = None,
    n_heldout: int | None = None,
    temperatures: Sequence[float] = (0.0, 1.0),
    seed: int = 0,
    family: str | None = None,
    samples: int = 1,
    **episode_kwargs: Any,
) -> dict[float, EvalReport]:
    """Held-out accuracy of the checkpoint at ``path`` (model and tokenizer in one directory).

    The problems are the first ``n`` of ``heldout_problems(n_heldout, data_seed)``: the SFT report's set and
    ``val.parquet`` of ``write_rl_parquet`` for the same values. ``data_seed`` and ``n_heldout`` default to the
    ``sft_config.json`` in ``path`` (an SFT checkpoint); give them for other checkpoints (e.g. an RL model
    exported with ``save_pretrained`` next to the same tokenizer).

    Args:
        path: checkpoint directory.
        n: problems to evaluate (None: all ``n_heldout``).
        data_seed, n_heldout: see above.
        family: the task family (None: ``sft_config.json``'s, else ``tooluse``).
        samples: episodes per problem at temperatures > 0 (adds pass@k, see :func:`evaluate_model`).
        temperatures, seed, episode_kwargs: see :func:`evaluate_model`.
    Returns:
        ``{temperature: EvalReport}``.
    Raises:
        ValueError: ``data_seed``/``n_heldout`` neither given nor in ``sft_config.json``.
    """
    from envs.tiny_hf import load_tokenizer
    from stare_verl.cpu.hf_server import load_model

    saved: dict[str, Any] = {}
    cfg_file = Path(path) / "sft_config.json"
    if cfg_file.is_file():
        saved = json.loads(cfg_file.read_text()).get("config", {})
    data_seed = saved.get("data_seed") if data_seed is None else data_seed
    n_heldout = saved.get("n_heldout") if n_heldout is None else n_heldout
    if data_seed is None or n_heldout is None:
        raise ValueError(f"{path} has no sft_config.json: give data_seed and n_heldout")
    family = family or saved.get("family") or "tooluse"
    problems = heldout_problems(int(n_heldout), int(data_seed), family)[: n or None]
    model = load_model(str(path))
    tokenizer = load_tokenizer(path)
    if "max_response_tokens" not in episode_kwargs and "max_response_tokens" in saved:
        episode_kwargs["max_response_tokens"] = saved["max_response_tokens"]
    res = evaluate_model(model, tokenizer, problems, temperatures, seed=seed, family=family, samples=samples,
                         **episode_kwargs)
    return {t: rep for t, (rep, _) in res.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m stare_verl.jobs.demo.evaluate CKPT [--n N] [--data-seed S --n-heldout M]``: print the reports."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("checkpoint")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--data-seed", type=int, default=None)
    ap.add_argument("--n-heldout", type=int, default=None)
    ap.add_argument("--family", choices=sorted(REWARD_FAMILY), default=None,
                    help="task family (default: the checkpoint's sft_config.json, else tooluse)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    args = ap.parse_args(argv)
    reports = evaluate_checkpoint(args.checkpoint, args.n, args.data_seed, args.n_heldout, args.temperatures,
                                  family=args.family)
    for t, rep in reports.items():
        print(f"T={t}: " + json.dumps(rep.to_dict()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
