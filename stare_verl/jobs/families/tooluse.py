"""The tool-use family of the jobs (``TOOLUSE``): its task table and demonstrations for the CPU default run.

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
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envs.tool_use import TOOL_USE_FAMILY
from envs.tool_use.task import OFFLINE_TOOL_TASKS
from envs.tools.schema import CODE_INTERPRETER_SCHEMA_JSON, TOOL_NAME, tool_call_text
from stare_verl.jobs.families.base import DemoError, JobFamily, PretrainedTask, Problem

__all__ = [
    "CODE_INTERPRETER_SCHEMA",
    "CODE_STYLES",
    "TASKS",
    "TOOLUSE",
    "TOOLUSE_PRETRAINED",
    "TOOL_NAME",
    "Demo",
    "build_demos",
    "format_observation",
    "run_prints",
    "tool_call_text",
]

# The ``code_interpreter`` tool's OpenAI schema as verl's agent loop passes it to the chat template (a plain
# dict from ``envs.tools.schema``: importing ``envs.tools.code_interpreter`` would import verl). The demo chat
# template renders only the tool's name.
CODE_INTERPRETER_SCHEMA: dict[str, Any] = CODE_INTERPRETER_SCHEMA_JSON

# reasoning-gym generator name -> its config: the calibrated task mix of ``envs.tool_use.task``'s offline rows
# ('/' is left out: float output like 3.0).
TASKS: dict[str, dict[str, Any]] = dict(OFFLINE_TOOL_TASKS)

_PRINTS_PER_PROGRAM = 256

CODE_STYLES: tuple[str, ...] = (
    "print({expression})",
    "print({expression}, flush=True)",
    "print({expression})  # evaluate",
)
"""Equivalent programs of a demonstration (``SFTConfig.code_styles``: the first N, one sampled per demonstration;
1: ``print(<expression>)`` only). They print the same line, so the reward cannot tell them apart: a policy's
choice among them is free, like the order of the terms in the CoT families' demonstrations. They differ after the
copied expression: styles that differ before it (``x = <e>`` / ``print(x)``) shift the copy, and the 2-layer cold
start did not land with them (docs/results/tooluse-stare.md)."""


@dataclass(frozen=True)
class Demo:
    """A problem and the real tool output of its demonstration's code."""

    problem: Problem
    tool_output: str
    code: str = ""  # the program of the tool call ("" : the problem's ``print(<expression>)``)

    @property
    def program(self) -> str:
        """The code of the demonstration's tool call."""
        return self.code or self.problem.code

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tool list of the chat template (``tools=``): the ``code_interpreter`` schema."""
        return [CODE_INTERPRETER_SCHEMA]

    def prompt(self) -> list[dict[str, str]]:
        """The chat messages the model is prompted with (the tool list comes from ``tools=``)."""
        return [{"role": "user", "content": self.problem.question}]

    def messages(self) -> list[dict[str, Any]]:
        """The whole episode as chat messages (prompt, tool call, tool turn, boxed answer):
        ``envs.tool_use.sft_data.conversation_from_demo`` without a system message (the demo's prompt)."""
        from envs.tool_use.sft_data import conversation_from_demo

        return conversation_from_demo(self.problem.question, self.program, self.tool_output,
                                      f"\\boxed{{{self.tool_output}}}", system=None)

    def assistant_texts(self) -> list[str]:
        """The text of the two model turns (without ``<|im_end|>``), as the model must generate them."""
        return [tool_call_text(self.program), f"\\boxed{{{self.tool_output}}}"]


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


def build_demos(
    problems: Sequence[Problem], sandbox=None, codes: Sequence[str] | None = None
) -> tuple[list[Demo], list[Problem]]:
    """Demonstrations for ``problems`` with their real tool outputs.

    Args:
        problems: the problems.
        sandbox: an ``envs.sandbox`` backend (the process-wide default one if None).
        codes: each demonstration's program, one per problem (None: ``print(<expression>)``); each must print
            what ``print(<expression>)`` prints (:data:`CODE_STYLES`), which is what is run.
    Returns:
        ``(demos, rejected)``: a problem is rejected when the printed value differs from its ground truth
        (then its demonstration would teach a wrong answer).
    Raises:
        DemoError: from :func:`run_prints`.
    """
    from envs.sandbox import ExecResult

    if codes is not None and len(codes) != len(problems):
        raise ValueError(f"{len(codes)} programs for {len(problems)} problems")
    outputs = run_prints([p.expression for p in problems], sandbox)
    demos, rejected = [], []
    for i, (p, line) in enumerate(zip(problems, outputs, strict=True)):
        # what the tool shows for ``print(<expression>)`` run alone: one line of stdout, exit status 0
        out = format_observation(ExecResult(stdout=line + "\n", exit_code=0))
        if out.strip() == p.answer:
            demos.append(Demo(p, out, "" if codes is None else codes[i]))
        else:
            rejected.append(p)
    return demos, rejected


def _demonstrations(
    problems: Sequence[Problem], seed: int = 0, per_problem: int = 1, code_styles: int = 1
) -> tuple[list[Demo], list[Problem]]:
    """``JobFamily.demonstrations`` of tool use: one :func:`build_demos` demonstration per problem (``per_problem``
    changes nothing); with ``code_styles`` > 1 each program is one of the first ``code_styles`` of
    :data:`CODE_STYLES`, drawn with ``random.Random(seed)``. Raises ValueError for ``code_styles`` outside
    [1, len(CODE_STYLES)]."""
    if not 1 <= code_styles <= len(CODE_STYLES):
        raise ValueError(f"code_styles must be in [1, {len(CODE_STYLES)}], got {code_styles}")
    if code_styles == 1:
        return build_demos(problems)
    rng = random.Random(seed)
    codes = [CODE_STYLES[rng.randrange(code_styles)].format(expression=p.expression) for p in problems]
    return build_demos(problems, codes=codes)


# The pretrained model's tool-use task (``--model``): the tiny model's problem mix (``TASKS``), the question alone as
# the prompt (the tool list reaches a template that ignores ``tools=`` through the system message:
# ``envs.tool_use.tool_prompt``), scored on the answer's last number when there is no box. SmolLM2-135M-Instruct
# writes no tool call on its own, with either this prompt or the function-calling prompt it was tuned with, so a
# short warm start on the demonstrations (``stare_verl.jobs.demo.warm_start.ensure_warm_start``) runs before RL.
TOOLUSE_PRETRAINED = PretrainedTask(
    task_table=TASKS, reward_options={"last_number": True}, recipe="tooluse_real", sft_warm_start=True,
)

TOOLUSE = JobFamily(
    env=TOOL_USE_FAMILY,
    task_table=TASKS,
    demonstrations=_demonstrations,
    # 2 layers instead of the calibrated 4: it leaves the copy plateau earlier at half the cost per step
    # (stare_verl.jobs.demo.sft's docstring); numbers two digits a token (100 more tokens) and an lr that anneals
    # once the copy plateau ends, so every SFT seed reaches the accuracy bar before RL
    sft_defaults={"model": {"num_hidden_layers": 2}, "vocab_size": 484, "digits_per_token": 2, "steps": 1300,
                  "anneal_below_loss": 0.1},
    legacy_sft_key=True,
    min_sft_accuracy=0.5,
    gpu_recipe="tooluse_qwen2.5-7b-sft",
    tool_config="tool_use/tool_config.yaml",
    compare_dir="compare",
    pretrained=TOOLUSE_PRETRAINED,
)
