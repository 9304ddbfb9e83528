"""The ``hf`` generation server: a transformers causal LM behind verl's token-in/token-out interface.

:class:`GenerationEngine` runs continuous batching in a background thread: a request that arrives
while others are decoding is prefilled at the next step and joins the running batch (left-padded KV
cache), finished rows leave the batch at once, so nobody waits for a whole batch to finish.
Sampling follows vLLM's conventions (temperature 0 = greedy, ``top_k`` -1 or 0 = off, ``top_p`` 1 =
off, ``repetition_penalty`` 1 = off) and the returned log-probs are the *processed* ones (after
penalty, temperature, top-k, top-p), as ``rollout.logprobs_mode: processed_logprobs`` asks.
Sampling is deterministic under a seed: every request has its own counter-based random stream (its seed
and the token's position), so a sample does not depend on which other requests share the batch; the whole
batch is sampled in one set of tensor operations (:func:`sample_batch`). Under verl's trainer every request
carries a ``seed`` derived from the run's step and the row's position (``stare_verl.cpu.rollout_seeds``), so a
sample does not depend on which replica served it either.

:class:`HFGenerationServer` is the Ray actor a ``RolloutReplica`` launches (one per replica); the
agent loop calls its ``generate`` and the trainer its control methods (abort/resume, sleep/wake_up,
weight loading from the FSDP actor).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from stare_verl.cpu import verl_compat
from stare_verl.cpu.rollout_seeds import request_stream_seed

logger = logging.getLogger(__name__)

STOP_COMPLETED = "completed"
STOP_ABORTED = "aborted"

SAMPLING_EPS = 1e-5
"""Temperatures below this decode greedily (vLLM's ``_SAMPLING_EPS``)."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


DeviceChoice = Literal["auto", "cpu", "cuda"]


class HFServerOptions(BaseModel):
    """Options of the ``hf`` backend, from ``actor_rollout_ref.rollout.engine_kwargs.hf``."""

    model_config = ConfigDict(extra="forbid")

    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Weights/compute dtype of the server's model. None: float32 on the CPU (matches an fp32 FSDP actor),
    verl's ``rollout.dtype`` (default bfloat16) on a GPU; see :func:`choose_dtype`."""
    device: DeviceChoice = "auto"
    """Where the model runs: ``auto`` = the GPU the replica's trainer ranks use when verl's platform is an
    accelerator and CUDA is available in the server, else the CPU; see :func:`choose_device`."""
    max_batch_size: int = Field(default=64, ge=1)
    """Most sequences decoded together; further requests wait in a queue."""
    num_threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads of the server process (None: leave torch's default)."""
    attn_implementation: str = "sdpa"
    sync_weights: bool = True
    """False keeps the initial weights forever (a negative control for weight-sync tests)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Ray resources the server actor asks for, e.g. ``{"rollout_node": 1}`` with ``ray start
    --resources='{"rollout_node": 8}'`` on the rollout nodes. Empty (the default): none, and the server runs on
    the node of its replica's first trainer rank (sharing that rank's GPU on an accelerator). Set: Ray places
    the server on a node that has them, so rollout can run on other nodes than the actor ranks; the weights
    still go from the replica's first rank to the server through Ray's object store (no NCCL). ``"CPU"`` and
    ``"GPU"`` become the actor's ``num_cpus``/``num_gpus``: a server on a GPU node of its own needs
    ``"GPU": 1`` (it then uses the GPU Ray gives it)."""

    @field_validator("resources")
    @classmethod
    def _positive_resources(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not x > 0}
        if bad:
            raise ValueError(f"engine_kwargs.hf.resources amounts must be > 0, got {bad}")
        return v


def hf_options(rollout_config) -> HFServerOptions:
    """The :class:`HFServerOptions` of a verl rollout config (dataclass or DictConfig): its
    ``engine_kwargs.hf`` (OmegaConf containers made plain first). Raises pydantic's ValidationError on an
    unknown key or a bad value."""
    from omegaconf import DictConfig, OmegaConf

    engine_kwargs = getattr(rollout_config, "engine_kwargs", None) or {}
    hf = engine_kwargs.get("hf") or {}
    if isinstance(hf, DictConfig):
        hf = OmegaConf.to_container(hf, resolve=True)
    return HFServerOptions(**dict(hf))


_warned_ignored_keys: set[str] = set()


class SamplingParams(BaseModel):
    """Per-request sampling parameters in vLLM conventions (what verl's agent loop sends).

    Other keys are ignored, with a warning the first time each is seen.
    """

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    max_tokens: int | None = Field(default=None, ge=0)
    stop_token_ids: list[int] = Field(default_factory=list)
    logprobs: bool | int | None = False
    ignore_eos: bool = False
    seed: int | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or >= 1, got {v}")
        return v

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _stop_ids(cls, v):
        return [] if v is None else list(v)

    @classmethod
    def from_request(cls, params: dict[str, Any]) -> SamplingParams:
        """Parse a verl/vLLM sampling dict (``max_new_tokens`` is accepted for ``max_tokens``)."""
        params = dict(params or {})
        if "max_tokens" not in params and "max_new_tokens" in params:
            params["max_tokens"] = params.pop("max_new_tokens")
        ignored = sorted(set(params) - set(cls.model_fields) - _warned_ignored_keys)
        if ignored:
            _warned_ignored_keys.update(ignored)
            logger.warning("hf rollout ignores unsupported sampling parameters %s", ignored)
        return cls(**params)

    @property
    def greedy(self) -> bool:
        """Argmax decoding: temperature below vLLM's sampling epsilon (1e-5; dividing by less overflows float32
        logits) or ``top_k`` 1."""
        return self.temperature < SAMPLING_EPS or self.top_k == 1


_DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}  # fmt: skip


def choose_device(requested: str, cuda_available: bool, platform_device: str) -> str:
    """Device of the ``hf`` server's model: ``"cpu"`` or ``"cuda"``.

    Args:
        requested: ``engine_kwargs.hf.device`` (``auto``, ``cpu`` or ``cuda``).
        cuda_available: whether CUDA works in the server process (``torch.cuda.is_available()`` there,
            after the replica's visible devices were applied).
        platform_device: verl's platform device name seen by the replica (``"cpu"`` under ``VERL_PLATFORM=cpu``,
            ``"cuda"`` on NVIDIA); ``auto`` never leaves the CPU on the ``cpu`` platform, so a run forced onto
            the CPU backend stays there on a GPU machine.

    Raises:
        RuntimeError: ``cuda`` requested but CUDA is not available.
        ValueError: an unknown ``requested`` value.
    """
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if not cuda_available:
            raise RuntimeError(
                "actor_rollout_ref.rollout.engine_kwargs.hf.device=cuda, but CUDA is not available in the hf "
                "server process (no GPU visible to it); use device=auto or cpu"
            )
        return "cuda"
    if requested != "auto":
        raise ValueError(f"engine_kwargs.hf.device must be auto, cpu or cuda, got {requested!r}")
    return "cuda" if cuda_available and platform_device != "cpu" else "cpu"


def choose_dtype(hf_dtype: str | None, rollout_dtype: str | None, device: str) -> str:
    """Model dtype name of the ``hf`` server (a key of ``_DTYPES``).

    ``engine_kwargs.hf.dtype`` wins when set; otherwise float32 on the CPU (what the CPU path always used) and
    verl's ``rollout.dtype`` on a GPU (``bf16``/``fp16``/``fp32`` spellings accepted; None or ``auto``:
    bfloat16, verl's default).

    Raises:
        ValueError: an unknown ``rollout.dtype``.
    """
    if hf_dtype is not None:
        return hf_dtype
    if device == "cpu":
        return "float32"
    if rollout_dtype is None or str(rollout_dtype).lower() == "auto":
        return "bfloat16"
    name = _DTYPE_ALIASES.get(str(rollout_dtype).lower().removeprefix("torch."))
    if name is None:
        raise ValueError(
            f"actor_rollout_ref.rollout.dtype={rollout_dtype!r} is not a dtype the hf rollout supports "
            f"({', '.join(sorted(_DTYPES))})"
        )
    return name


def server_cuda_ordinal(worker_visible: list[str], own_visible: str | None) -> int:
    """The CUDA ordinal, in the server's own view, of the GPU its replica's first trainer rank uses.

    The server actor asks Ray for no GPU: it shares the GPU of its trainer ranks, as verl's SGLang replica does,
    and is started with Ray's ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` so that Ray leaves it the node's
    devices. Its visible devices are not narrowed (CUDA may already be initialised by the time the actor's
    ``__init__`` runs: unpickling verl's config imports verl, whose platform probe queries CUDA); the ordinal is
    looked up instead.

    Args:
        worker_visible: ``CUDA_VISIBLE_DEVICES`` of the replica's trainer ranks on the server's node (each a comma
            list of device ids, as Ray sets it); the lowest id is used.
        own_visible: the server process's ``CUDA_VISIBLE_DEVICES`` (None or empty: unset, every GPU visible).

    Raises:
        ValueError: no device id among ``worker_visible``, or that GPU is not visible to the server.
    """
    ids = sorted({d.strip() for v in worker_visible for d in (v or "").split(",") if d.strip()}, key=_id_key)
    if not ids:
        raise ValueError(f"the replica's trainer ranks report no CUDA_VISIBLE_DEVICES ({worker_visible!r})")
    own = [d.strip() for d in own_visible.split(",")] if own_visible and own_visible.strip() else None
    if own is None:
        if not ids[0].isdigit():
            raise ValueError(
                f"GPU {ids[0]!r} of the trainer ranks is not an index and the server sees every GPU"
            )
        return int(ids[0])
    if ids[0] not in own:
        raise ValueError(
            f"GPU {ids[0]} of the trainer ranks is not visible to the hf server ({own_visible!r})"
        )
    return own.index(ids[0])


def _id_key(device_id: str):
    return (0, int(device_id), "") if device_id.isdigit() else (1, 0, device_id)


@dataclass
class GenerationResult:
    """What one request produced: ``token_ids`` (list[int]), their processed log-probs, stop reason."""

    token_ids: list[int]
    log_probs: list[float]
    stop_reason: str
    finished_at_steps: Any = None


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop_ids: frozenset[int]
    rng_seed: int | None  # None: greedy
    future: concurrent.futures.Future
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)


