"""Held-out evaluation of a checkpoint on a CPU default task: multi-turn with the real sandbox (tool use) or
single turn (the CoT families), scored with our scorer.

Each held-out problem is one episode of the evaluation episode driver (``stare_verl.jobs.evaluation.episode``,
the same driver as the API and local-checkpoint evaluations) with the local engine as its ``generate``
(``stare_verl.jobs.evaluation.engine.EngineGenerate``): token-in / token-out like verl's agent loop, the prompt
ids from verl's Continuous Token builder (``model_type`` qwen2) over the question (with
``tools=[code_interpreter]`` for tool use), observations appended through the same builder (response_mask 0).

- Tool use (``tooluse``): tool calls are parsed and answered by the training loop's parser and tool-call runner
  (``envs.tool_use.parser``, ``envs.tool_use.episode``: hermes, calls inside ``<think>`` ignored, malformed
  calls answered with an error observation, the real ``code_interpreter`` tool, sandboxed); the episode ends on
  a turn without a tool call, at ``max_assistant_turns`` or at the length budget (a turn cut by the budget is
  never executed); only the model-generated text, tool-call blocks removed, is scored
  (``envs.tool_use.task.compute_score``, family tooluse), so output printed by the tool earns nothing.
- CoT families (``shortcot`` / ``longcot``): one turn without tools, like verl's ``single_turn_agent``, the
  generated text scored with ``envs.reward.compute_score`` (family ``shortcot`` / ``longcot``; a response cut
  by the budget scores 0).

Generation is batched: all episodes run concurrently against the ``hf`` backend's continuous-batching
:class:`stare_verl.cpu.hf_server.GenerationEngine`. Every episode is an ``EvalRecord`` (the evaluation's record
schema); :class:`EvalReport` aggregates them.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.tools.schema import TOOL_NAME
from stare_verl.jobs.evaluation.engine import TokenPolicy
from stare_verl.jobs.evaluation.episode import EvalProblem, EvalRecord
from stare_verl.jobs.evaluation.sandbox import loop_deadline_s, sandbox_tool
from stare_verl.jobs.families import DEFAULT_FAMILY, family_arg, job_family, job_family_names
from stare_verl.jobs.families.problems import DATA_SOURCE_PREFIX, Problem, heldout_problems

__all__ = [
    "EvalReport",
    "TokenPolicy",
    "evaluate_checkpoint",
    "evaluate_model",
    "heldout_entropy",
    "heldout_episodes",
    "heldout_problem",
    "reference_entropy",
    "run_episodes",
    "sandbox_tool",
]


@dataclass
class EvalReport:
    """Aggregate of one evaluation (one temperature).

    Attributes:
        n: episodes; accuracy: share with ``correct``; mean_score; mean_turns: assistant turns per episode;
        mean_tool_calls; tool_error_rate: tool errors per call (0 without calls); truncated_rate;
        malformed_call_rate: unreadable tool calls per call;
        mean_response_tokens: model tokens per episode; per_task: accuracy per task; temperature;
        wall_s: seconds. With several samples per problem (``samples_per_problem`` k > 1, see
        :func:`evaluate_model`) the means are over all n = problems x k episodes (``accuracy`` is then avg@k)
        and ``pass_at_k`` maps each reported k' (powers of two below k, and k) to the mean unbiased pass@k'.
        unverified: episodes the answer checker gave no verdict (``EvalRecord.verdict``; counted as wrong).
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
    unverified: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        return asdict(self)


def _task(r: EvalRecord) -> str:
    """The reasoning-gym task of a held-out record (its ``data_source`` is ``rg/<task>``)."""
    return r.data_source.removeprefix(f"{DATA_SOURCE_PREFIX}/")


