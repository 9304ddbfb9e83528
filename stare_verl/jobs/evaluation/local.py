"""Evaluate a local checkpoint on this machine (no server): the project's CPU generation code.

Episodes run through the evaluation episode driver (``stare_verl.jobs.evaluation.episode``: the training loop's
parser, tool-call runner, stop rules and reward) with the local engine as its ``generate``
(``stare_verl.jobs.evaluation.engine``: verl's Continuous Token builder, token-in/token-out as in training, over
the ``hf`` backend's continuous-batching ``stare_verl.cpu.hf_server.GenerationEngine``), the real
``code_interpreter`` tool in the sandbox, and the sampling settings of the API path (temperature, top_p, k
samples per problem). Records (``episode.EvalRecord``), resume and summary are those of the API path.

Checkpoint default: the most recently written ``runs/<run>/checkpoints/global_step_N/actor/huggingface``
(verl's checkpoint layout with ``hf_model`` in ``checkpoint.save_contents``; ``make train-tooluse`` writes it);
any HF model directory with its tokenizer can be given instead. Data default: the run's ``val.parquet``
(searched under ``runs/<run>/``); for a cold-start SFT checkpoint (``runs/cache/sft-<hash>``), its held-out set.

Scope: the CPU tool-use task (rows with the tool loop); the prompt the loop sees is the row's last user
message (the demo model is trained on exactly that; a row's system message is not sent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envs.tools.schema import TOOL_NAME
from stare_verl.jobs.evaluation.runner import (
    EvalProblem,
    EvalSettings,
    ResultsFile,
    record_order,
    record_samples,
    resume_split,
    tool_runner,
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


def check_local_checkpoint(checkpoint: str | Path) -> None:
    """Refuse a local model folder the evaluation cannot load, before anything is written for it.

    Raises:
        LocalCheckpointError: not a Hugging Face model folder with weights (``config.json`` and ``*.safetensors``),
            or its weights do not load (a truncated or overwritten file, a missing shard): one line, not a traceback.
    """
    ck = Path(checkpoint)
    if not _has_weights(ck):
        raise LocalCheckpointError(f"{ck} is not a Hugging Face model folder with weights (config.json + "
                                   "*.safetensors)")
    from stare_verl.models.registry import weights_problem

    problem = weights_problem(ck)
    if problem:
        raise LocalCheckpointError(f"{ck}: {problem}")


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
    problems (``stare_verl.jobs.families.problems.heldout_problems`` with the saved family, ``n_heldout`` and
    ``data_seed``, rows as ``problem_row`` writes them) to ``<out_dir>/val.parquet`` and return that path; None for other checkpoints."""
    import json

    cfg_file = Path(checkpoint) / "sft_config.json"
    if not cfg_file.is_file():
        return None
    saved = json.loads(cfg_file.read_text()).get("config", {})
    if saved.get("data_seed") is None or saved.get("n_heldout") is None:
        return None
    from envs.datasets import write_parquet
    from stare_verl.jobs.families import DEFAULT_FAMILY
    from stare_verl.jobs.families.problems import heldout_problems, problem_row

    family = str(saved.get("family", DEFAULT_FAMILY))
    probs = heldout_problems(int(saved["n_heldout"]), int(saved["data_seed"]), family=family)
    rows = [problem_row(p, "test", i, family=family) for i, p in enumerate(probs)]
    return write_parquet(rows, Path(out_dir) / "val.parquet")


def demo_family(p: EvalProblem) -> str:
    """The CPU task family of an evaluation row (``stare_verl.jobs.families.row_job_family``): the family of its
    ``extra_info.family`` when that family's tool use matches the row's, else ``tooluse`` for tool-use rows and
    ``shortcot`` (the reward's default family) for the others."""
    from stare_verl.jobs.families import row_job_family

    return row_job_family(p.extra_info.get("family"), p.tool_use).name


def _local_prompt(p: EvalProblem) -> EvalProblem:
    """``p`` with the prompt the demo model was trained on: the row's last user message alone."""
    user = [m for m in p.prompt if m["role"] == "user"][-1]
    return dataclasses.replace(p, prompt=[{"role": "user", "content": str(user["content"])}])


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

    The episodes run through the evaluation episode driver (``episode``) with the local engine's ``generate``
    (``engine.EngineGenerate`` over a continuous-batching ``GenerationEngine``): ``max_batch_size`` episodes
    in flight, decoded together; each record is written as soon as it is scored. Tool-use rows run the tool
    loop with the real ``code_interpreter`` tool in the sandbox (its limit ``settings.tool_timeout_s``, the
    loop-side deadline ``sandbox.loop_deadline_s`` of it, 5 s more); CoT rows one turn without the tool. ``settings.max_tokens`` is the episode
    budget (model + tool tokens; default: the checkpoint's ``sft_config.json`` value, else 128); sample j of
    problem i is drawn with seed ``sample_seed(settings.seed or 0, i, j)`` (+ 7919 per later turn).

    Returns:
        every record of ``problems`` (earlier and new, dicts of ``runner.RECORD_KEYS``), in problem/sample order.
    Raises:
        LocalCheckpointError: the checkpoint has no weights, or weights that do not load
            (:func:`stare_verl.models.registry.weights_problem`).
        envs.sandbox.SandboxUnavailable: no sandbox backend works here.
    """
    import json

    from envs.tiny_hf import load_tokenizer
    from stare_verl.cpu.hf_server import load_model
    from stare_verl.jobs.evaluation.engine import EngineGenerate, build_engine, engine_policy
    from stare_verl.jobs.evaluation.sandbox import loop_deadline_s, sandbox_tool

    ck = Path(checkpoint)
    check_local_checkpoint(ck)
    if settings.seed is None:  # the engine always samples with a seed
        settings = settings.model_copy(update={"seed": 0})
    max_tokens = settings.max_tokens
    if max_tokens is None:
        cfg = ck / "sft_config.json"
        saved = json.loads(cfg.read_text()).get("config", {}) if cfg.is_file() else {}
        max_tokens = int(saved.get("max_response_tokens", 128))

    problems = [_local_prompt(p) for p in problems]
    done, todo = resume_split(problems, settings, results)
    if not todo:
        return record_order(problems, settings.k, done)
    model = load_model(str(ck))
    tok = load_tokenizer(ck)
    engine = build_engine(model, tok, max_batch_size=max_batch_size, seed=settings.seed)
    generate = EngineGenerate(tok, engine_policy(engine, top_p=settings.top_p), temperature=settings.temperature)
    tool = runner = None
    if any(s.problem.tool_use for s in todo):
        tool = sandbox_tool(settings.tool_timeout_s)
        runner = tool_runner({TOOL_NAME: tool}, settings, tool_timeout_s=loop_deadline_s(settings.tool_timeout_s))

    async def go() -> list[dict[str, Any]]:
        try:
            return await record_samples(problems, settings, results, generate, done=done, todo=todo,
                                        concurrency=max_batch_size, runner=runner, max_tokens=max_tokens,
                                        special_tokens=generate.special_tokens, desc="eval (local)",
                                        progress=progress)
        finally:
            if tool is not None:
                await tool.aclose()

    try:
        return asyncio.run(go())
    finally:
        engine.shutdown()
