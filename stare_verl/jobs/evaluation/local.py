"""Evaluate a local checkpoint on this machine (no server): the project's CPU generation code.

Episodes run through ``stare_verl.jobs.demo.evaluate.run_episodes`` (the CPU tool-use evaluation loop: verl's
Continuous Token builder, ``envs.tool_use.agent_loop.parse_tool_calls``, the real ``code_interpreter`` tool in the
sandbox, token-in/token-out as in training) over the ``hf`` backend's continuous-batching
``stare_verl.cpu.hf_server.GenerationEngine``, with the sampling settings of the API path (temperature,
top_p, k samples per problem). Records, resume and summary are those of the API path (``runner``).

Checkpoint default: the most recently written ``runs/<run>/checkpoints/global_step_N/actor/huggingface``
(verl's checkpoint layout with ``hf_model`` in ``checkpoint.save_contents``; ``make train-tooluse`` writes it);
any HF model directory with its tokenizer can be given instead. Data default: the run's ``val.parquet``
(searched under ``runs/<run>/``); for a cold-start SFT checkpoint (``runs/cache/sft-<hash>``), its held-out set.

Scope: the CPU tool-use task (rows with the tool loop); the prompt the loop sees is the row's last user
message (the demo model is trained on exactly that; a row's system message is not sent).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stare_verl.jobs.evaluation.runner import (
    EvalProblem,
    EvalSettings,
    ResultsFile,
    _record,
    pending_samples,
    sample_seed,
    score_sample,
)

__all__ = [
    "LocalCheckpointError",
    "demo_family",
    "find_latest_checkpoint",
    "find_run_data",
    "heldout_data_for_sft",
    "run_local_eval",
]

logger = logging.getLogger(__name__)

_WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


class LocalCheckpointError(FileNotFoundError):
    """No usable local checkpoint (or its data) was found; the message says what to do."""


def _has_weights(d: Path) -> bool:
    return (d / "config.json").is_file() and any(any(d.glob(p)) for p in _WEIGHTS)


def find_latest_checkpoint(runs_dir: str | Path = "runs") -> Path:
    """The latest checkpoint of the newest run under ``runs_dir``: of the runs whose ``checkpoints/`` (or the run
    folder itself, when it is verl's ``default_local_dir``) has a latest checkpoint, the one recorded last
    (``stare_verl.jobs.runlog.RunFolder.newest``); its ``global_step_N/actor/huggingface``, N as verl's
    ``latest_checkpointed_iteration.txt`` says (the step a resume would load, ``RunFolder.latest_checkpoint``).

    Raises:
        LocalCheckpointError: no run has a latest checkpoint, or the newest one holds no HF weights (saved without
            ``hf_model``).
    """
    from stare_verl.jobs.runlog import RunFolder

    root = Path(runs_dir)
    run = RunFolder.newest(root)
    if run is None:
        raise LocalCheckpointError(
            f"no checkpoint found under {root.resolve()}/ (looked for <run>/checkpoints/"
            "latest_checkpointed_iteration.txt naming an existing global_step_N): run `make train-tooluse` first, "
            "give --checkpoint DIR (e.g. a cold-start SFT checkpoint runs/cache/sft-<hash>), or evaluate a served "
            "model with --url"
        )
    ck = run.latest_checkpoint()
    if ck is None:
        raise LocalCheckpointError(
            f"the latest checkpoint of the newest run, {run.checkpoint_step_dir(run.latest_step() or 0)}, has no HF "
            "weights in actor/huggingface: train with "
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model], or give "
            "--checkpoint DIR (a Hugging Face model folder with its tokenizer)"
        )
    return ck


def find_run_data(checkpoint: str | Path) -> Path:
    """The ``val.parquet`` of the run a checkpoint belongs to: ``<run>/val.parquet`` or ``<run>/*/val.parquet``
    where ``<run>/checkpoints/`` holds the checkpoint (as ``make train-*`` writes run folders).

    Raises:
        LocalCheckpointError: the checkpoint is not under a ``checkpoints/`` folder of a run with a
            ``val.parquet``.
    """
    ck = Path(checkpoint).resolve()
    # The run folder is the one that holds the checkpoint's ``checkpoints/`` folder; nothing above it is searched
    # (a parent directory's unrelated ``*/val.parquet`` must never be picked).
    run = next((p.parent for p in (ck, *ck.parents) if p.name == "checkpoints"), None)
    if run is not None:
        hits = sorted(run.glob("val.parquet")) + sorted(run.glob("*/val.parquet"))
        if hits:
            return hits[0]
    raise LocalCheckpointError(f"no val.parquet found for checkpoint {checkpoint}; give --data FILE.parquet")