def _report(records: Sequence[EvalRecord], temperature: float, wall_s: float) -> EvalReport:
    if not records:
        raise ValueError("no episodes to report")
    calls = sum(r.tool_calls for r in records)
    tasks = sorted({_task(r) for r in records})
    return EvalReport(
        n=len(records),
        temperature=float(temperature),
        accuracy=statistics.fmean(float(r.correct) for r in records),
        mean_score=statistics.fmean(r.score for r in records),
        mean_turns=statistics.fmean(r.turns for r in records),
        mean_tool_calls=calls / len(records),
        tool_error_rate=(sum(r.tool_errors for r in records) / calls) if calls else 0.0,
        truncated_rate=statistics.fmean(float(r.truncated) for r in records),
        malformed_call_rate=(sum(r.malformed_calls for r in records) / calls) if calls else 0.0,
        mean_response_tokens=statistics.fmean(r.tokens or 0 for r in records),
        per_task={t: statistics.fmean(float(r.correct) for r in records if _task(r) == t) for t in tasks},
        wall_s=wall_s,
        unverified=sum(r.verdict == "unverified" for r in records),
    )


def _pass_at_ks(records: Sequence[EvalRecord], n_problems: int, k: int) -> dict[int, float]:
    """Mean unbiased pass@k' over problems, for k' in ``default_ks(k)``, from ``k`` rounds of episodes over the
    same ``n_problems`` problems (episode ``j * n_problems + i`` is round j of problem i)."""
    from stare_verl.jobs.evaluation.metrics import default_ks, pass_at_k

    if len(records) != n_problems * k:
        raise ValueError(f"{len(records)} episodes are not {k} rounds of {n_problems} problems")
    correct = [sum(bool(records[j * n_problems + i].correct) for j in range(k)) for i in range(n_problems)]
    return {kk: statistics.fmean(pass_at_k(k, c, kk) for c in correct) for kk in default_ks(k)}


def heldout_problem(p: Problem, position: int, family: str) -> EvalProblem:
    """Held-out problem ``p`` as the driver's row: the question alone as the prompt, the family's reward
    options, ``problem_id`` ``<data_source>/<position>``; the tool loop when the family's episodes use a tool."""
    fam = job_family(family)
    env = fam.env
    extra: dict[str, Any] = {"family": env.name, "task": p.task}
    if fam.reward_options:
        extra["reward_options"] = dict(fam.reward_options)
    return EvalProblem(
        index=position, problem_id=f"{p.data_source}/{position}", data_source=p.data_source,
        prompt=[{"role": "user", "content": p.question}], ground_truth=p.answer,
        extra_info=extra, tool_use=env.tool_use,
    )


DEFAULT_MAX_ASSISTANT_TURNS = 3
"""Assistant turns per tool-use episode unless told otherwise (the SFT's own held-out evaluation uses it)."""


