"""The warm start of a pretrained model (:func:`ensure_warm_start`): a short full fine-tuning of a Hugging Face
folder on its family's demonstrations before RL, cached by the model's identity and the settings.

Runs with ``--model`` of a family whose pretrained task needs one (tool use: the model writes no tool call on its
own) start here: the demonstrations are encoded with that model's own tokenizer and chat template, the model is
fine-tuned with the cold-start SFT's assistant-only loss, and the result lands under ``<cache_dir>/warm-<hash>``
(:func:`warm_start_dir`; the key: :func:`warm_start_key`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stare_verl.jobs.demo.encode import encode_demo
from stare_verl.jobs.demo.sft_config import DEFAULT_CACHE_DIR, library_versions
from stare_verl.jobs.demo.sft_trainer import collate_demos
from stare_verl.jobs.families import DEFAULT_FAMILY, job_family
from stare_verl.jobs.families.problems import split_problems
from stare_verl.models.registry import model_identity

__all__ = [
    "WARM_CONFIG_FILE",
    "WarmStartConfig",
    "ensure_warm_start",
    "warm_start_dir",
    "warm_start_key",
    "warm_start_problems",
]


class WarmStartConfig(BaseModel):
    """A short supervised warm start of a pretrained model on its family's demonstrations (``--model`` runs of a
    family whose :class:`stare_verl.jobs.families.base.PretrainedTask` has ``sft_warm_start``): full fine-tuning
    of every weight with AdamW at a small constant lr, the assistant-only loss of the cold-start SFT, the
    demonstrations encoded with the model's own tokenizer and chat template as the agent loop builds an episode
    (:func:`encode_demo`; a template that ignores ``tools=`` gets the tool list in its system message).

    Attributes:
        model_dir: the pretrained Hugging Face folder (model and tokenizer).
        family: the family (its pretrained task's problems and demonstrations).
        steps: optimizer steps (>= 1), ``batch_size`` demonstrations each (>= 1).
        lr: AdamW lr (> 0), constant; weight decay 0, gradients clipped to norm 1.
        n_demos: demonstrations drawn (>= 1), cycled in a shuffled order; disjoint from the held-out problems and
            from RL's training split (:attr:`stare_verl.jobs.pretrained.PretrainedRun.n_sft_train`).
        seed: data order and dropout seed; data_seed, n_heldout: the pretrained task's splits.
        num_threads: torch threads (None: torch's default); not in the cache key.
        cache_dir: where ``warm-<hash>`` folders go; not in the key.
    """

    model_config = ConfigDict(extra="forbid")
    model_dir: str
    family: str = DEFAULT_FAMILY
    steps: int = Field(default=60, ge=1)
    lr: float = Field(default=3e-5, gt=0)
    batch_size: int = Field(default=8, ge=1)
    n_demos: int = Field(default=256, ge=1)
    seed: int = 0
    data_seed: int = 0
    n_heldout: int = Field(default=200, ge=1)
    num_threads: int | None = None
    cache_dir: str = DEFAULT_CACHE_DIR


WARM_CONFIG_FILE = "warm_start.json"


def warm_start_key(cfg: WarmStartConfig) -> dict[str, Any]:
    """The cache key of a warm start: the model's identity, every setting but ``num_threads`` / ``cache_dir``,
    and the library versions."""
    settings = cfg.model_dump(exclude={"num_threads", "cache_dir", "model_dir"})
    return {"format": 1, "model": model_identity(Path(cfg.model_dir)), **settings, "versions": library_versions()}


def warm_start_dir(cfg: WarmStartConfig) -> Path:
    """``<cache_dir>/warm-<hash of warm_start_key(cfg)>``."""
    digest = hashlib.sha256(json.dumps(warm_start_key(cfg), sort_keys=True).encode()).hexdigest()[:16]
    return Path(cfg.cache_dir).expanduser() / f"warm-{digest}"


def warm_start_problems(cfg: WarmStartConfig) -> list:
    """The warm start's problems: the pretrained task's ``sft_train`` split (``split_problems`` with
    ``n_demos`` under ``data_seed``), disjoint from its held-out split."""
    fam = job_family(cfg.family).for_pretrained()
    return split_problems(cfg.n_demos, cfg.n_heldout, cfg.data_seed, family=fam)["sft_train"]


def _fine_tune(cfg: WarmStartConfig, out: Path) -> dict[str, Any]:
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    if cfg.num_threads:
        torch.set_num_threads(int(cfg.num_threads))
    fam = job_family(cfg.family).for_pretrained()
    tok = AutoTokenizer.from_pretrained(cfg.model_dir, local_files_only=True)
    demos, rejected = fam.demonstrations(warm_start_problems(cfg), seed=cfg.seed)
    if not demos:
        raise ValueError(f"no demonstration for the warm start of {cfg.model_dir} ({len(rejected)} rejected)")
    builder = create_continuous_token_builder(tok, hf_model_type="qwen2")  # ChatML: the agent loop's layout
    rows = [encode_demo(d, tok, builder) for d in demos]
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, local_files_only=True, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    collate = collate_demos(int(tok.pad_token_id if tok.pad_token_id is not None else 0))
    rng = random.Random(cfg.seed)
    order: list[int] = []
    losses: list[float] = []
    t0 = time.time()
    for step in range(1, cfg.steps + 1):
        if len(order) < cfg.batch_size:
            more = list(range(len(rows)))
            rng.shuffle(more)
            order += more
        idx, order = order[: cfg.batch_size], order[cfg.batch_size :]
        batch = collate([{"input_ids": rows[i][0], "loss_mask": rows[i][1]} for i in idx])
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(round(float(loss.detach()), 5))
        if step == 1 or step % 10 == 0 or step == cfg.steps:
            print(f"[warm-start] step {step}/{cfg.steps} loss {losses[-1]:.4f} ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    for name in ("chat_template.jinja", "generation_config.json"):  # what save_pretrained may leave out
        src = Path(cfg.model_dir) / name
        if src.is_file() and not (out / name).is_file():
            shutil.copy2(src, out / name)
    report = {"key": warm_start_key(cfg), "demos": len(demos), "rejected": len(rejected),
              "losses": losses, "seconds": round(time.time() - t0, 1)}  # fmt: skip
    (out / WARM_CONFIG_FILE).write_text(json.dumps(report, indent=1))
    return report


def ensure_warm_start(cfg: WarmStartConfig, *, force: bool = False) -> Path:
    """The warm-started model folder of ``cfg``: reused from the cache (:func:`warm_start_dir`, complete when its
    ``warm_start.json`` holds the same key), or trained now into a temporary sibling renamed into place (an
    interrupted run leaves nothing a later run would reuse).

    Returns:
        the folder (model, tokenizer, chat template, ``warm_start.json`` with the losses of every step).
    Raises:
        ValueError: no demonstration. stare_verl.jobs.families.problems.DemoError: the sandbox failed.
    """
    final = warm_start_dir(cfg)
    key = warm_start_key(cfg)
    try:
        done = json.loads((final / WARM_CONFIG_FILE).read_text()).get("key") == key
    except (OSError, ValueError):
        done = False
    if done and not force:
        print(f"[warm-start] cache hit: {final}", file=sys.stderr, flush=True)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"[warm-start] cache miss: {cfg.steps} steps of {cfg.batch_size} demonstrations at lr {cfg.lr:g} "
          f"from {cfg.model_dir} -> {final}", file=sys.stderr, flush=True)  # fmt: skip
    try:
        rep = _fine_tune(cfg, tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[warm-start] saved {final}: loss {rep['losses'][0]:.3f} -> {rep['losses'][-1]:.3f} in {rep['seconds']} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return final