def heldout_data_for_sft(checkpoint: str | Path, out_dir: str | Path) -> Path | None:
    """For a cold-start SFT checkpoint (``sft_config.json`` inside, ``stare_verl.jobs.demo.sft``): write its held-out
    problems (``stare_verl.jobs.demo.demos.heldout_problems`` with the saved ``n_heldout``/``data_seed``, rows as
    ``problem_row`` writes them) to ``<out_dir>/val.parquet`` and return that path; None for other checkpoints."""
    import json

    cfg_file = Path(checkpoint) / "sft_config.json"
    if not cfg_file.is_file():
        return None
    saved = json.loads(cfg_file.read_text()).get("config", {})
    if saved.get("data_seed") is None or saved.get("n_heldout") is None:
        return None
    from envs.datasets import write_parquet
    from stare_verl.jobs.demo.demos import heldout_problems, problem_row

    family = str(saved.get("family", "tooluse"))
    probs = heldout_problems(int(saved["n_heldout"]), int(saved["data_seed"]), family=family)
    rows = [problem_row(p, "test", i, family=family) for i, p in enumerate(probs)]
    return write_parquet(rows, Path(out_dir) / "val.parquet")


def demo_family(p: EvalProblem) -> str:
    """The CPU task family of an evaluation row: ``tooluse`` for tool-use rows, else ``longcot`` when
    ``extra_info.family`` is ``long_cot`` and ``shortcot`` otherwise (the reward's default family)."""
    if p.tool_use:
        return "tooluse"
    return "longcot" if p.extra_info.get("family") == "long_cot" else "shortcot"


def _to_demo_problem(p: EvalProblem):
    from stare_verl.jobs.demo.demos import Problem

    user = [m["content"] for m in p.prompt if m["role"] == "user"][-1]
    gt = p.ground_truth[0] if isinstance(p.ground_truth, list) else p.ground_truth
    return Problem(task=str(p.extra_info.get("task") or p.data_source), question=str(user), answer=str(gt),
                   expression=str(p.extra_info.get("expression") or ""), index=p.index)


