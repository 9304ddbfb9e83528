"""Tiny local Hugging Face pieces shared by the simulators, the CPU demo and the ``hf`` backend's smoke model.

Nothing here downloads anything, and importing this module imports neither verl nor transformers.

- :func:`hermes_chat_template`: a ChatML chat template with hermes tool calls, in the shape of Qwen2.5's
  (written for this project). ``tools=`` opens a system turn listing the tools (how each tool is listed is
  the caller's choice: :data:`TOOLS_AS_SCHEMA` or :data:`TOOLS_AS_NAMES`); an assistant message's
  ``tool_calls`` render as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; consecutive ``tool``
  messages render inside one user turn as ``\\n<tool_response>\\n...\\n</tool_response>``.
- :func:`train_bpe_tokenizer`: a byte-level BPE trained with the ``tokenizers`` library on a given corpus,
  wrapped as a ``transformers.PreTrainedTokenizerFast`` with Qwen2.5's special tokens.
- :func:`tiny_qwen2_config`: a ``transformers.Qwen2Config`` sized to such a tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "ADDED_TOKENS",
    "SPECIAL_TOKENS",
    "TOOLS_AS_NAMES",
    "TOOLS_AS_SCHEMA",
    "hermes_chat_template",
    "tiny_qwen2_config",
    "train_bpe_tokenizer",
]

# Special tokens as in Qwen2.5: pad, turn start, turn end (eos).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added but not special, as in Qwen2.5/Qwen3 (so ``skip_special_tokens=True`` keeps them).
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

# How the system turn opened by ``tools=`` lists the tools (a Jinja fragment inside ``<tools>...``).
# Each tool's whole JSON schema, one a line, then a line that says how to call a tool (like Qwen2.5).
TOOLS_AS_SCHEMA = (
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    '{{- \'\\n</tools>\\nCall a tool as <tool_call>{"name": <name>, "arguments": <json>}</tool_call>'
    "<|im_end|>\\n' }}"
)
# Only each tool's name (a tiny model pays for every prompt token and learns the interface from examples).
TOOLS_AS_NAMES = (
    "{%- for tool in tools %}"
    "{{- '\\n' + (tool['function']['name'] if 'function' in tool else tool['name']) }}"
    "{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
)

_SYSTEM_TOOLS_HEAD = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
)
_MESSAGES = (
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


def hermes_chat_template(tools_block: str) -> str:
    """The ChatML / hermes-tool chat template (module docstring), the tool list rendered by ``tools_block``.

    Args:
        tools_block: a Jinja fragment run inside the tools system turn, after ``# Tools\\n<tools>``; it must
            close the list and the turn (``</tools>`` ... ``<|im_end|>\\n``): :data:`TOOLS_AS_SCHEMA` or
            :data:`TOOLS_AS_NAMES`.

    Returns:
        The template string (for ``PreTrainedTokenizerFast(chat_template=...)``).
    """
    return _SYSTEM_TOOLS_HEAD + tools_block + _MESSAGES


def train_bpe_tokenizer(
    corpus: Iterable[str],
    *,
    vocab_size: int,
    chat_template: str,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    added_tokens: Sequence[str] = ADDED_TOKENS,
    split_digits: bool = True,
    padding_side: str | None = None,
    show_progress: bool = True,
):
    """Train a byte-level BPE on ``corpus`` and wrap it as a transformers tokenizer (in memory, not saved).

    Args:
        corpus: training texts (special/added token strings in them are not removed here).
        vocab_size: the BPE trainer's vocabulary size (256 byte symbols, ``special_tokens`` and merges);
            ``added_tokens`` come on top.
        chat_template: the tokenizer's chat template (e.g. :func:`hermes_chat_template`).
        special_tokens: special tokens of the trainer; must contain ``<|im_end|>`` (eos) and
            ``<|endoftext|>`` (pad).
        added_tokens: single, non-special, non-normalised tokens added after training.
        split_digits: every decimal digit is its own token (pre-tokenised one per token).
        padding_side: the tokenizer's padding side (None: transformers' default, right).
        show_progress: the ``tokenizers`` trainer's progress bar.

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with eos ``<|im_end|>`` and pad ``<|endoftext|>``;
        deterministic for a given corpus (order included).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(corpus, trainer)
    if added_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    extra: dict[str, Any] = {} if padding_side is None else {"padding_side": padding_side}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
        **extra,
    )


def tiny_qwen2_config(
    tokenizer,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    **extra: Any,
):
    """A ``transformers.Qwen2Config`` for a tiny model over ``tokenizer`` (tied embeddings, no BOS).

    ``vocab_size`` is ``len(tokenizer)``; eos/pad ids are the tokenizer's; ``architectures`` is
    ``["Qwen2ForCausalLM"]`` (``model_type`` qwen2 selects verl's Qwen Continuous Token builder).
    ``extra`` goes to ``Qwen2Config`` as well (e.g. ``rope_theta``, ``attn_implementation``).
    """
    from transformers import Qwen2Config

    return Qwen2Config(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=extra.pop("tie_word_embeddings", True),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **extra,
    )
