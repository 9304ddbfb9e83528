"""The problems of a family's CPU default and their verl rows: reasoning-gym questions, disjoint splits, RL parquet.

Problems are real reasoning-gym questions from the family's task table (``JobFamily.task_table``, tasks mixed
evenly), each with its generator's ``metadata["expression"]`` (valid Python) and its ground-truth answer; a family
may keep only some of them (``JobFamily.accepts``: the CoT families keep sums of one-digit terms).

Splits are disjoint by construction: each split draws from its own reasoning-gym seed (``seed`` plus a
per-split offset), and questions already used by an earlier split are dropped.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stare_verl.jobs.families.base import DATA_SOURCE_PREFIX, DEFAULT_FAMILY, DemoError, Problem
from stare_verl.jobs.families.registry import job_family

__all__ = [
    "DATA_SOURCE_PREFIX",
    "SPLIT_SEED_OFFSET",
    "DemoError",
    "Problem",
    "heldout_problems",
    "problem_row",
    "problems_to_json",
    "sample_problems",
    "split_problems",
    "task_table",
    "write_rl_parquet",
]

# Each split draws from its own seed: sft_train, heldout (the validation set, before and after RL), rl_train.
SPLIT_SEED_OFFSET = {"sft_train": 0, "heldout": 1_000_003, "rl_train": 2_000_006, "sft_dev": 3_000_009}


def task_table(family: str = DEFAULT_FAMILY) -> dict[str, dict[str, Any]]:
    """reasoning-gym generator name -> config for ``family``. Raises ValueError for an unknown family."""
    return {task: dict(cfg) for task, cfg in job_family(family).task_table.items()}


def _task_sizes(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def sample_problems(
    n: int, seed: int, exclude: Iterable[str] = (), family: str = DEFAULT_FAMILY
) -> list[Problem]:
    """``n`` distinct problems, the tasks of ``task_table(family)`` mixed evenly and shuffled under ``seed``.

    Questions in ``exclude`` (and repeats) are skipped, and those the family does not accept (the CoT families:
    an operator other than ``+``); the generators are asked for more until ``n`` are found. Raises ValueError for
    ``n < 0`` or an unknown family and DemoError if the generators cannot supply ``n`` distinct questions.
    """
    import reasoning_gym

    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    fam = job_family(family)
    tasks = fam.task_table
    seen = {" ".join(q.split()) for q in exclude}
    by_expression = fam.distinct_expressions
    out: list[Problem] = []
    for (task, cfg), want in zip(tasks.items(), _task_sizes(n, len(tasks)), strict=True):
        if want == 0:
            continue
        size = max(2 * want, 16)
        got: list[Problem] = []
        for _attempt in range(4):
            ds = reasoning_gym.create_dataset(task, seed=seed, size=size, **cfg)
            got = []
            taken = set(seen)
            for j in range(size):
                entry = ds[j]
                key = " ".join(str(entry["metadata"]["expression"] if by_expression else entry["question"]).split())
                if key in taken or not fam.accepts_expression(str(entry["metadata"]["expression"])):
                    continue
                taken.add(key)
                got.append(Problem(task, entry["question"], str(entry["answer"]).strip(),
                                   str(entry["metadata"]["expression"]), j))
                if len(got) == want:
                    break
            if len(got) == want:
                break
            size *= 4
        if len(got) < want:
            raise DemoError(f"{task}: only {len(got)} distinct questions for {want} (seed {seed})")
        seen.update(" ".join(problem_key(p, fam).split()) for p in got)
        out.extend(got)
    random.Random(seed).shuffle(out)
    return out


def problem_key(p: Problem, family) -> str:
    """What makes two problems the same for ``family`` (a name or ``JobFamily``): the question text, or the
    expression when the family's problems must differ in their arithmetic (``JobFamily.distinct_expressions``:
    the same sum asked in another wording is not a new problem)."""
    return p.expression if job_family(family).distinct_expressions else p.question


def split_problems(
    n_train: int, n_heldout: int, seed: int, n_rl: int = 0, family: str = DEFAULT_FAMILY, n_dev: int = 0
) -> dict[str, list[Problem]]:
    """The disjoint splits ``heldout``, ``sft_train``, (if ``n_rl``) ``rl_train`` and (if ``n_dev``) ``sft_dev``
    under one data seed.

    The held-out split is drawn first (it only depends on ``seed``, ``n_heldout`` and ``family``, so the same
    validation questions serve before and after RL); training splits exclude its questions and each other's.
    ``sft_dev`` (the SFT's early-stopping check, so that the held-out split is not used to pick the checkpoint)
    is drawn last, excluding the splits drawn in the same call (the SFT draws no ``rl_train``, so its dev questions
    may be among RL's training questions, which is harmless); adding it leaves the other splits as they were.
    """
    fam = job_family(family)
    heldout = heldout_problems(n_heldout, seed, family)
    used = [problem_key(p, fam) for p in heldout]
    train = sample_problems(n_train, seed + SPLIT_SEED_OFFSET["sft_train"], exclude=used, family=family)
    out = {"heldout": heldout, "sft_train": train}
    used += [problem_key(p, fam) for p in train]
    if n_rl:
        out["rl_train"] = sample_problems(n_rl, seed + SPLIT_SEED_OFFSET["rl_train"], exclude=used, family=family)
        used += [problem_key(p, fam) for p in out["rl_train"]]
    if n_dev:
        out["sft_dev"] = sample_problems(n_dev, seed + SPLIT_SEED_OFFSET["sft_dev"], exclude=used, family=family)
    return out


def heldout_problems(n: int, seed: int, family: str = DEFAULT_FAMILY) -> list[Problem]:
    """The held-out (validation) problems of data seed ``seed`` for ``family``."""
    return sample_problems(n, seed + SPLIT_SEED_OFFSET["heldout"], family=family)


def problem_row(
    p: Problem, split: str, index: int, agent_name: str | None = None, family: str = DEFAULT_FAMILY
) -> dict[str, Any]:
    """One verl RLHF row (``RLHFDataset`` schema) for problem ``p``: the family's row builder
    (``envs.family.EnvFamily.make_row``: ``agent_name``, ``extra_info.family``, and for tool use ``tools_kwargs`` /
    ``need_tools_kwargs`` as ``envs.tool_use.task.to_tool_use_row``) over a row whose prompt is the user question
    alone, with no system message: the tiny model pays for every prompt token and was fine-tuned on exactly this
    prompt; the tool list comes from the tool config through the chat template's ``tools=``.
    ``agent_name`` None: the family's.
    """
    fam = job_family(family)
    env = fam.env
    base = {
        "data_source": p.data_source,
        "prompt": [{"role": "user", "content": p.question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": p.answer},
        "extra_info": {"split": split, "index": int(index), "family": env.name, "task": p.task,
                       "question": p.question, "expression": p.expression},
    }
    if fam.reward_options:
        base["extra_info"]["reward_options"] = dict(fam.reward_options)
    row = env.make_row(base, system=None)
    if agent_name:
        row["agent_name"] = agent_name
    return row


def write_rl_parquet(
    out_dir: str | Path,
    n_train: int = 1024,
    n_val: int | None = None,
    seed: int = 0,
    agent_name: str | None = None,
    n_sft_train: int = 4096,
    n_heldout: int = 200,
    family: str = DEFAULT_FAMILY,
) -> dict[str, Path]:
    """Write ``train.parquet`` (RL problems) and ``val.parquet`` (held-out problems) for verl's RLHFDataset.

    The splits are drawn exactly as the SFT draws them (:func:`split_problems` with the SFT's ``n_train`` and
    ``n_heldout`` under the same data seed), so with the SFT configuration's values RL training problems are
    disjoint from the SFT demonstrations and from the held-out set, and ``val.parquet`` holds the held-out
    problems the SFT report and :func:`stare_verl.jobs.demo.evaluate.evaluate_checkpoint` use.
    (``stare_verl.jobs.demo.sft.write_rl_data`` passes them from an ``SFTConfig``.)

    Args:
        out_dir: folder for the two files (created).
        n_train: RL training problems.
        n_val: the first ``n_val`` held-out problems (None: all ``n_heldout``).
        seed: data seed (the SFT configuration's ``data_seed``).
        agent_name: verl agent loop per row (None: the family's, e.g. ``stare_tool_agent``
            (``envs.tool_use.agent_loop``) for tool use, verl's ``single_turn_agent`` for the CoT families).
        n_sft_train, n_heldout: the SFT problem count (``stare_verl.jobs.demo.sft.sft_problem_count``) and the SFT
            configuration's ``n_heldout``.
        family: a registered family (see :func:`problem_row`).
    Returns:
        ``{"train": path, "val": path}``.
    Raises:
        ValueError: ``n_train``, ``n_val`` or ``n_heldout`` below 1, or ``n_val > n_heldout``.
    """
    from envs.datasets import write_parquet

    n_val = n_heldout if n_val is None else n_val
    if min(n_train, n_val, n_heldout) < 1 or n_val > n_heldout:
        raise ValueError(f"need n_train >= 1 and 1 <= n_val <= n_heldout; got {n_train}, {n_val}, {n_heldout}")
    splits = split_problems(n_sft_train, n_heldout, seed, n_rl=n_train, family=family)
    train, val = splits["rl_train"], splits["heldout"][:n_val]
    out = Path(out_dir)
    return {
        "train": write_parquet([problem_row(p, "train", i, agent_name, family) for i, p in enumerate(train)],
                               out / "train.parquet"),
        "val": write_parquet([problem_row(p, "test", i, agent_name, family) for i, p in enumerate(val)],
                             out / "val.parquet"),
    }


def problems_to_json(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Plain dicts (for reports and caches)."""
    return [asdict(p) for p in problems]