class GenerationEngine:
    """Continuous-batching generation over a transformers causal LM, in a background thread.

    Every tensor of the batch (ids, masks, KV cache, sampling) lives on the model's device (CPU or a GPU);
    the uniforms of the per-request random streams are drawn on the host, so a seed gives the same samples
    wherever the logits are the same (across devices only up to their logits' round-off).

    Args:
        model: a ``transformers`` causal LM in eval mode (left-padded batches, ``DynamicCache``).
        eos_token_ids: ids that end a sequence unless ``ignore_eos``.
        max_model_len: prompt + response limit in tokens.
        max_batch_size: most sequences decoded together.
        seed: base seed; a request without its own ``seed`` gets one derived from this seed, the prompt
            and how many times that prompt was seen, so reruns give identical samples. A request with its own
            ``seed`` draws from a stream of that seed and its prompt only (the same on every engine).
        pad_token_id: filler id for left padding (masked out).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        max_model_len: int,
        max_batch_size: int = 64,
        seed: int = 0,
        pad_token_id: int = 0,
    ):
        self.model = model
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.max_model_len = int(max_model_len)
        self.max_batch_size = int(max_batch_size)
        self.seed = int(seed)
        self.pad_token_id = int(pad_token_id)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.device = model.get_input_embeddings().weight.device
        self.global_steps: Any = None
        self.steps_run = 0  # decode/prefill forward passes, for tests and benchmarks

        self._cond = threading.Condition()
        self._model_lock = threading.Lock()
        self._pending: list[_Request] = []
        self._abort_waiters: list[concurrent.futures.Future] = []
        self._stop = False
        self._prompt_counts: dict[bytes, int] = defaultdict(int)
        # running batch
        self._rows: list[_Request] = []
        self._cache = None
        self._mask: torch.Tensor | None = None
        self._next_pos: torch.Tensor | None = None
        self._last: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._loop, name="hf-generation-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API (any thread)

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> concurrent.futures.Future:
        """Queue one request; the future resolves to a :class:`GenerationResult`.

        Raises:
            ValueError: empty prompt, token id outside the vocabulary, or prompt longer than
                ``max_model_len - 1``.
            RuntimeError: the engine was shut down.
        """
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise ValueError(
                f"prompt length {len(prompt)} leaves no room under max_model_len {self.max_model_len}"
            )
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else self.eos_token_ids
        )
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._stop:
                raise RuntimeError("generation engine is shut down")
            rng_seed = None if params.greedy else self._request_seed(prompt, params)
            request = _Request(prompt, params, max_tokens, stop_ids, rng_seed, future)
            if max_tokens == 0:
                future.set_result(GenerationResult([], [], STOP_COMPLETED, self.global_steps))
                return future
            self._pending.append(request)
            self._cond.notify_all()
        return future

    def abort_all(self) -> concurrent.futures.Future:
        """Finish every queued and running request now with its partial tokens (stop_reason "aborted").

        Returns a future that resolves once no request is left (the current forward pass completes first).
        """
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            self._abort_waiters.append(done)
            self._cond.notify_all()
        return done

    def load_weights(self, named_tensors) -> int:
        """Copy ``(hf_name, tensor)`` pairs into the model between forward passes; returns the count.

        Raises:
            KeyError: a name that is not a parameter or buffer of the model.
            ValueError: a shape mismatch.
        """
        state = self.model.state_dict(keep_vars=True)
        count = 0
        with self._model_lock, torch.no_grad():
            for name, tensor in named_tensors:
                target = state.get(name)
                if target is None:
                    raise KeyError(f"weight {name!r} is not in the rollout model")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"weight {name!r}: shape {tuple(tensor.shape)} != model {tuple(target.shape)}"
                    )
                target.copy_(tensor)
                count += 1
        return count

    def weights_fingerprint(self, per_tensor: int = 4096) -> float:
        """A cheap checksum of the served weights (float64 sum of up to ``per_tensor`` evenly strided elements of
        every parameter and buffer, in ``state_dict`` order): it changes when an update changes the weights, and
        costs a few thousand elements per tensor, not a pass over the model."""
        total = 0.0
        with self._model_lock, torch.no_grad():
            for t in self.model.state_dict().values():
                flat = t.reshape(-1)
                if flat.numel() == 0 or not (flat.is_floating_point() or flat.is_complex()):
                    continue
                step = max(1, flat.numel() // per_tensor)
                total += float(flat[::step][:per_tensor].double().sum())
        return total

    def num_requests(self) -> int:
        """Queued plus running requests."""
        with self._cond:
            return len(self._pending) + len(self._rows)

    def shutdown(self) -> None:
        """Abort everything and stop the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ engine thread

    def _request_seed(self, prompt: list[int], params: SamplingParams) -> int:
        """The request's random stream: from its explicit ``seed`` and its prompt when it has one
        (:func:`~stare_verl.cpu.rollout_seeds.request_stream_seed`, independent of this server), else from the
        engine's seed, the prompt and how many times this engine saw that prompt (the fallback, e.g. for direct
        use without verl's trainer; it depends on which requests reached this engine)."""
        if params.seed is not None:
            return request_stream_seed(params.seed, prompt)
        key = hashlib.blake2b(
            torch.tensor(prompt, dtype=torch.int64).numpy().tobytes(), digest_size=16
        ).digest()
        n = self._prompt_counts[key]
        self._prompt_counts[key] = n + 1
        digest = hashlib.blake2b(key + f"{self.seed}:{n}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._abort_waiters or self._pending or self._rows):
                    self._cond.wait()
                if self._stop or self._abort_waiters:
                    waiters, self._abort_waiters = self._abort_waiters, []
                    self._finish_all(STOP_ABORTED)
                    for w in waiters:
                        w.set_result(None)
                    if self._stop:
                        return
                    continue
                free = self.max_batch_size - len(self._rows)
                admit, self._pending = self._pending[:free], self._pending[free:]
            try:
                with self._model_lock, torch.inference_mode():
                    if admit:
                        self._prefill(admit)
                    if self._rows:
                        self._decode()
            except Exception as e:  # fail the requests, keep the server alive
                logger.exception("hf generation step failed")
                for r in admit + self._rows:
                    if not r.future.done():
                        r.future.set_exception(e)
                self._reset_batch()

    def _finish_all(self, reason: str) -> None:
        for r in self._pending + self._rows:
            self._resolve(r, reason)
        self._pending = []
        self._reset_batch()

    def _reset_batch(self) -> None:
        self._rows, self._cache, self._mask, self._next_pos, self._last = [], None, None, None, None

    def _resolve(self, r: _Request, reason: str) -> None:
        if not r.future.done():
            r.future.set_result(
                GenerationResult(list(r.tokens), list(r.log_probs), reason, self.global_steps)
            )

    def _forward(self, input_ids, attention_mask, position_ids, cache):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        self.steps_run += 1
        return out.logits[:, -1, :].float(), out.past_key_values

    def _prefill(self, new: list[_Request]) -> None:
        from transformers import DynamicCache

        length = max(len(r.prompt) for r in new)
        ids = torch.full((len(new), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(new), length), dtype=torch.long)
        for i, r in enumerate(new):
            ids[i, length - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[i, length - len(r.prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)  # built on the host, one copy each
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, mask, pos, DynamicCache())
        for layer in cache.layers:
            if type(layer).__name__ != "DynamicLayer":
                raise NotImplementedError(
                    f"hf rollout supports full-attention caches only, got {type(layer).__name__}"
                )
        tokens = self._sample(logits, new)
        lengths = mask.sum(-1)
        self._merge(new, cache, mask, lengths, tokens)

    def _decode(self) -> None:
        mask = torch.cat(
            [self._mask, torch.ones((len(self._rows), 1), dtype=torch.long, device=self.device)], dim=1
        )
        logits, self._cache = self._forward(self._last[:, None], mask, self._next_pos[:, None], self._cache)
        self._mask = mask
        self._next_pos = self._next_pos + 1
        self._last = self._sample(logits, self._rows)
        self._drop_finished()

    def _merge(self, new, cache, mask, next_pos, last) -> None:
        if self._rows:
            width = max(self._mask.shape[1], mask.shape[1])
            old_pad, new_pad = width - self._mask.shape[1], width - mask.shape[1]
            for old_layer, new_layer in zip(self._cache.layers, cache.layers, strict=True):
                old_layer.keys = torch.cat(
                    [_left_pad(old_layer.keys, old_pad), _left_pad(new_layer.keys, new_pad)]
                )
                old_layer.values = torch.cat(
                    [_left_pad(old_layer.values, old_pad), _left_pad(new_layer.values, new_pad)]
                )
            self._mask = torch.cat([_left_pad(self._mask, old_pad, dim=1), _left_pad(mask, new_pad, dim=1)])
            self._next_pos = torch.cat([self._next_pos, next_pos])
            self._last = torch.cat([self._last, last])
            self._rows = self._rows + list(new)
        else:
            self._rows, self._cache, self._mask, self._next_pos, self._last = (
                list(new),
                cache,
                mask,
                next_pos,
                last,
            )
        self._drop_finished()

    def _drop_finished(self) -> None:
        keep = []
        for i, r in enumerate(self._rows):
            last = r.tokens[-1] if r.tokens else None
            if (
                last in r.stop_ids
                or len(r.tokens) >= r.max_tokens
                or len(r.prompt) + len(r.tokens) >= self.max_model_len
            ):
                self._resolve(r, STOP_COMPLETED)
            else:
                keep.append(i)
        if len(keep) == len(self._rows):
            return
        if not keep:
            self._reset_batch()
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self._cache.batch_select_indices(idx)
        self._rows = [self._rows[i] for i in keep]
        self._mask, self._next_pos, self._last = self._mask[idx], self._next_pos[idx], self._last[idx]
        # drop leading columns that are padding in every remaining row
        lead = int((self._mask.cumsum(-1) == 0).all(dim=0).sum())
        if lead:
            self._mask = self._mask[:, lead:]
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, lead:, :], layer.values[:, :, lead:, :]

    def _sample(self, logits: torch.Tensor, rows: list[_Request]) -> torch.Tensor:
        """Pick one token per row; record it and its processed log-prob. logits: [B, V] float32."""
        penalised = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
        if penalised:
            logits = logits.clone()
            for i in penalised:  # rare: per row, over the tokens that row has seen
                r, row = rows[i], logits[i]
                seen = torch.tensor(
                    sorted(set(r.prompt) | set(r.tokens)), dtype=torch.long, device=row.device
                )
                vals = row[seen]
                penalty = r.params.repetition_penalty
                row[seen] = torch.where(vals > 0, vals / penalty, vals * penalty)
        tokens, logp = sample_batch(
            logits,
            temperature=[r.params.temperature for r in rows],
            top_k=[r.params.top_k for r in rows],
            top_p=[r.params.top_p for r in rows],
            uniform=[None if r.rng_seed is None else stream_uniform(r.rng_seed, len(r.tokens)) for r in rows],
        )
        for r, tok, lp in zip(rows, tokens.tolist(), logp.tolist(), strict=True):
            r.tokens.append(tok)
            r.log_probs.append(lp)
        return tokens


_MASK64 = (1 << 64) - 1
_CDF_BLOCK = 1024  # vocabulary block of the two-level inverse-CDF search in sample_batch


def stream_uniform(seed: int, index: int) -> float:
    """The ``index``-th uniform in [0, 1) of the random stream ``seed`` (SplitMix64 of seed + index * golden gamma).

    Counter-based: any element is computed directly, so a request's draw depends only on its seed and its
    token position, not on the other requests in the batch or the order they were served in. 53 bits. Seeds
    are taken modulo 2**64, and seed ``s + 0x9E3779B97F4A7C15`` is stream ``s`` shifted by one position: fine
    for the hashed seeds of :meth:`GenerationEngine._request_seed`, not for seeds that step by that constant.
    """
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z >> 11) * (1.0 / (1 << 53))


