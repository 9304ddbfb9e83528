"""Tool-use problems and demonstrations for the CPU default run, and the RL parquet of the same task.

Problems are real reasoning-gym questions (``basic_arithmetic`` with +, -, * only; ``chain_sum``;
``products``), mixed evenly, as in the calibration (``docs/cpu-demo-calibration.md``). Each carries
its generator's ``metadata["expression"]``, which is valid Python, and its ground-truth answer.

A demonstration is one hermes-style episode::

    user:       <question>
    assistant:  <tool_call>{"name": "code_interpreter", "arguments": {"code": "print(<expression>)"}}</tool_call>
    tool:       <what the project's sandbox printed for that code>
    assistant:  \\boxed{<the printed value>}

The tool text is produced by really running the code in the project's sandbox (``envs.sandbox``); many
``print`` lines are run per sandboxed program (one line per demonstration) to keep this fast, which prints
exactly what each ``print(<expression>)`` prints alone. A demonstration is kept only if the printed value is
the generator's answer.

Splits are disjoint by construction: each split draws from its own reasoning-gym seed (``seed`` plus a
per-split offset), and questions already used by an earlier split are dropped.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envs.contract import AGENT_NAME, JOB_FAMILIES
from envs.tools.schema import CODE_INTERPRETER_SCHEMA_JSON, TOOL_NAME, tool_call_text

__all__ = [
    "AGENT_NAME",
    "COT_AGENT_NAME",
    "COT_TASKS",
    "FAMILIES",
    "REWARD_FAMILY",
    "CODE_INTERPRETER_SCHEMA",
    "DATA_SOURCE_PREFIX",
    "SPLIT_SEED_OFFSET",
    "TASKS",
    "TOOL_NAME",
    "Demo",
    "DemoError",
    "Problem",
    "build_demos",
    "format_observation",
    "heldout_problems",
    "problem_row",
    "run_prints",
    "sample_problems",
    "split_problems",
    "task_table",
    "tool_call_text",
    "write_rl_parquet",
    "write_sft_parquet",
]

DATA_SOURCE_PREFIX = "rg"  # as envs.tool_use.task's offline rows

# The ``code_interpreter`` tool's OpenAI schema as verl's agent loop passes it to the chat template (a plain
# dict from ``envs.tools.schema``: importing ``envs.tools.code_interpreter`` would import verl). The demo chat
# template renders only the tool's name.
CODE_INTERPRETER_SCHEMA: dict[str, Any] = CODE_INTERPRETER_SCHEMA_JSON

# reasoning-gym generator name -> its config (calibrated task mix; '/' is left out: float output like 3.0).
TASKS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 4,
        "min_digits": 1,
        "max_digits": 3,
        "operators": ("+", "-", "*"),
    },
    "chain_sum": {"min_terms": 2, "max_terms": 5},
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 4},
}

# The CPU default's task families: ``tooluse`` (above), and the chain-of-thought families ``shortcot`` and
# ``longcot`` (``stare_verl.jobs.demo.cot``): reasoning-gym ``chain_sum`` questions with 3-4 one-digit terms, kept
# only when every operator is ``+`` (the tiny model has no tool, so it must learn the addition facts itself;
# addition commutes, so the order of the terms is free in a solution).
FAMILIES = tuple(JOB_FAMILIES)  # ("tooluse", "shortcot", "longcot")
COT_TASKS: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 1},
}
# ``envs.reward.compute_score``'s family name per CPU family.
REWARD_FAMILY = dict(JOB_FAMILIES)
COT_AGENT_NAME = "single_turn_agent"  # verl's own single-turn agent loop (no tool)
_ADDITION_ONLY = re.compile(r"\d+(?: \+ \d+)+")


def task_table(family: str = "tooluse") -> dict[str, dict[str, Any]]:
    """reasoning-gym generator name -> config for ``family``. Raises ValueError for an unknown family."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    return TASKS if family == "tooluse" else COT_TASKS


def _accepts(family: str, expression: str) -> bool:
    """Whether a generated question belongs to ``family`` (CoT families: sums of non-negative terms only)."""
    return family == "tooluse" or _ADDITION_ONLY.fullmatch(expression) is not None


# Each split draws from its own seed: sft_train, heldout (the validation set, before and after RL), rl_train.
SPLIT_SEED_OFFSET = {"sft_train": 0, "heldout": 1_000_003, "rl_train": 2_000_006, "sft_dev": 3_000_009}

_PRINTS_PER_PROGRAM = 256


class DemoError(RuntimeError):
    """The sandbox failed, or printed something other than one line per expression."""


@dataclass(frozen=True)
class Problem:
    """One reasoning-gym question with a Python expression that computes its answer.

    Attributes:
        task: generator name (a key of :func:`task_table` of its family).
        question: the question text as the generator wrote it.
        answer: ground-truth answer (str, an integer for these tasks).
        expression: ``metadata["expression"]``, valid Python.
        index: position within the generator's dataset (under the split's seed).
    """

    task: str
    question: str
    answer: str
    expression: str
    index: int

    @property
    def data_source(self) -> str:
        """``rg/<task>``: verl groups validation metrics by this."""
        return f"{DATA_SOURCE_PREFIX}/{self.task}"

    @property
    def code(self) -> str:
        """The program a correct demonstration runs."""
        return f"print({self.expression})"