def run_local_eval(
    checkpoint: str | Path,
    problems: Sequence[EvalProblem],
    settings: EvalSettings,
    results: ResultsFile,
    *,
    max_batch_size: int = 64,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Draw the missing samples of ``problems`` from the checkpoint on CPU and append them to ``results``.

    Samples are generated ``max_batch_size`` at a time (one continuous batch) and written after each chunk.
    ``settings.max_tokens`` is the episode budget (model + tool tokens; default: the checkpoint's
    ``sft_config.json`` value, else 128); episode seeds follow ``run_episodes`` (the chunk's base seed + its
    position in the chunk).

    Returns:
        every record of ``problems`` (earlier and new), in problem/sample order.
    Rows run as their family (:func:`demo_family`): tool-use rows through the multi-turn tool loop, CoT rows as
    one turn without the tool, each scored with its family's reward.

    Raises:
        LocalCheckpointError: the checkpoint has no weights.
        envs.sandbox.SandboxUnavailable: no sandbox backend works here.
    """
    import json

    from tqdm.auto import tqdm

    from stare_verl.cpu.hf_server import GenerationEngine, SamplingParams, load_model
    from stare_verl.jobs.demo.evaluate import run_episodes
    from stare_verl.jobs.demo.tokenizer import load_tokenizer

    ck = Path(checkpoint)
    if not _has_weights(ck):
        raise LocalCheckpointError(f"{ck} is not a Hugging Face model folder with weights (config.json + "
                                   "*.safetensors)")
    families = {p.problem_id: demo_family(p) for p in problems}
    max_tokens = settings.max_tokens
    if max_tokens is None:
        cfg = ck / "sft_config.json"
        saved = json.loads(cfg.read_text()).get("config", {}) if cfg.is_file() else {}
        max_tokens = int(saved.get("max_response_tokens", 128))

    done = [r for r in results.load() if r["problem_id"] in {p.problem_id for p in problems}
            and int(r["sample_index"]) < settings.k]
    todo = pending_samples(problems, settings.k, done)
    total = len(problems) * settings.k
    new: list[dict[str, Any]] = []
    if todo:
        model = load_model(str(ck))
        tok = load_tokenizer(ck)
        eos = sorted({int(tok.eos_token_id)} | {int(t) for t in [tok.convert_tokens_to_ids("<|endoftext|>")]
                                                if isinstance(t, int) and t >= 0})
        engine = GenerationEngine(model, eos, max_model_len=int(getattr(model.config, "max_position_embeddings", 1024)),
                                  max_batch_size=max_batch_size, seed=settings.seed or 0,
                                  pad_token_id=int(tok.pad_token_id or 0))

        async def generate(prompt_ids: list[int], temperature: float, max_new: int, seed: int) -> list[int]:
            params = SamplingParams(temperature=temperature, top_p=settings.top_p, max_tokens=max_new, seed=seed)
            return (await asyncio.wrap_future(engine.submit(prompt_ids, params))).token_ids

        bar = tqdm(total=total, initial=total - len(todo), desc="eval (local)", unit="sample", disable=not progress)
        # one continuous batch per family at a time (tool-use rows run the tool loop, CoT rows one turn)
        chunks = [
            (fam, part[start : start + max_batch_size])
            for fam in sorted(set(families.values()))
            for part in [[t for t in todo if families[t[0].problem_id] == fam]]
            for start in range(0, len(part), max_batch_size)
        ]
        try:
            for fam, chunk in chunks:
                base = sample_seed(settings.seed or 0, chunk[0][0].index, chunk[0][1])
                episodes = asyncio.run(run_episodes(
                    [_to_demo_problem(p) for p, _ in chunk], generate, tok, temperature=settings.temperature,
                    seed=base, max_assistant_turns=settings.max_turns, max_response_tokens=max_tokens,
                    max_tool_response_chars=settings.max_tool_response_chars,
                    tool_timeout_s=settings.tool_timeout_s, family=fam,
                ))
                for i, ((p, j), r) in enumerate(zip(chunk, episodes, strict=True)):
                    rec = _episode_record(p, j, base + i, r, settings)
                    results.append(rec)
                    new.append(rec)
                    bar.update(1)
        finally:
            bar.close()
            engine.shutdown()
    order = {(p.problem_id, j): (p.index, j) for p in problems for j in range(settings.k)}
    recs = {(r["problem_id"], int(r["sample_index"])): r for r in done + new}
    return [recs[key] for key in sorted(recs, key=lambda key: order[key])]


def _episode_record(p: EvalProblem, j: int, seed: int, r, settings: EvalSettings) -> dict[str, Any]:
    """A runner record from a ``stare_verl.jobs.demo.evaluate.EpisodeResult``: its counters are the episode's
    ``EpisodeStats`` (scored again with the row's info to get the extracted answer and reflection counts)."""
    tokens = int(sum(r.response_mask))
    stats = r.stats  # the shared EpisodeStats of the episode: termination, timeouts and tool time as counted
    if stats is None:  # a CoT row (one turn, no tool): nothing was counted by a runner
        from envs.tool_use.episode import EpisodeStats

        stats = EpisodeStats(hit_eos=not r.truncated, termination="length" if r.truncated else "answer",
                             num_assistant_turns=r.assistant_turns)
    termination = stats.termination
    info = {"hit_eos": not r.truncated, "response_length": tokens, **{
        k: v for k, v in stats.counters().items() if k not in ("hit_eos", "termination", "tool_call_log")}}
    score = score_sample(p, r.model_text, info, settings.reward_kwargs)
    ep = {"finish_reason": "length" if r.truncated else "stop", "truncated": bool(r.truncated),
          "termination": termination, "tokens": tokens, "response_tokens": len(r.response_ids),
          "turns": r.assistant_turns, "stats": stats, "error": None}
    return _record(p, j, seed, r.model_text, score, ep)
