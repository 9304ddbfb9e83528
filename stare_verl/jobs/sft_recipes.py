"""The SFT recipes of verl's SFT trainer (``recipes/sft/``): composed as the trainer composes them
(:func:`compose_sft`) and checked before launch (:func:`validate_sft`), for ``python -m stare_verl.jobs.sft train``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from stare_verl.recipe_files import recipes_dir, register_resolver

__all__ = ["DEFAULT_RECIPE", "compose_sft", "validate_sft"]

DEFAULT_RECIPE = "tooluse_qwen2.5-7b"


def compose_sft(recipe: str = DEFAULT_RECIPE, overrides: list[str] | None = None, resolve: bool = True) -> DictConfig:
    """Compose ``recipes/sft/<recipe>.yaml`` on verl's ``sft_trainer_engine`` config, as the trainer would.

    Raises:
        hydra.errors.MissingConfigException: no such recipe; hydra.errors.ConfigCompositionException: a bad
            override.
    """
    from hydra import compose, initialize_config_dir

    register_resolver()  # the ${stare_verl.recipe_file:...} paths, as compose_recipe
    with initialize_config_dir(config_dir=str(recipes_dir() / "sft"), version_base=None):
        cfg = compose(config_name=recipe, overrides=list(overrides or []))
    if resolve:
        OmegaConf.resolve(cfg)
    return cfg


def validate_sft(cfg: DictConfig, nproc: int, check_model: bool = False, check_files: bool = True) -> None:
    """Validate a composed SFT config before launch: what verl's trainer builds first, plus the invariants
    that otherwise fail only after the model is loaded on every rank.

    Checks that ``model.path``, ``data.train_files`` and ``trainer.default_local_dir`` are set; the
    ``engine``, ``optim``, ``checkpoint`` and ``profiler`` sections with verl's config dataclasses (``omega_conf_to_dataclass``: unknown keys and bad values raise); ``model`` too with
    ``check_model`` (``HFModelConfig`` loads the model's config and tokenizer, so the path must be
    reachable); that ``nproc`` ranks split into data-parallel groups of the Ulysses size and the global
    batch into them; that dynamic batching can hold one ``max_length`` sequence; that the checkpoint
    includes ``hf_model`` (RL loads that folder); and, with ``check_files``, that local data files exist and
    give at least one batch and the steps asked for (and, with ``check_model``, that verl's dataset
    tokenizes the first rows with the model's chat template).

    Raises:
        ValueError / FileNotFoundError: the first problem found; whatever verl's dataclasses raise.
    """
    from verl.utils.config import omega_conf_to_dataclass

    unset = [k for k in ("model.path", "data.train_files", "trainer.default_local_dir")
             if OmegaConf.select(cfg, k) in (None, "")]
    if unset:
        raise ValueError(f"set {', '.join(k + '=...' for k in unset)} (the recipe leaves them to the command line)")
    for section in ("engine", "optim", "checkpoint", "profiler"):
        omega_conf_to_dataclass(cfg[section])
    model = omega_conf_to_dataclass(cfg.model) if check_model else None
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    sp = int(cfg.engine.get("ulysses_sequence_parallel_size", 1) or 1)
    if nproc % sp:
        raise ValueError(f"engine.ulysses_sequence_parallel_size={sp} must divide the {nproc} ranks")
    dp = nproc // sp
    if cfg.data.train_batch_size % dp:
        raise ValueError(f"data.train_batch_size={cfg.data.train_batch_size} must be a multiple of the {dp} "
                         f"data-parallel ranks ({nproc} ranks / Ulysses {sp})")
    # verl packs up to max_token_len_per_gpu * sp tokens per micro-batch (verl/workers/engine/utils.py)
    if cfg.data.use_dynamic_bsz and cfg.data.max_token_len_per_gpu * sp < cfg.data.max_length:
        raise ValueError(f"data.max_token_len_per_gpu={cfg.data.max_token_len_per_gpu} cannot hold one "
                         f"data.max_length={cfg.data.max_length} sequence split over Ulysses {sp}")
    if cfg.data.pad_mode not in ("right", "no_padding") or cfg.data.truncation not in ("error", "left", "right"):
        raise ValueError(f"data.pad_mode={cfg.data.pad_mode} / data.truncation={cfg.data.truncation} unsupported")
    if "hf_model" not in cfg.checkpoint.save_contents:
        raise ValueError("checkpoint.save_contents must include hf_model: the RL recipe loads that folder")
    if check_files:
        files = list(_as_list(cfg.data.train_files)) + list(_as_list(cfg.data.val_files))
        for f in files:
            if "://" not in str(f) and not Path(os.path.expanduser(str(f))).is_file():
                raise FileNotFoundError(
                    f"SFT data file {f} not found: build it with `python -m stare_verl.jobs.sft data --retool` "
                    "(or pass data.train_files=... data.val_files=...)"
                )
        _check_steps(cfg, dp)
        if model is not None:
            _check_rows(cfg, model.tokenizer)


def _check_rows(cfg: DictConfig, tokenizer, n: int = 4) -> None:
    """Tokenize the first ``n`` training rows with verl's ``MultiTurnSFTDataset`` and the model's chat
    template (verl asserts that message-by-message rendering equals the whole conversation's)."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"the tokenizer of {cfg.model.path} has no chat template (set model.custom_chat_template)")
    first = str(_as_list(cfg.data.train_files)[0])
    if "://" in first:
        return
    ds = MultiTurnSFTDataset([first], tokenizer, cfg.data, max_samples=n)
    for i in range(len(ds)):
        ds[i]


def _check_steps(cfg: DictConfig, dp: int) -> None:
    """verl's sampler and loader drop incomplete batches: with fewer rows than a batch it has no step, and
    when ``total_training_steps`` exceeds the steps of ``total_epochs`` it stops without saving."""
    import pyarrow.parquet as pq

    train = [os.path.expanduser(str(f)) for f in _as_list(cfg.data.train_files)]
    if any("://" in f for f in train):
        return
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in train)
    if cfg.data.get("train_max_samples", -1) and cfg.data.train_max_samples > 0:
        rows = min(rows, cfg.data.train_max_samples)
    per_epoch = (rows // dp) // (cfg.data.train_batch_size // dp)
    if per_epoch == 0:
        raise ValueError(f"{rows} training rows make no batch of data.train_batch_size={cfg.data.train_batch_size}")
    total = cfg.trainer.get("total_training_steps")
    if total is not None and total > per_epoch * cfg.trainer.total_epochs:
        raise ValueError(
            f"trainer.total_training_steps={total} exceeds the {per_epoch * cfg.trainer.total_epochs} steps of "
            f"trainer.total_epochs={cfg.trainer.total_epochs} ({rows} rows / batch {cfg.data.train_batch_size}): "
            "verl would stop early without saving a checkpoint; raise trainer.total_epochs"
        )


def _as_list(v: Any) -> list:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    return list(v)