@dataclass(frozen=True)
class Demo:
    """A problem and the real tool output of its demonstration's code."""

    problem: Problem
    tool_output: str

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tool list of the chat template (``tools=``): the ``code_interpreter`` schema."""
        return [CODE_INTERPRETER_SCHEMA]

    def prompt(self) -> list[dict[str, str]]:
        """The chat messages the model is prompted with (the tool list comes from ``tools=``)."""
        return [{"role": "user", "content": self.problem.question}]

    def messages(self) -> list[dict[str, Any]]:
        """The whole episode as chat messages (prompt, tool call, tool turn, boxed answer)."""
        call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": self.problem.code}}}
        return [
            *self.prompt(),
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": self.tool_output},
            {"role": "assistant", "content": f"\\boxed{{{self.tool_output}}}"},
        ]

    def assistant_texts(self) -> list[str]:
        """The text of the two model turns (without ``<|im_end|>``), as the model must generate them."""
        return [tool_call_text(self.problem.code), f"\\boxed{{{self.tool_output}}}"]


def _task_sizes(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def sample_problems(n: int, seed: int, exclude: Iterable[str] = (), family: str = "tooluse") -> list[Problem]:
    """``n`` distinct problems, the tasks of ``task_table(family)`` mixed evenly and shuffled under ``seed``.

    Questions in ``exclude`` (and repeats) are skipped, and for the CoT families questions with an operator
    other than ``+``; the generators are asked for more until ``n`` are found. Raises ValueError for ``n < 0``
    or an unknown family and DemoError if the generators cannot supply ``n`` distinct questions.
    """
    import reasoning_gym

    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    tasks = task_table(family)
    seen = {" ".join(q.split()) for q in exclude}
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
                key = " ".join(entry["question"].split())
                if key in taken or not _accepts(family, str(entry["metadata"]["expression"])):
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
        seen.update(" ".join(p.question.split()) for p in got)
        out.extend(got)
    random.Random(seed).shuffle(out)
    return out


def split_problems(
    n_train: int, n_heldout: int, seed: int, n_rl: int = 0, family: str = "tooluse", n_dev: int = 0
) -> dict[str, list[Problem]]:
    """The disjoint splits ``heldout``, ``sft_train``, (if ``n_rl``) ``rl_train`` and (if ``n_dev``) ``sft_dev``
    under one data seed.

    The held-out split is drawn first (it only depends on ``seed``, ``n_heldout`` and ``family``, so the same
    validation questions serve before and after RL); training splits exclude its questions and each other's.
    ``sft_dev`` (the SFT's early-stopping check, so that the held-out split is not used to pick the checkpoint)
    is drawn last, excluding the splits drawn in the same call (the SFT draws no ``rl_train``, so its dev questions
    may be among RL's training questions, which is harmless); adding it leaves the other splits as they were.
    """
    heldout = heldout_problems(n_heldout, seed, family)
    used = [p.question for p in heldout]
    train = sample_problems(n_train, seed + SPLIT_SEED_OFFSET["sft_train"], exclude=used, family=family)
    out = {"heldout": heldout, "sft_train": train}
    used += [p.question for p in train]
    if n_rl:
        out["rl_train"] = sample_problems(n_rl, seed + SPLIT_SEED_OFFSET["rl_train"], exclude=used, family=family)
        used += [p.question for p in out["rl_train"]]
    if n_dev:
        out["sft_dev"] = sample_problems(n_dev, seed + SPLIT_SEED_OFFSET["sft_dev"], exclude=used, family=family)
    return out


def heldout_problems(n: int, seed: int, family: str = "tooluse") -> list[Problem]:
    """The held-out (validation) problems of data seed ``seed`` for ``family``."""
    return sample_problems(n, seed + SPLIT_SEED_OFFSET["heldout"], family=family)


def format_observation(result) -> str:
    """The tool text the model sees for one sandbox result: ``envs.tools.code_interpreter.format_observation``
    (the ``code_interpreter`` tool's own formatting: stdout without its trailing newline, or the error tail)."""
    from envs.tools.code_interpreter import format_observation as tool_format

    return tool_format(result)


async def _run_prints_async(expressions: Sequence[str], sandbox=None) -> list[str]:
    from envs.sandbox import ExecLimits, run_code

    chunks = [expressions[i : i + _PRINTS_PER_PROGRAM] for i in range(0, len(expressions), _PRINTS_PER_PROGRAM)]
    limits = ExecLimits(timeout_s=30.0, cpu_s=30, max_output_bytes=1 << 20)

    async def one(chunk: Sequence[str]) -> list[str]:
        code = "\n".join(f"print({e})" for e in chunk) + "\n"
        res = await run_code(code, limits, sandbox=sandbox)
        if not res.ok or res.truncated:
            raise DemoError(f"sandbox run failed: exit {res.exit_code}, timed_out {res.timed_out}, "
                            f"error {res.sandbox_error!r}, stderr {res.stderr[-300:]!r}")
        lines = res.stdout.split("\n")
        if lines[-1] != "" or len(lines) - 1 != len(chunk):
            raise DemoError(f"expected {len(chunk)} printed lines, got {len(lines) - 1}")
        return lines[:-1]

    outs = await asyncio.gather(*(one(c) for c in chunks))
    return [line for chunk in outs for line in chunk]


def run_prints(expressions: Sequence[str], sandbox=None) -> list[str]:
    """Run ``print(e)`` for every expression in the project's sandbox; returns each printed line.

    Args:
        expressions: Python expressions whose value prints on one line.
        sandbox: an ``envs.sandbox`` backend (the process-wide default one if None).
    Raises:
        DemoError: the sandbox failed or the output is not one line per expression.
    """
    if not expressions:
        return []
    return asyncio.run(_run_prints_async(list(expressions), sandbox))


def build_demos(problems: Sequence[Problem], sandbox=None) -> tuple[list[Demo], list[Problem]]:
    """Demonstrations for ``problems`` with their real tool outputs.

    Returns:
        ``(demos, rejected)``: a problem is rejected when the printed value differs from its ground truth
        (then its demonstration would teach a wrong answer).
    Raises:
        DemoError: from :func:`run_prints`.
    """
    from envs.sandbox import ExecResult

    outputs = run_prints([p.expression for p in problems], sandbox)
    demos, rejected = [], []
    for p, line in zip(problems, outputs, strict=True):
        # what the tool shows for ``print(<expression>)`` run alone: one line of stdout, exit status 0
        out = format_observation(ExecResult(stdout=line + "\n", exit_code=0))
        if out.strip() == p.answer:
            demos.append(Demo(p, out))
        else:
            rejected.append(p)
    return demos, rejected


def problem_row(
    p: Problem, split: str, index: int, agent_name: str | None = None, family: str = "tooluse"
) -> dict[str, Any]:
    """One verl RLHF row (``RLHFDataset`` schema) for problem ``p``.

    Tool use: like ``envs.tool_use.task.to_tool_use_row`` (same ``agent_name``, ``tools_kwargs``,
    ``need_tools_kwargs`` and ``family: tool_use``, read by ``envs.tool_use.task.compute_score``) except for the
    prompt: the user question alone, with no system message. The tiny model pays for every prompt token and
    was fine-tuned on exactly this prompt; the tool list comes from the tool config through the chat
    template's ``tools=``.

    CoT families: the same prompt, ``agent_name`` verl's ``single_turn_agent`` (no tool), ``extra_info``
    with ``family`` ``short_cot`` / ``long_cot`` for ``envs.reward.compute_score``.
    ``agent_name`` None: the family's default.
    """
    extra: dict[str, Any] = {
        "split": split,
        "index": int(index),
        "family": REWARD_FAMILY[family],
        "task": p.task,
        "question": p.question,
        "expression": p.expression,
    }
    if family == "tooluse":
        extra["tools_kwargs"] = {TOOL_NAME: {"create_kwargs": {"data_source": p.data_source}}}
        extra["need_tools_kwargs"] = True
    return {
        "data_source": p.data_source,
        "prompt": [{"role": "user", "content": p.question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": p.answer},
        "extra_info": extra,
        "agent_name": agent_name or (AGENT_NAME if family == "tooluse" else COT_AGENT_NAME),
    }


def write_rl_parquet(
    out_dir: str | Path,
    n_train: int = 1024,
    n_val: int | None = None,
    seed: int = 0,
    agent_name: str | None = None,
    n_sft_train: int = 4096,
    n_heldout: int = 200,
    family: str = "tooluse",
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
        agent_name: verl agent loop per row (None: the project's ``stare_tool_agent`` (``envs.tool_use.agent_loop``)
            for tool use, verl's ``single_turn_agent`` for the CoT families).
        n_sft_train, n_heldout: the SFT problem count (``stare_verl.jobs.demo.sft.sft_problem_count``) and the SFT
            configuration's ``n_heldout``.
        family: ``tooluse``, ``shortcot`` or ``longcot`` (see :func:`problem_row`).
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


def write_sft_parquet(demos: Sequence[Demo], path: str | Path) -> Path:
    """Write demonstrations in the multi-turn layout of verl's ``MultiTurnSFTDataset`` (``verl.trainer.sft_trainer``).

    Columns: ``messages`` (the episode as chat messages, the assistant's tool call under ``tool_calls``) and
    ``tools`` (``[CODE_INTERPRETER_SCHEMA]``), the dataset's default ``messages_key`` / ``tools_key``. For
    cold-start SFT with verl's own trainer (e.g. a GPU model with its own tokenizer and chat template).

    Raises:
        ValueError: no demonstrations.
    """
    from envs.datasets import write_parquet

    if not demos:
        raise ValueError("no demonstrations to write")
    rows = [{"messages": d.messages(), "tools": [CODE_INTERPRETER_SCHEMA]} for d in demos]
    return write_parquet(rows, path)


def problems_to_json(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Plain dicts (for reports and caches)."""
    return [asdict(p) for p in problems]
