"""A tiny Llama GGUF file written here with the ``gguf`` package (random fp32 weights, a byte-level BPE tokenizer
with ChatML special tokens and a chat template), for tests of the offline model preparation without the network."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 symbols a byte-level BPE vocabulary starts from."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tiny_llama_gguf(path: Path, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                          ff: int = 64, seed: int = 0, eos_token_id: int = 1) -> Path:  # fmt: skip
    """Write a random Llama GGUF (``hidden`` wide, ``layers`` deep, tied embeddings) to ``path``; returns ``path``.

    ``eos_token_id`` is what the file's metadata calls the end token (1, ``<|im_start|>``, as the SmolLM2 GGUF does:
    the preparation is expected to set ``<|im_end|>`` itself)."""
    import gguf

    merges = ["h i", "Ġ t", "Ġt h"]
    tokens = SPECIALS + _byte_chars() + ["hi", "Ġt", "Ġth"]
    types = [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    vocab = len(tokens)
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-test-llama")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos_token_id)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", w(vocab, hidden))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", w(hidden, hidden))
        writer.add_tensor(f"blk.{i}.attn_k.weight", w(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_v.weight", w(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_output.weight", w(hidden, hidden))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(ff, hidden))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(ff, hidden))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(hidden, ff))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