def sample_batch(
    logits: torch.Tensor,
    temperature: list[float],
    top_k: list[int],
    top_p: list[float],
    uniform: list[float | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row in vLLM conventions; return the tokens and their processed log-probs.

    Row ``i`` is greedy when ``uniform[i]`` is None (argmax of the raw logits, log-prob under the untempered
    softmax). Otherwise its logits are divided by ``temperature[i]``, cut to the ``top_k[i]`` largest (off when
    -1, 0 or >= V; ties at the k-th value are kept) and to the smallest set whose probability reaches
    ``top_p[i]`` (off at 1; the most likely token is always kept), and the token is drawn by inverting the
    CDF of the remaining distribution at ``uniform[i]`` (a number in [0, 1); float64 sums, over blocks of the
    vocabulary then within one block): a token of probability 0 is never drawn. The log-prob returned is the
    *processed* one (after temperature and truncation). A row's token does not depend on the other rows; its
    log-prob may differ in the last float32 bits (batched ``log_softmax``, ~1e-5 at V = 150k).

    Args:
        logits: [B, V] float32, any device.
        temperature, top_k, top_p, uniform: one entry per row (B); sampled rows need temperature > 0.

    Returns:
        (tokens [B] int64, log-probs [B] float32), on ``logits``' device.

    Raises:
        ValueError: a row whose processed distribution is not a finite one (NaN or +inf logits, all -inf, or a
            temperature that overflows them; greedy rows too), naming the rows. The engine then fails every
            request of that decoding step (as any error in a step), not only those rows.
    """
    n, vocab = logits.shape
    device = logits.device
    sampled = [u is not None for u in uniform]
    # the greedy rows' tokens (a [B, V] pass skipped when every row samples)
    tokens = torch.zeros(n, dtype=torch.long, device=device) if all(sampled) else torch.argmax(logits, dim=-1)
    if not any(sampled):  # greedy batch: log-prob = logit - logsumexp, no [B, V] log_softmax
        picked = logits.gather(1, tokens[:, None])[:, 0]
        out = picked - torch.logsumexp(logits, dim=-1)
        _require_finite(torch.isfinite(out), torch.arange(n, device=device))
        return tokens, out
    work = logits
    temps = [t if s else 1.0 for t, s in zip(temperature, sampled, strict=True)]
    if any(t != 1.0 for t in temps):
        work = logits / torch.tensor(temps, device=device, dtype=logits.dtype)[:, None]
    ks = [k if s and 0 < k < vocab else 0 for k, s in zip(top_k, sampled, strict=True)]
    ps = [p if s else 1.0 for p, s in zip(top_p, sampled, strict=True)]
    if any(p < 1.0 for p in ps):
        work = _truncate_sorted(work, ks, ps)
    elif any(ks):  # top-k alone: the k-th largest from topk(max k), not a full sort of the vocabulary
        work = work.masked_fill(_below_kth(work, torch.topk(work, max(ks), dim=-1).values, ks), float("-inf"))
    logp = torch.log_softmax(work, dim=-1)
    rows = torch.tensor([i for i, s in enumerate(sampled) if s], device=device)
    u = torch.tensor([x for x in uniform if x is not None], dtype=torch.float64, device=device)
    drawn, finite = _inverse_cdf(logp.index_select(0, rows), u.nan_to_num(0.0).clamp(0.0, 1.0))
    _require_finite(finite, rows)
    tokens = tokens.index_copy(0, rows, drawn)
    out = logp.gather(1, tokens[:, None])[:, 0]
    _require_finite(torch.isfinite(out), torch.arange(n, device=device))
    return tokens, out


def _require_finite(ok: torch.Tensor, rows: torch.Tensor) -> None:
    """Raise ValueError naming ``rows[~ok]`` (batch row indices) when any is not ok."""
    if not bool(ok.all()):
        bad = rows[~ok].tolist()
        raise ValueError(
            f"rows {bad[:8]} have no finite sampling distribution (NaN/inf logits or temperature)"
        )


def _below_kth(values: torch.Tensor, descending: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """[B, V] bool: the entries of ``values`` below their row's k-th largest value (ties kept), read from
    ``descending`` (each row's values sorted in descending order, at least ``max(ks)`` of them); rows with k 0
    keep everything."""
    device = values.device
    kth = descending.gather(1, torch.tensor([max(k, 1) - 1 for k in ks], device=device)[:, None])
    return torch.tensor([k > 0 for k in ks], device=device)[:, None] & (values < kth)


def _truncate_sorted(work: torch.Tensor, ks: list[int], ps: list[float]) -> torch.Tensor:
    """``work`` [B, V] with the tokens outside each row's top-k (k 0 = off) and top-p set to -inf (one sort)."""
    device = work.device
    sorted_vals, order = torch.sort(work, dim=-1, descending=True)
    drop_sorted = (
        _below_kth(sorted_vals, sorted_vals, ks)
        if any(ks)
        else torch.zeros_like(sorted_vals, dtype=torch.bool)
    )
    probs = torch.softmax(sorted_vals.masked_fill(drop_sorted, float("-inf")), dim=-1)
    top_p = torch.tensor(ps, device=device, dtype=probs.dtype)[:, None]
    # only rows with top_p < 1: a float32 cumsum over a large vocabulary passes 1 and would cut a top_p-1 row's tail
    over = ((probs.cumsum(-1) - probs) > top_p) & (top_p < 1.0)
    over[:, 0] = False
    drop_sorted |= over
    return work.masked_fill(torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted), float("-inf"))


def _inverse_cdf(logp: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens drawn from ``exp(logp)`` ([R, V]) at the uniforms ``u`` ([R] float64), and which rows had a finite,
    positive total. Float64 sums; above ``4 * _CDF_BLOCK`` tokens in two levels (sums per vocabulary block, then
    a cumsum inside the chosen block only), which spares a [R, V] float64 cumsum on large vocabularies. Either
    way the token is the first whose CDF exceeds ``u * total`` (strictly: a token of probability 0 never is)."""
    r, vocab = logp.shape
    probs = logp.double().exp()

    def point_of(total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # total: [R, 1]
        finite = torch.isfinite(total[:, 0]) & (total[:, 0] > 0)
        return torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total))), finite

    if vocab <= 4 * _CDF_BLOCK:
        cdf = probs.cumsum(-1)
        point, finite = point_of(cdf[:, -1:])
        drawn = torch.searchsorted(cdf, point, right=True)[:, 0].clamp(max=vocab - 1)
        return torch.where(finite, drawn, torch.zeros_like(drawn)), finite
    blocks = -(-vocab // _CDF_BLOCK)
    padded = torch.nn.functional.pad(probs, (0, blocks * _CDF_BLOCK - vocab)).view(r, blocks, _CDF_BLOCK)
    block_cdf = padded.sum(-1).cumsum(-1)  # [R, blocks]
    point, finite = point_of(block_cdf[:, -1:])
    block = torch.searchsorted(block_cdf, point, right=True).clamp(max=blocks - 1)  # [R, 1]
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(point))
    chosen = padded[torch.arange(r, device=logp.device), block[:, 0]]  # [R, BLOCK]
    # round-off can leave the point at or past the block's last sum: clamp to its last token of positive mass
    pos = torch.searchsorted(chosen.cumsum(-1), point - before, right=True)[:, 0]
    pos = torch.minimum(pos, (chosen > 0).cumsum(-1).argmax(-1))
    drawn = (block[:, 0] * _CDF_BLOCK + pos).clamp(max=vocab - 1)
    return torch.where(finite, drawn, torch.zeros_like(drawn)), finite


def _left_pad(t: torch.Tensor, n: int, dim: int = 2) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def eos_token_ids_of(model_config) -> list[int]:
    """EOS ids from a verl ``HFModelConfig``: generation config, then model config, then tokenizer."""
    ids: list[int] = []
    for source in (
        getattr(model_config, "generation_config", None),
        getattr(model_config, "hf_config", None),
    ):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            ids.extend(eos if isinstance(eos, list | tuple) else [eos])
    tokenizer = getattr(model_config, "tokenizer", None)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(int(i) for i in ids))


def load_model(
    path: str,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    trust_remote_code=False,
    device: str | torch.device = "cpu",
):
    """Load a causal LM for generation (eval mode, no grad) in ``dtype`` on ``device`` ("cpu", "cuda:0", ...)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=_DTYPES[dtype],
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


class HFGenerationServer:
    """Generation server of one ``hf`` rollout replica (wrapped with ``ray.remote`` by the replica).

    Args:
        config: verl ``RolloutConfig`` (or its DictConfig); ``engine_kwargs.hf`` holds
            :class:`HFServerOptions`.
        model_config: verl ``HFModelConfig`` (or its DictConfig).
        replica_rank: index of the replica (part of the sampling seed).
        rollout_mode: verl ``RolloutMode`` (informational).
    """

    def __init__(
        self,
        config,
        model_config,
        replica_rank: int = 0,
        rollout_mode=None,
        platform_device: str = "cpu",
        cuda_visible_devices: list[str] | None = None,
    ):
        self.config = verl_compat.to_dataclass(config)
        self.model_config = verl_compat.to_dataclass(model_config, verl_compat.hf_model_config_cls())
        self.replica_rank = int(replica_rank)
        self.rollout_mode = rollout_mode
        self.options = hf_options(self.config)
        self.platform_device = platform_device
        self.cuda_ordinal = 0
        if platform_device != "cpu" and self.options.device != "cpu" and cuda_visible_devices:
            self.cuda_ordinal = server_cuda_ordinal(
                cuda_visible_devices, os.environ.get("CUDA_VISIBLE_DEVICES")
            )
        self.device: str | None = None  # "cpu" or "cuda:<n>", set by launch()
        self.dtype: str | None = None
        self.engine: GenerationEngine | None = None
        self.global_steps = None
        self._paused = False
        self._reject = False
        self._resume_event: asyncio.Event | None = None
        self._weights_loaded = 0

    def resolve_placement(self, cuda_available: bool | None = None) -> tuple[str, str]:
        """``(device, dtype)`` the model will use: ``("cpu" | "cuda:<n>", "float32" | "bfloat16" | "float16")``.

        Args:
            cuda_available: the CUDA probe's answer (None: ``torch.cuda.is_available()`` in this process).

        Raises:
            RuntimeError / ValueError: see :func:`choose_device` and :func:`choose_dtype`.
        """
        if cuda_available is None:
            cuda_available = torch.cuda.is_available()
        kind = choose_device(self.options.device, cuda_available, self.platform_device)
        dtype = choose_dtype(self.options.dtype, getattr(self.config, "dtype", None), kind)
        return ("cpu" if kind == "cpu" else f"cuda:{self.cuda_ordinal}"), dtype

    async def launch(self) -> None:
        """Load the model from ``model_config.local_path`` on its device and start the engine."""
        if self.engine is not None:
            return
        if self.options.num_threads is not None:
            torch.set_num_threads(self.options.num_threads)
        self.device, self.dtype = self.resolve_placement()
        if self.device != "cpu":
            torch.cuda.set_device(self.device)
        model = await asyncio.to_thread(
            load_model,
            self.model_config.local_path,
            self.dtype,
            self.options.attn_implementation,
            self.model_config.trust_remote_code,
            self.device,
        )
        # one line in the run's log (Ray forwards actor stdout to the driver): where generation runs
        print(f"hf rollout replica {self.replica_rank}: model on {self.device} in {self.dtype}", flush=True)
        max_len = self.config.max_model_len or getattr(model.config, "max_position_embeddings", None)
        if max_len is None:
            max_len = self.config.prompt_length + self.config.response_length
        tokenizer = getattr(self.model_config, "tokenizer", None)
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self.engine = GenerationEngine(
            model,
            eos_token_ids_of(self.model_config),
            max_model_len=int(max_len),
            max_batch_size=min(self.options.max_batch_size, self.config.max_num_seqs),
            seed=self.config.seed + 1_000_003 * self.replica_rank,
            pad_token_id=pad or 0,
        )
        self._resume_event = asyncio.Event()
        self._resume_event.set()

    def _require_engine(self) -> GenerationEngine:
        if self.engine is None:
            raise RuntimeError("hf generation server not launched (call launch() first)")
        return self.engine

    def _default_max_tokens(self, prompt_len: int) -> int:
        return max(
            0,
            min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - prompt_len,
            ),
        )

    async def generate(
        self,
        prompt_ids,
        sampling_params: dict[str, Any],
        request_id: str,
        image_data=None,
        video_data=None,
        **kwargs,
    ):
        """Generate a response for ``prompt_ids`` (list[int]); returns verl's ``TokenOutput``.

        ``token_ids`` are the response tokens (a stop token is included), ``log_probs`` the processed
        log-probs when ``sampling_params["logprobs"]`` is truthy, ``stop_reason`` "completed" or
        "aborted" (with the partial tokens), ``extra_fields["global_steps"]`` the weight version.

        Raises:
            NotImplementedError: image/video inputs.
            ValueError / pydantic.ValidationError: invalid prompt or sampling parameters.
        """
        token_output = verl_compat.token_output_cls()
        if image_data is not None or video_data is not None:
            raise NotImplementedError("the hf rollout backend is text-only (no image/video inputs)")
        engine = self._require_engine()
        if hasattr(prompt_ids, "tolist"):
            prompt_ids = prompt_ids.tolist()
        params = SamplingParams.from_request(sampling_params)
        if params.max_tokens is None:
            params = params.model_copy(update={"max_tokens": self._default_max_tokens(len(prompt_ids))})
        while self._paused:
            if self._reject:
                return token_output(
                    token_ids=[],
                    log_probs=None,
                    stop_reason=STOP_ABORTED,
                    extra_fields={"global_steps": self.global_steps},
                )
            await self._resume_event.wait()
        result: GenerationResult = await asyncio.wrap_future(engine.submit(prompt_ids, params))
        return token_output(
            token_ids=result.token_ids,
            log_probs=result.log_probs if params.logprobs else None,
            stop_reason=result.stop_reason,
            extra_fields={"global_steps": result.finished_at_steps},
        )

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Pause generation and end in-flight requests with their partial tokens ("aborted").

        Requests arriving while paused wait for :meth:`resume_generation` (or, with
        ``reject_request``, return at once as aborted with no tokens).
        """
        self._paused, self._reject = True, bool(reject_request)
        self._resume_event.clear()
        await asyncio.wrap_future(self._require_engine().abort_all())

    async def resume_generation(self) -> None:
        """Admit requests again after :meth:`abort_all_requests`."""
        self._paused, self._reject = False, False
        self._resume_event.set()

    async def load_weights(self, named_tensors: list) -> int:
        """Copy a bucket of ``(hf_name, tensor)`` into the model (skipped when ``sync_weights`` is off)."""
        if not self.options.sync_weights:
            return 0
        n = await asyncio.to_thread(self._require_engine().load_weights, named_tensors)
        self._weights_loaded += n
        return n

    async def set_global_steps(self, global_steps) -> None:
        """Record the weight version reported in ``extra_fields["global_steps"]`` (the end of a weight sync) and
        print one line with the served weights' fingerprint (:meth:`GenerationEngine.weights_fingerprint`):
        ``hf rollout replica R: weights of step S (N tensors loaded so far, fingerprint F)``."""
        engine = self._require_engine()
        self.global_steps = global_steps
        engine.global_steps = global_steps
        fingerprint = await asyncio.to_thread(engine.weights_fingerprint)
        print(f"hf rollout replica {self.replica_rank}: weights of step {global_steps} "
              f"({self._weights_loaded} tensors loaded so far, fingerprint {fingerprint:.12g})", flush=True)  # fmt: skip

    async def get_stats(self) -> dict[str, Any]:
        """Counters for tests and benchmarks."""
        engine = self._require_engine()
        return {
            "device": self.device,
            "dtype": self.dtype,
            "forward_passes": engine.steps_run,
            "weights_loaded": self._weights_loaded,
            "global_steps": self.global_steps,
            "in_flight": engine.num_requests(),
        }

    # The weights stay resident (on the CPU or the GPU) and the KV cache lives only while requests run, so
    # sleeping frees nothing but the CUDA allocator's cached blocks (for the colocated FSDP actor's update).
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        self._empty_device_cache()

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        self._empty_device_cache()

    def _empty_device_cache(self) -> None:
        if self.device is not None and self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    async def resume_kv_cache(self) -> None:
        return None

    async def start_profile(self, **kwargs) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    async def shutdown(self) -> None:
        """Stop the engine thread (pending requests end as aborted)."""
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)

    async def ping(self) -> float:
        return time.time()
