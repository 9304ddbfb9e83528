"""Simulators for driving verl's agent loop without a GPU: a scripted LLM server and a tiny local tokenizer.

``ScriptedLLMServer`` implements the client interface verl's agent loops call
(``verl.workers.rollout.llm_server.LLMServerClient.generate``): it answers each ``generate`` request with
pre-written token ids, turn by turn, so verl's real agent-loop code, the tool, the sandbox, the reward and
the STARE estimator run together in pytest. It behaves like a rollout server where that matters to the loop:

- a request's ``max_tokens`` / ``max_new_tokens`` cuts the scripted ids (as vLLM/SGLang do), and so does
  the context window when ``max_model_len`` is given;
- ``stop_token_ids`` end the turn at the first stop id (kept in the output, as vLLM does for EOS);
- ``stop_reason`` follows vLLM (``"completed"`` whether stopped or cut; the loop must not rely on it) or
  SGLang (``"stop"`` / ``"length"``), see ``stop_reason_style``;
- log-probs (a constant) when ``sampling_params["logprobs"]`` is truthy.

Episodes are matched to requests by a marker string in the decoded first prompt and by verl's sticky
``request_id`` (constant over the turns of one trajectory). Every request is recorded in ``calls``.

``build_tiny_tokenizer`` / ``build_tiny_model_dir``: the project's tiny tokenizer (``envs.tiny_hf``: byte-level
BPE, digits one per token, the ChatML/hermes chat template verl's Continuous Token builder works on) trained on a
few lines of this module. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from envs.tiny_hf import TinyModelConfig, build_tokenizer, tiny_qwen2_config
from envs.tools.schema import tool_call_text

__all__ = [
    "GenerateCall",
    "ScriptedEpisode",
    "ScriptedLLMServer",
    "ScriptedTurn",
    "ScriptError",
    "build_tiny_model_dir",
    "build_tiny_tokenizer",
    "tool_call_text",
]

_CORPUS = [
    "What is 12 + 7? Use the code interpreter. The answer is \\boxed{19}.",
    'print(12 + 7) print(r"\\boxed{42}") {"name": "code_interpreter", "arguments": {"code": "print(1)"}}',
    "I am not sure. Let me compute it with Python. maybe the result is wrong, try again.",
    "hello hello hello world he said llo. Error: the tool call is not valid JSON. timed out",
    "Calculate the product, the sum and the difference of the numbers. Final answer:",
    "while True: pass import time time.sleep(5) for i in range(10): x = x * 2",
    "hello " * 12,
]


def build_tiny_tokenizer(out_dir: str | Path | None = None, vocab_size: int = 400):
    """``envs.tiny_hf.build_tokenizer`` trained on this module's few lines (arguments as there).

    Returns:
        ``transformers.PreTrainedTokenizerFast``: eos ``<|im_end|>``, pad ``<|endoftext|>``; digits are one
        token each; ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``,
        ``<think>``, ``</think>`` are single added (non-special) tokens.
    """
    return build_tokenizer(_CORPUS * 8, out_dir, vocab_size=vocab_size)


def build_tiny_model_dir(out_dir: str | Path) -> str:
    """A model directory verl's ``HFModelConfig`` can load: the tiny tokenizer and a Qwen2 ``config.json``.

    No weights are written (the agent loop and reward workers only need the tokenizer and the config;
    ``model_type`` "qwen2" selects verl's Qwen Continuous Token builder). Returns the path (str).
    """
    out = Path(out_dir)
    tok = build_tiny_tokenizer(out)
    shape = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, max_position_embeddings=4096)  # fmt: skip
    tiny_qwen2_config(tok, shape).save_pretrained(out)
    return str(out)


class ScriptError(RuntimeError):
    """A request the script does not cover (no matching episode, or more turns than scripted)."""


@dataclass
class ScriptedTurn:
    """One scripted model turn.

    Attributes:
        text: turn text, encoded without special tokens (exclusive with ``ids``).
        ids: exact token ids to return (e.g. a word split unusually), exclusive with ``text``.
        eos: append the tokenizer's EOS id, as a server does when the model stops (False: the model kept
            going; with a ``max_tokens`` smaller than the ids this is a cut by the length limit).
    """

    text: str | None = None
    ids: list[int] | None = None
    eos: bool = True

    def token_ids(self, tokenizer) -> list[int]:
        """The ids the server returns for this turn (before ``max_tokens``/stop handling)."""
        if (self.text is None) == (self.ids is None):
            raise ScriptError("a ScriptedTurn needs exactly one of text or ids")
        ids = (
            list(self.ids) if self.ids is not None else tokenizer.encode(self.text, add_special_tokens=False)
        )
        if self.eos:
            ids.append(int(tokenizer.eos_token_id))
        return ids


@dataclass
class ScriptedEpisode:
    """The turns of one trajectory, selected by ``match`` (a substring of the decoded first prompt).

    Several episodes may share a ``match`` (``rollout.n`` samples of one prompt): they are handed out in
    order, one per new ``request_id``.
    """

    match: str
    turns: list[str | list[int] | ScriptedTurn]

    def turn(self, k: int) -> ScriptedTurn:
        t = self.turns[k]
        if isinstance(t, ScriptedTurn):
            return t
        if isinstance(t, str):
            return ScriptedTurn(text=t)
        return ScriptedTurn(ids=list(t))


@dataclass
class GenerateCall:
    """One recorded ``generate`` request and the server's answer."""

    request_id: str
    episode: int
    turn: int
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    output_ids: list[int]
    stop_reason: str


