"""A tiny byte-level BPE tokenizer with a ChatML / hermes-tool chat template, trained locally.

The calibration (``docs/cpu-demo-calibration.md``) found that a ~384-token byte-level BPE trained on
the demonstrations themselves, with digits pre-split one per token, lets a 0.84 M-parameter model learn to
copy numbers; this module builds exactly that with the ``tokenizers`` library (``envs.tiny_hf``) and wraps
it as a ``transformers.PreTrainedTokenizerFast`` so verl's RLHFDataset and agent loop can use it like a Qwen
tokenizer.

Token inventory:

- special: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos), as in Qwen2.5;
- added, not special (as in Qwen2.5, so ``skip_special_tokens=True`` keeps them): ``<tool_call>``,
  ``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``;
- 256 byte symbols plus BPE merges learnt from the corpus; every decimal digit is its own token.

The chat template (:data:`CHAT_TEMPLATE`, from ``envs.tiny_hf.hermes_chat_template``) has the shape of
Qwen2.5's: ChatML turns; ``tools=`` opens a system turn listing the tools; an assistant message's
``tool_calls`` render as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; consecutive ``tool``
messages render inside one user turn as ``\\n<tool_response>\\n...\\n</tool_response>``. Unlike Qwen2.5
the tool list shows only each tool's name (not its whole JSON schema) and tool calls carry no surrounding
newlines: a tiny model pays for every prompt token, and it learns the interface from the demonstrations,
not from a schema.
verl's Continuous Token builder for ``model_type`` qwen2 renders tool observations with this template
(checked in tests/test_demo_tokenizer.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from envs.tiny_hf import (
    ADDED_TOKENS,
    SPECIAL_TOKENS,
    TOOLS_AS_NAMES,
    hermes_chat_template,
    train_bpe_tokenizer,
)

__all__ = [
    "ADDED_TOKENS",
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tokenizer",
    "load_tokenizer",
]

# The tool list shows only each tool's name (module docstring).
CHAT_TEMPLATE = hermes_chat_template(TOOLS_AS_NAMES)

_MARKERS = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + ADDED_TOKENS))


def _pieces(texts: Iterable[str]) -> Iterable[str]:
    """The corpus with the special/added token strings cut out (they are whole tokens, never merged)."""
    for text in texts:
        for piece in _MARKERS.split(text):
            if piece:
                yield piece


def build_tokenizer(texts: Iterable[str], out_dir: str | Path | None = None, vocab_size: int = 384):
    """Train the byte-level BPE on ``texts`` and wrap it as a transformers tokenizer with the chat template.

    Args:
        texts: training corpus, e.g. the rendered demonstrations (chat-template text, special tokens included;
            they are cut out before training).
        out_dir: if given, the tokenizer is saved there with ``save_pretrained`` and loaded back with
            ``AutoTokenizer.from_pretrained`` (so what is returned is exactly what later runs load).
        vocab_size: total vocabulary size including the 256 byte symbols, the special and the added tokens.
            Must leave room for them: ``vocab_size >= 256 + 9``.

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with eos ``<|im_end|>``, pad ``<|endoftext|>`` and
        :data:`CHAT_TEMPLATE`. Deterministic for a given corpus (order included).

    Raises:
        ValueError: ``vocab_size`` too small, or an empty corpus.
    """
    floor = 256 + len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    if vocab_size < floor:
        raise ValueError(f"vocab_size {vocab_size} is below {floor} (bytes + special + added tokens)")
    corpus = list(_pieces(texts))
    if not corpus:
        raise ValueError("empty tokenizer corpus")
    hf_tok = train_bpe_tokenizer(
        corpus,
        vocab_size=vocab_size - len(ADDED_TOKENS),
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        show_progress=False,
    )
    if out_dir is None:
        return hf_tok
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out)
    return load_tokenizer(out)


def load_tokenizer(path: str | Path):
    """Load a tokenizer saved by :func:`build_tokenizer` (``AutoTokenizer.from_pretrained``, local only)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
