"""The one builder of tiny local Hugging Face models and tokenizers (the CPU demo, the simulators, the ``hf``
backend's smoke model and the tests all build theirs here).

It lives in ``envs`` because both sides need it: ``envs.simulators`` (which may not import ``stare_verl``) and
the jobs (``stare_verl.jobs.demo``) and the tests (``tests.support.tiny``), which may import ``envs``. Nothing here
downloads anything; importing this module imports neither verl, transformers nor torch (pydantic only).

- :data:`CHAT_TEMPLATE`: the one chat template, ChatML with hermes tool calls in the shape of Qwen2.5's
  (written for this project). ``tools=`` opens a system turn listing each tool's *name* (a tiny model pays for
  every prompt token and learns the interface from demonstrations, not from a schema); an assistant message's
  ``tool_calls`` render as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (no surrounding
  newlines); consecutive ``tool`` messages render inside one user turn as
  ``\\n<tool_response>\\n...\\n</tool_response>``. Without tools and tool messages it is plain ChatML. verl's
  Continuous Token builder for ``model_type`` qwen2 renders tool observations with it (tests/envs/test_tiny_hf.py).
- :func:`build_tokenizer`: a byte-level BPE trained with the ``tokenizers`` library on a given corpus, digits
  pre-split one per token (the calibration, ``docs/cpu-demo-calibration.md``, found this is what lets a tiny
  model copy numbers), wrapped as a ``transformers.PreTrainedTokenizerFast`` with Qwen2.5's special tokens
  (:data:`SPECIAL_TOKENS`) and single, non-special tool/think tokens (:data:`ADDED_TOKENS`), left padding and
  :data:`CHAT_TEMPLATE`; :func:`load_tokenizer` loads a saved one.
- :class:`TinyModelConfig`, :func:`tiny_qwen2_config`, :func:`build_model`, :func:`save_model`: a seeded random
  ``Qwen2ForCausalLM`` sized to such a tokenizer (or to a bare vocabulary size), and saving model and tokenizer
  into one folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ADDED_TOKENS",
    "CHAT_TEMPLATE",
    "MIN_VOCAB_SIZE",
    "SPECIAL_TOKENS",
    "TinyModelConfig",
    "build_model",
    "build_tokenizer",
    "load_tokenizer",
    "save_model",
    "tiny_qwen2_config",
]

# Special tokens as in Qwen2.5: pad, turn start, turn end (eos).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added but not special, as in Qwen2.5/Qwen3 (so ``skip_special_tokens=True`` keeps them).
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}"
    "{{- '\\n' + (tool['function']['name'] if 'function' in tool else tool['name']) }}"
    "{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- if not loop.first %}{{- '<|im_start|>system\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for tc in (message['tool_calls'] if 'tool_calls' in message and message['tool_calls'] else []) %}"
    "{%- set f = tc['function'] if 'function' in tc else tc %}"
    "{{- '<tool_call>{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{{- f['arguments'] if f['arguments'] is string else f['arguments'] | tojson }}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_MARKERS = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + ADDED_TOKENS))
# Smallest vocabulary: the 256 byte symbols, the special and the added tokens.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + len(ADDED_TOKENS)


def _pieces(texts: Iterable[str]) -> Iterable[str]:
    """The corpus with the special/added token strings cut out (they are whole tokens, never merged)."""
    for text in texts:
        for piece in _MARKERS.split(text):
            if piece:
                yield piece


def digit_groups(digits_per_token: int) -> tuple[str, ...]:
    """Every string of 2 to ``digits_per_token`` decimal digits ("00" ... "99", then "000" ... "999"), in that order:
    the added tokens that make a number ``digits_per_token`` digits a token (empty for 1).

    Added tokens, not BPE merges or a pre-tokenizer rule: ``AutoTokenizer`` loads a folder whose ``config.json`` says
    ``model_type`` qwen2 as ``Qwen2Tokenizer``, which replaces the saved pre-tokenizer with Qwen2's (one digit a
    pre-token, so no merge can join digits; it also adds NFC normalisation, so text that NFC changes, e.g. a
    combining accent, may get other ids there) but keeps the added tokens, which are matched before
    pre-tokenization, leftmost and longest first. So SFT, verl's rollout and vLLM all cut ``188604`` as ``188`` ``604`` (3) or ``18``
    ``86`` ``04`` (2), left to right, the last group shorter."""
    return tuple(f"{i:0{n}d}" for n in range(2, digits_per_token + 1) for i in range(10**n))


def build_tokenizer(texts: Iterable[str], out_dir: str | Path | None = None, vocab_size: int = 384,
                    digits_per_token: int = 1):
    """Train the byte-level BPE on ``texts`` and wrap it as a transformers tokenizer with :data:`CHAT_TEMPLATE`.

    Args:
        texts: training corpus, e.g. rendered demonstrations (chat-template text: the special and added token
            strings in it are cut out before training).
        out_dir: if given, the tokenizer is saved there with ``save_pretrained`` and loaded back with
            :func:`load_tokenizer` (so what is returned is exactly what later runs load).
        vocab_size: total vocabulary size: the 256 byte symbols, :data:`SPECIAL_TOKENS`, :data:`ADDED_TOKENS`,
            the digit groups (:func:`digit_groups`) and BPE merges (fewer merges when the corpus has fewer to learn).
        digits_per_token: 1 (every decimal digit its own token), or 2 / 3: numbers are cut left to right into
            groups of that many digits (the last may be shorter), each group one token. Fewer, more distinct
            tokens to copy: the tool-use model copies numbers from the question into its code and from the tool's
            output into its answer, and with one digit a token it confuses a digit of the question with one of
            the output.

    Returns:
        ``transformers.PreTrainedTokenizerFast``: eos ``<|im_end|>``, pad ``<|endoftext|>``, left padding,
        :data:`CHAT_TEMPLATE`; numbers cut as ``digits_per_token`` says; each special/added token is one id.
        Deterministic for a given corpus (order included).

    Raises:
        ValueError: ``digits_per_token`` not 1-3; ``vocab_size`` below ``MIN_VOCAB_SIZE`` (265) plus the digit
            groups; a corpus with nothing but token markers.
    """
    if not 1 <= digits_per_token <= 3:
        raise ValueError(f"digits_per_token must be 1, 2 or 3 (got {digits_per_token})")
    groups = digit_groups(digits_per_token)
    if vocab_size < MIN_VOCAB_SIZE + len(groups):
        raise ValueError(f"vocab_size {vocab_size} is below {MIN_VOCAB_SIZE + len(groups)} (bytes + special + added "
                         f"tokens + {len(groups)} digit groups of digits_per_token {digits_per_token})")
    corpus = list(_pieces(texts))
    if not corpus:
        raise ValueError("empty tokenizer corpus")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS) - len(groups),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS + groups])
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )
    if out_dir is None:
        return hf_tok
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out)
    return load_tokenizer(out)


def load_tokenizer(path: str | Path):
    """Load a tokenizer saved by :func:`build_tokenizer` or :func:`save_model` (``AutoTokenizer``, local files
    only). Raises OSError when ``path`` holds no tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