@dataclass
class _Session:
    episode: int
    turns_done: int = 0


class ScriptedLLMServer(LLMServerClient):
    """A scripted stand-in for verl's ``LLMServerClient`` (no Ray, no GPU).

    Args:
        tokenizer: the tokenizer of the run (encodes text turns; EOS id).
        episodes: the scripted trajectories.
        stop_reason_style: ``"vllm"`` (always "completed") or ``"sglang"`` ("stop" / "length").
        logprob: the log-prob reported for every generated token.
        global_steps: reported in ``extra_fields["global_steps"]`` like verl's servers.
        max_model_len: if given, a turn also stops at ``max_model_len - len(prompt_ids)`` tokens (vLLM).
        config: optional trainer config (kept as ``self.config``; not needed by this class).

    Raises (from ``generate``): ScriptError for a request no episode covers.
    """

    def __init__(
        self,
        tokenizer,
        episodes: Sequence[ScriptedEpisode],
        *,
        stop_reason_style: str = "vllm",
        logprob: float = -0.5,
        global_steps: int = 1,
        max_model_len: int | None = None,
        config: Any = None,
    ):
        super().__init__(config, load_balancer_handle=None)
        if stop_reason_style not in ("vllm", "sglang"):
            raise ValueError(f"stop_reason_style must be 'vllm' or 'sglang', got {stop_reason_style!r}")
        self.tokenizer = tokenizer
        self.episodes = list(episodes)
        self.stop_reason_style = stop_reason_style
        self.logprob = float(logprob)
        self.global_steps = global_steps
        self.max_model_len = max_model_len
        self.calls: list[GenerateCall] = []
        self._sessions: dict[str, _Session] = {}
        self._taken: set[int] = set()

    def _new_session(self, prompt_ids: list[int]) -> _Session:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        for i, ep in enumerate(self.episodes):
            if i not in self._taken and ep.match in text:
                self._taken.add(i)
                return _Session(episode=i)
        raise ScriptError(f"no unused scripted episode matches this prompt: {text[-300:]!r}")

    async def generate(
        self,
        request_id,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Return the next scripted turn of the trajectory ``request_id`` (verl's generate contract)."""
        prompt_ids = [int(t) for t in prompt_ids]
        session = self._sessions.get(request_id)
        if session is None:
            session = self._sessions[request_id] = self._new_session(prompt_ids)
        episode = self.episodes[session.episode]
        if session.turns_done >= len(episode.turns):
            raise ScriptError(
                f"episode {session.episode} ({episode.match!r}) has {len(episode.turns)} turns; "
                f"turn {session.turns_done + 1} was requested"
            )
        full = episode.turn(session.turns_done).token_ids(self.tokenizer)
        ids = list(full)
        stop_ids = set(sampling_params.get("stop_token_ids") or [])
        for j, t in enumerate(ids):
            if t in stop_ids:
                ids = ids[: j + 1]
                break
        max_tokens = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        if self.max_model_len is not None:  # vLLM: never past the context window
            room = max(1, self.max_model_len - len(prompt_ids))
            max_tokens = room if max_tokens is None else min(int(max_tokens), room)
        cut = max_tokens is not None and len(ids) > int(max_tokens)
        if cut:
            ids = ids[: int(max_tokens)]
        if self.stop_reason_style == "vllm":
            stop_reason = "completed"
        else:
            stop_reason = (
                "length" if cut or (ids == full and not episode.turn(session.turns_done).eos) else "stop"
            )
        self.calls.append(
            GenerateCall(
                request_id=str(request_id),
                episode=session.episode,
                turn=session.turns_done,
                prompt_ids=prompt_ids,
                sampling_params=dict(sampling_params),
                output_ids=list(ids),
                stop_reason=stop_reason,
            )
        )
        session.turns_done += 1
        log_probs = [self.logprob] * len(ids) if sampling_params.get("logprobs") else None
        return TokenOutput(
            token_ids=ids,
            log_probs=log_probs,
            stop_reason=stop_reason,
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps},
        )

    def calls_of(self, episode: int) -> list[GenerateCall]:
        """The recorded requests of one episode, in turn order."""
        return [c for c in self.calls if c.episode == episode]
