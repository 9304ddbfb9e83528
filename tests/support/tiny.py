"""A tiny local model, tokenizer and toy dataset for CPU smoke runs of the ``hf`` backend.

Nothing is downloaded: the tokenizer is the project's tiny byte-level BPE (``envs.tiny_hf``: its chat template
and Qwen-style special tokens) trained here on a few lines, the model a random Qwen2 (hidden 64, 2 layers by
default).
The toy task rewards the share of the letter ``a`` in the response (``recipes/cpu/toy_reward.py``),
so rewards vary within a group even for a random policy.
"""

from __future__ import annotations

import os
from pathlib import Path

TOOL_CALL_REPLY = '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
_CORPUS = [
    "user assistant system What is 12 + 7? The answer is 19.",
    "Count the letters a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9",
    "Say something short. ok yes no maybe aaaa bbbb",
    TOOL_CALL_REPLY,
]


def build_tiny_model(out_dir: str | os.PathLike, seed: int = 0, hidden: int = 64, layers: int = 2) -> str:
    """Write a random tiny Qwen2 causal LM (hidden ``hidden``, FFN 2 x hidden, ``layers`` layers, 4 heads / 2 KV
    heads, context 512, initialised under ``seed``) and its tokenizer (``envs.tiny_hf``, 300 tokens) to
    ``out_dir``; an existing model there (``config.json``) is kept. Returns the path (str).

    Raises:
        ValueError: 4 heads do not divide ``hidden``.
    """
    from envs.tiny_hf import TinyModelConfig, build_model, build_tokenizer, save_model

    out = Path(out_dir)
    if (out / "config.json").exists():
        return str(out)
    shape = TinyModelConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    tokenizer = build_tokenizer(_CORPUS * 4, vocab_size=300)
    save_model(build_model(tokenizer, shape, seed), tokenizer, out)
    return str(out)


def build_tool_calling_model(
    out_dir: str | os.PathLike,
    base_dir: str | os.PathLike,
    reply: str = TOOL_CALL_REPLY,
    n_prompts: int = 16,
    max_steps: int = 300,
    lr: float = 1e-2,
    target_loss: float = 1e-2,
    seed: int = 0,
) -> str:
    """Fine-tune the tiny model of ``base_dir`` to answer the toy prompts with ``reply`` (a tool call).

    A random model never calls a tool; this one does (for tests of multi-turn tool loops). It is
    trained (AdamW, ``lr``) on ``"Say something short {i}."`` chat prompts, i < ``n_prompts``, with the
    reply and the EOS token as target, until the mean token loss is below ``target_loss`` nats (or
    ``max_steps``); at 1e-2 it emits the whole reply for most samples at temperature 1, on other toy
    prompts too. Returns ``out_dir`` (str).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if (out / "config.json").exists():
        return str(out)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    target = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"Say something short {i}."}],
                add_generation_prompt=True,
                tokenize=False,
            ),
            add_special_tokens=False,
        )
        for i in range(n_prompts)
    ]
    rows = [p + target for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    # loss on the reply tokens only: position t predicts token t + 1
    loss_mask = torch.zeros(len(rows), width - 1)
    for i, p in enumerate(prompts):
        loss_mask[i, len(p) - 1 : len(p) - 1 + len(target)] = 1.0
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread avoids oversubscription on a busy machine
    try:
        model.train()
        for _ in range(max_steps):
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            loss = (nll * loss_mask).sum() / loss_mask.sum()
            optim.zero_grad()
            loss.backward()
            optim.step()
            if loss.item() < target_loss:
                break
    finally:
        torch.set_num_threads(threads)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation = Path(base_dir) / "generation_config.json"
    if generation.exists():
        (out / "generation_config.json").write_text(generation.read_text())
    return str(out)


def build_toy_dataset(out_dir: str | os.PathLike, n_train: int = 16, n_val: int = 4) -> tuple[str, str]:
    """Write train/val parquet files (verl RLHFDataset columns); return their paths."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def rows(n, split):
        return [
            {
                "data_source": "toy_letter_a",
                "prompt": [{"role": "user", "content": f"Say something short {i}."}],
                "ability": "toy",
                "reward_model": {"style": "rule", "ground_truth": "a"},
                "extra_info": {"split": split, "index": i},
            }
            for i in range(n)
        ]

    train, val = out / "train.parquet", out / "val.parquet"
    pd.DataFrame(rows(n_train, "train")).to_parquet(train)
    pd.DataFrame(rows(n_val, "val")).to_parquet(val)
    return str(train), str(val)
