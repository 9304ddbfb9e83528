"""The tiny Qwen2-architecture model of the CPU default run (~0.84 M parameters with a 384-token vocabulary).

Shape from the calibration (``docs/cpu-demo-calibration.md``): hidden 128, 4 layers, 4 attention heads
with 2 KV heads, FFN 384, tied input/output embeddings. Built from a ``transformers.Qwen2Config`` (so verl's
Qwen Continuous Token builder, FSDP wrapping and the ``hf`` rollout treat it as a Qwen2 model) and initialised
deterministically under a seed.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TinyModelConfig", "build_model", "save_model"]


class TinyModelConfig(BaseModel):
    """Architecture of the tiny model (every field is part of the SFT cache key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(128, ge=8)
    num_hidden_layers: int = Field(4, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(384, ge=8)
    max_position_embeddings: int = Field(1024, ge=64)
    rope_theta: float = Field(10000.0, gt=0)
    tie_word_embeddings: bool = True


def build_model(tokenizer, config: TinyModelConfig | None = None, seed: int = 0):
    """A freshly initialised ``Qwen2ForCausalLM`` sized to ``tokenizer``.

    Args:
        tokenizer: the run's tokenizer; ``len(tokenizer)`` is the vocabulary size, its eos/pad ids go to the
            model and generation configs.
        config: architecture (defaults: the calibrated tiny model).
        seed: initialisation seed; the same seed gives bit-identical weights (the global torch RNG state is
            saved and restored around the initialisation).

    Returns:
        ``transformers.Qwen2ForCausalLM`` in float32, train mode, sdpa attention.

    Raises:
        ValueError: heads that do not divide ``hidden_size`` or KV heads that do not divide the heads.
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    from envs.tiny_hf import tiny_qwen2_config

    cfg = config or TinyModelConfig()
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(f"num_attention_heads {cfg.num_attention_heads} must divide hidden_size {cfg.hidden_size}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(
            f"num_key_value_heads {cfg.num_key_value_heads} must divide num_attention_heads {cfg.num_attention_heads}"
        )
    hf_config = tiny_qwen2_config(
        tokenizer,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_word_embeddings,
        attn_implementation="sdpa",
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(hf_config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def save_model(model, tokenizer, out_dir: str | Path) -> Path:
    """Save model and tokenizer into one directory (``save_pretrained``, safetensors). Returns the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