class TinyModelConfig(BaseModel):
    """Architecture of a tiny Qwen2 model. The defaults are the CPU demo's calibrated model (~0.84 M parameters
    with a 384-token vocabulary; ``docs/cpu-demo-calibration.md``), which the CoT families train; the tool-use
    family trains 2 layers of it (its SFT's family defaults). Every field is part of the demo's SFT cache key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(128, ge=8)
    num_hidden_layers: int = Field(4, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(384, ge=8)
    max_position_embeddings: int = Field(1024, ge=64)
    rope_theta: float = Field(10000.0, gt=0)
    tie_word_embeddings: bool = True


def tiny_qwen2_config(tokenizer=None, config: TinyModelConfig | None = None, *, vocab_size: int | None = None):
    """A ``transformers.Qwen2Config`` of ``config`` (default :class:`TinyModelConfig`), float32, sdpa attention,
    no BOS; ``architectures`` ``["Qwen2ForCausalLM"]`` (``model_type`` qwen2 selects verl's Qwen Continuous Token
    builder).

    Args:
        tokenizer: sizes the vocabulary (``len(tokenizer)``) and gives the eos/pad ids.
        config: the architecture.
        vocab_size: instead of ``tokenizer``: a bare vocabulary size (no eos/pad ids; for models fed raw ids).

    Raises:
        ValueError: neither or both of ``tokenizer`` and ``vocab_size``; heads that do not divide
            ``hidden_size``, or KV heads that do not divide the heads.
    """
    if (tokenizer is None) == (vocab_size is None):
        raise ValueError("give exactly one of tokenizer and vocab_size")
    cfg = config or TinyModelConfig()
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(f"num_attention_heads {cfg.num_attention_heads} must divide hidden_size {cfg.hidden_size}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(
            f"num_key_value_heads {cfg.num_key_value_heads} must divide num_attention_heads {cfg.num_attention_heads}"
        )
    from transformers import Qwen2Config

    ids: dict[str, Any] = {}
    if tokenizer is not None:
        ids = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    return Qwen2Config(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=len(tokenizer) if tokenizer is not None else vocab_size,
        bos_token_id=None,
        attn_implementation="sdpa",
        dtype="float32",
        **cfg.model_dump(),
        **ids,
    )


def build_model(tokenizer=None, config: TinyModelConfig | None = None, seed: int = 0, *, vocab_size: int | None = None):
    """A freshly initialised ``Qwen2ForCausalLM`` of :func:`tiny_qwen2_config` (same arguments).

    ``seed`` fixes the initialisation: the same seed gives bit-identical weights (the global torch RNG state is
    saved and restored around it). With a ``tokenizer`` the model's generation config stops at its eos and pads
    with its pad id.

    Returns:
        ``transformers.Qwen2ForCausalLM`` in float32, train mode, sdpa attention.

    Raises:
        ValueError: as :func:`tiny_qwen2_config`.
    """
    hf_config = tiny_qwen2_config(tokenizer, config, vocab_size=vocab_size)
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(hf_config)
    if tokenizer is not None:
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
        )
    return model


def save_model(model, tokenizer, out_dir: str | Path) -> Path:
    """Save model (safetensors, with its generation config) and tokenizer into one folder; returns its path.
    Raises OSError when the folder cannot be written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
