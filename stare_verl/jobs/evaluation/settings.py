"""The settings of an evaluation run (:class:`EvalSettings`), what identifies them (their fingerprint, with the data
file's digest) and the request seed of each sample (:func:`sample_seed`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SEED_STRIDE", "EvalSettings", "data_digest", "sample_seed"]

SEED_STRIDE = 1_000_003  # seeds of one problem's samples: base + problem_index * SEED_STRIDE + sample_index


class EvalSettings(BaseModel):
    """Sampling and episode settings (reference validation: k = 32, temperature 1.0, top_p 0.7).

    Attributes:
        k: samples per problem.
        temperature, top_p: sampling.
        max_tokens: response budget per sample in tokens (one turn for plain rows; model + tool tokens of all
            turns for tool-use rows, like verl's ``response_length``); None: the server's limit.
        seed: base seed; sample j of problem i is asked with ``sample_seed(seed, i, j)``; None: no seed sent.
        max_turns: most assistant turns of a tool-use episode (verl's ``max_assistant_turns``).
        tools: "auto" (tool loop for tool-use rows), "on" (every row), "off" (never; single turn).
        tool_choice: sent as ``tool_choice`` ("omit": not sent, the server's default). vLLM answers requests
            with tools and the default "auto" only when started with ``--enable-auto-tool-choice
            --tool-call-parser hermes``; ``none`` keeps the tools in the prompt and parses nothing there.
        max_tool_response_chars, tool_response_truncate_side: observation cut (verl's
            ``multi_turn.max_tool_response_length`` / ``tool_response_truncate_side``).
        max_parallel_calls: calls run per turn (verl's ``multi_turn.max_parallel_calls``); extra ones are
            answered with an error.
        tool_timeout_s: loop-side deadline of one tool call.
        reward_kwargs: options for ``envs.reward`` (as the recipe's ``reward_kwargs``).
    """

    model_config = ConfigDict(extra="forbid")

    k: int = Field(32, ge=1, le=100_000)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.7, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = 0
    max_turns: int = Field(8, ge=1)
    tools: Literal["auto", "on", "off"] = "auto"
    tool_choice: Literal["omit", "auto", "none"] = "omit"
    max_tool_response_chars: int = Field(1024, ge=1)
    tool_response_truncate_side: Literal["left", "middle", "right"] = "middle"
    max_parallel_calls: int = Field(1, ge=1)
    tool_timeout_s: float = Field(60.0, gt=0)
    reward_kwargs: dict[str, Any] = Field(default_factory=dict)

    def fingerprint(self, model: str, data: str | Path) -> dict[str, Any]:
        """What must match for earlier samples to be reused (``k`` may grow): the model, the data file's path and
        the SHA-256 of its bytes (``data_sha256``: :func:`data_digest`, None when ``data`` names no file), and
        every setting but ``k``. Data edited in place (new ground truths) has another digest, so its old
        records are never reused."""
        d = self.model_dump(exclude={"k"})
        return {"model": model, "data": str(data), "data_sha256": data_digest(data), **d}


def data_digest(path: str | Path) -> str | None:
    """SHA-256 (hex) of the bytes of the file at ``path``; None when there is no such file."""
    path = Path(path)
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sample_seed(base: int | None, problem_index: int, sample_index: int) -> int | None:
    """Request seed of sample ``sample_index`` of problem ``problem_index`` (None when ``base`` is None)."""
    if base is None:
        return None
    return int(base) + int(problem_index) * SEED_STRIDE + int(sample_index)