async def run_episodes(
    problems: Sequence[Problem],
    generate: TokenPolicy,
    tokenizer,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    max_assistant_turns: int = DEFAULT_MAX_ASSISTANT_TURNS,
    max_response_tokens: int = 128,
    max_tool_response_chars: int = 256,
    tool_timeout_s: float = 5.0,
    family: str = DEFAULT_FAMILY,
    max_parallel_calls: int = 1,
    tool_response_truncate_side: str = "middle",
) -> list[EvalRecord]:
    """Run and score one episode per problem, all concurrently, through the evaluation episode driver.

    Args:
        problems: held-out problems.
        generate: the token-level policy (``engine.TokenPolicy``: prompt ids, temperature, max new tokens, seed
            -> generated ids); must return an end-of-turn id last when the model stopped.
        tokenizer: the run's tokenizer (chat template, eos).
        temperature: sampling temperature passed to ``generate`` (0 = greedy).
        seed: base seed of the episodes (episode ``i`` uses ``seed + i``; turn t of it ``+ 7919 * t``).
        max_assistant_turns: most model turns per episode.
        max_response_tokens: token budget after the prompt (model and tool tokens), like verl's
            ``rollout.response_length``.
        max_tool_response_chars: observation text is cut to this many characters on
            ``tool_response_truncate_side`` (verl's ``multi_turn.max_tool_response_length`` /
            ``tool_response_truncate_side``, default "middle" as in training).
        tool_timeout_s: wall-clock limit of one tool call (the sandbox's ``timeout_s``; the runner's deadline is
            ``evaluation.sandbox.loop_deadline_s`` of it, 5 s more).
        max_parallel_calls: calls run per turn (verl's ``multi_turn.max_parallel_calls``, 1 as in training);
            later ones are answered with an error.
        family: a registered family: multi-turn with the tool when its episodes use one (``tooluse``), else one
            turn without a tool (``shortcot`` / ``longcot``; the tool arguments are unused).
    Returns:
        one ``EvalRecord`` per problem, in order (``problem_index`` = position, ``seed`` = the episode's seed).
    Raises:
        ValueError: unknown family. envs.sandbox.SandboxUnavailable: no sandbox backend works here.
    """
    from envs.tool_use.episode import ToolCallRunner
    from envs.tools.observation import tokenizer_control_tokens
    from stare_verl.jobs.evaluation.engine import EngineGenerate
    from stare_verl.jobs.evaluation.episode import Sample, run_samples

    fam = job_family(family)  # ValueError for an unknown one
    engine_generate = EngineGenerate(tokenizer, generate, temperature=temperature)
    samples = [Sample(heldout_problem(p, i, family), 0, seed + i) for i, p in enumerate(problems)]
    tool = runner = None
    if fam.env.tool_use:
        tool = sandbox_tool(tool_timeout_s)
        runner = ToolCallRunner({TOOL_NAME: tool}, max_parallel_calls=max_parallel_calls,
                                tool_timeout_s=loop_deadline_s(tool_timeout_s), max_tool_response_chars=max_tool_response_chars,
                                truncate_side=tool_response_truncate_side,
                                control_tokens=tokenizer_control_tokens(tokenizer))
    try:
        return await run_samples(samples, engine_generate, concurrency=max(1, len(samples)),
                                 max_tokens=max_response_tokens, max_turns=max_assistant_turns, runner=runner,
                                 special_tokens=engine_generate.special_tokens)
    finally:
        if tool is not None:
            await tool.aclose()


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
) -> dict[float, tuple[EvalReport, list[EvalRecord]]]:
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

    from stare_verl.jobs.evaluation.engine import build_engine, engine_policy

    if not problems:
        raise ValueError("no problems to evaluate")
    engine = build_engine(model, tokenizer, max_batch_size=max_batch_size, seed=seed)
    out: dict[float, tuple[EvalReport, list[EvalRecord]]] = {}
    try:
        gen = engine_policy(engine)
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


def _checkpoint_heldout(
    path: str | Path, n: int | None, data_seed: int | None, n_heldout: int | None, family: str | None
) -> tuple[dict[str, Any], str, list[Problem]]:
    """``(saved, family, problems)`` of a checkpoint: its ``sft_config.json`` settings (``{}`` without one), the
    family (given, else saved, else ``DEFAULT_FAMILY``) and the first ``n`` of ``heldout_problems(n_heldout,
    data_seed)``, each of the two given or saved. Raises ValueError when either is neither."""
    saved: dict[str, Any] = {}
    cfg_file = Path(path) / "sft_config.json"
    if cfg_file.is_file():
        saved = json.loads(cfg_file.read_text()).get("config", {})
    data_seed = saved.get("data_seed") if data_seed is None else data_seed
    n_heldout = saved.get("n_heldout") if n_heldout is None else n_heldout
    if data_seed is None or n_heldout is None:
        raise ValueError(f"{path} has no sft_config.json: give data_seed and n_heldout")
    family = family or saved.get("family") or DEFAULT_FAMILY
    return saved, family, heldout_problems(int(n_heldout), int(data_seed), family)[: n or None]


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
        family: the task family (None: ``sft_config.json``'s, else ``DEFAULT_FAMILY``, tool use).
        samples: episodes per problem at temperatures > 0 (adds pass@k, see :func:`evaluate_model`).
        temperatures, seed, episode_kwargs: see :func:`evaluate_model`.
    Returns:
        ``{temperature: EvalReport}``.
    Raises:
        ValueError: ``data_seed``/``n_heldout`` neither given nor in ``sft_config.json``.
    """
    from envs.tiny_hf import load_tokenizer
    from stare_verl.cpu.hf_server import load_model

    saved, family, problems = _checkpoint_heldout(path, n, data_seed, n_heldout, family)
    model = load_model(str(path))
    tokenizer = load_tokenizer(path)
    if "max_response_tokens" not in episode_kwargs and "max_response_tokens" in saved:
        episode_kwargs["max_response_tokens"] = saved["max_response_tokens"]
    res = evaluate_model(model, tokenizer, problems, temperatures, seed=seed, family=family, samples=samples,
                         **episode_kwargs)
    return {t: rep for t, (rep, _) in res.items()}


def _checked_episode(k: int, ids: Sequence[int], mask: Sequence[int], vocab: int, max_len: int | None):
    """``(ids, mask)`` of episode ``k`` as lists of ints, or ValueError naming what is wrong with it."""
    import operator

    if len(ids) != len(mask):
        raise ValueError(f"episode {k} has {len(ids)} ids and {len(mask)} mask entries")
    try:
        ids, mask = [operator.index(i) for i in ids], [operator.index(m) for m in mask]
    except TypeError as err:
        raise ValueError(f"episode {k}: ids and mask must be integers ({err})") from None
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"episode {k}: token id {bad[0]} is outside the model's vocabulary of {vocab} (episodes "
                         "from another tokenizer?)")
    if any(m not in (0, 1) for m in mask):
        raise ValueError(f"episode {k}: mask entries must be 0 or 1")
    if max_len is not None and len(ids) > max_len:
        raise ValueError(f"episode {k} has {len(ids)} tokens, more than the model's {max_len} positions")
    return ids, mask


def reference_entropy(
    model: Any, episodes: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 64
) -> dict[str, Any]:
    """Teacher-forced entropy and negative log-likelihood of the policy on fixed episodes, model tokens only.

    A probe of the policy's entropy that does not depend on what it samples: every checkpoint is read on the same
    token sequences, so two checkpoints (before / after RL, STARE / GRPO-ds) compare without the batch-to-batch
    swing of the rollout entropy (``stare/batch_entropy`` moves up to 5x between steps on the tiny tool-use model,
    with which problems a batch holds). For each position ``t`` with ``mask[t + 1] == 1`` (a token the model
    generates: response_mask 1; tool output, template and prompt tokens excluded) it takes the entropy of
    ``softmax(logits[t])`` (T = 1, the rollout temperature; ``verl.utils.torch_functional.entropy_from_logits``)
    and ``-log p(ids[t + 1])``; both are token means over all such positions of all episodes.

    Args:
        model: a causal LM (``transformers``) in eval mode, on the CPU.
        episodes: ``(input_ids, mask)`` pairs of equal lengths (``stare_verl.jobs.demo.encode.encode_demo``).
        batch_size: episodes per forward pass (right-padded, with an attention mask).
    Returns:
        ``{"entropy": nats per model token, "nll": nats per model token, "episodes": n, "tokens": model tokens}``.
    Raises:
        ValueError: an episode whose ids and mask differ in length, an id that is not an integer of the model's
            vocabulary, a mask entry other than 0 / 1, an episode longer than the model's positions, a batch size
            below 1, or no model token in any episode.
    """
    import torch
    from verl.utils.torch_functional import entropy_from_logits

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    vocab = model.get_input_embeddings().num_embeddings
    max_len = getattr(model.config, "max_position_embeddings", None)
    episodes = [_checked_episode(k, ids, mask, vocab, max_len) for k, (ids, mask) in enumerate(episodes)]
    total_h, total_nll, tokens = 0.0, 0.0, 0
    with torch.no_grad():
        for start in range(0, len(episodes), batch_size):
            chunk = episodes[start : start + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            # right padding: a causal model's logits at the real positions do not see the pad tokens
            ids_t = torch.tensor([list(ids) + [0] * (width - len(ids)) for ids, _ in chunk])
            attn = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in chunk])
            sel = torch.tensor([m[1:] + [0] * (width - 1 - len(m[1:])) for _, m in chunk], dtype=torch.bool)
            if not bool(sel.any()):
                continue
            logits = model(input_ids=ids_t, attention_mask=attn).logits[:, :-1].float()[sel]  # [model tokens, V]
            total_h += float(entropy_from_logits(logits).sum())
            logp = torch.log_softmax(logits, dim=-1)
            total_nll -= float(logp.gather(1, ids_t[:, 1:][sel][:, None]).sum())
            tokens += int(sel.sum())
    if tokens == 0:
        raise ValueError("no model token (mask 1) in the episodes: nothing to measure")
    return {"entropy": total_h / tokens, "nll": total_nll / tokens, "episodes": len(episodes), "tokens": tokens}


def heldout_episodes(
    path: str | Path,
    n: int | None = None,
    data_seed: int | None = None,
    n_heldout: int | None = None,
    family: str | None = None,
    demo_seed: int = 0,
) -> list[tuple[list[int], list[int]]]:
    """The held-out problems' demonstrations as ``(input_ids, mask)`` episodes, the fixed input of
    :func:`reference_entropy`.

    One demonstration per problem (the family's SFT ``JobFamily.demonstrations``, ``demo_seed``; tool use: real
    sandbox output) of the first ``n`` problems of ``heldout_problems(n_heldout, data_seed)``, the problems
    :func:`evaluate_checkpoint` scores and the SFT never trained on, encoded as the SFT encodes them
    (``stare_verl.jobs.demo.encode.encode_demo``: verl's agent-loop token layout, mask 1 on the assistant turns only)
    with the tokenizer at ``path``. ``data_seed`` / ``n_heldout`` / ``family`` default to the ``sft_config.json``
    in ``path``, as in :func:`evaluate_checkpoint`.

    Raises:
        ValueError: ``data_seed``/``n_heldout`` neither given nor in ``sft_config.json``; no demonstration.
    """
    from envs.tiny_hf import load_tokenizer
    from stare_verl.jobs.demo.encode import encode_demo

    saved, family, problems = _checkpoint_heldout(path, n, data_seed, n_heldout, family)
    demos, _ = job_family(family).demonstrations(problems, seed=demo_seed, per_problem=1)
    if not demos:
        raise ValueError(f"no demonstration for the {len(problems)} held-out problems of {family}")
    tokenizer = load_tokenizer(path)
    return [tuple(map(list, encode_demo(d, tokenizer))) for d in demos]


def heldout_entropy(path: str | Path, episodes: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict[str, Any]:
    """:func:`reference_entropy` of the checkpoint at ``path`` (model weights; e.g. verl's ``huggingface``
    export of an RL step) on ``episodes`` (:func:`heldout_episodes` of the SFT checkpoint it started from)."""
    from stare_verl.cpu.hf_server import load_model

    return reference_entropy(load_model(str(path)), episodes)

def main(argv: list[str] | None = None) -> int:
    """``python -m stare_verl.jobs.demo.evaluate CKPT [--n N] [--data-seed S --n-heldout M]``: print the reports."""
    import argparse

    from stare_verl.jobs.procs import interrupt_on_termination

    interrupt_on_termination()
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("checkpoint", help="a model folder (an SFT checkpoint, or any with --data-seed and --n-heldout)")
    ap.add_argument("--n", type=int, default=None, help="the first N held-out problems (default: all --n-heldout)")
    ap.add_argument("--data-seed", type=int, default=None,
                    help="data seed of the held-out split (default: the checkpoint's sft_config.json)")
    ap.add_argument("--n-heldout", type=int, default=None,
                    help="size of the held-out split (default: the checkpoint's sft_config.json)")
    ap.add_argument("--family", type=family_arg, choices=sorted(job_family_names()), default=None,
                    help="task family (default: the checkpoint's sft_config.json, else tooluse)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0],
                    help="sampling temperatures, one report each (0: greedy; default 0 1)")
    args = ap.parse_args(argv)
    import math

    for opt in ("n", "n_heldout"):
        if getattr(args, opt) is not None and getattr(args, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be >= 1 (got {getattr(args, opt)})")
    if any(not (math.isfinite(t) and t >= 0) for t in args.temperatures):
        ap.error(f"--temperatures must be finite and >= 0 (got {args.temperatures})")
    if not Path(args.checkpoint).is_dir():
        ap.error(f"{args.checkpoint} is not a checkpoint folder")
    try:
        reports = evaluate_checkpoint(args.checkpoint, args.n, args.data_seed, args.n_heldout, args.temperatures,
                                      family=args.family)
    except ValueError as err:  # no sft_config.json and no --data-seed / --n-heldout, no problems, ...
        ap.error(str(err))
    for t, rep in reports.items():
        print(f"T={t}: " + json.dumps(rep.to_dict()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
