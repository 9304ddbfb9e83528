"""The configuration of the cold-start SFT (:class:`SFTConfig`) and its cache key (:func:`key_config`,
:func:`config_hash`).

Every field carries its meaning in ``Field(description=...)`` (``SFTConfig.model_fields[name].description``), so
help texts can be read from the class. Fields the caller leaves unset default per family
(``JobFamily.sft_defaults``); the defaults written below are the other families'.

The cache key is the configuration minus the run-only fields, plus the library versions: a checkpoint folder
``<cache_dir>/sft-<config_hash>`` is reused by any configuration with the same key. Fields added after checkpoints
existed enter the key only when they differ from the value that reproduces the older checkpoints (see
:func:`key_config`), so those checkpoints keep their keys.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from envs.tiny_hf import MIN_VOCAB_SIZE, TinyModelConfig, digit_groups
from stare_verl.jobs.families import DEFAULT_FAMILY, job_family

__all__ = [
    "DEFAULT_CACHE_DIR",
    "FORMAT_VERSION",
    "SFTConfig",
    "config_hash",
    "key_config",
    "library_versions",
    "sft_problem_count",
]

DEFAULT_CACHE_DIR = "runs/cache"
# Bump when the data format, tokenizer recipe or training code changes in a way the config does not show.
FORMAT_VERSION = 1

# Fields that do not change the checkpoint (left out of the cache key).
_NOT_IN_KEY = {"cache_dir", "eval_every", "eval_every_n", "num_threads", "progress", "eval_temperatures"}
# The early stop's fields: in the key only when the early stop is on.
_EARLY_STOP_FIELDS = {"stop_accuracy", "check_every", "n_dev"}
# The anneal's fields: in the key only when the anneal is on.
_ANNEAL_FIELDS = {"anneal_below_loss", "anneal_steps", "anneal_final_lr_ratio"}
_SEED = {"ge": 0, "le": 2**32 - 1}


class SFTConfig(BaseModel):
    """Everything that determines the cold-start SFT checkpoint, and a few run-only knobs (not in the cache key:
    ``cache_dir``, ``num_threads``, ``progress``, ``eval_every``, ``eval_every_n``, ``eval_temperatures``).

    Each field's description says what it is, its unit and what its default means. Rules across fields
    (checked on construction, ``ValueError`` naming the fields): warm-up plus ``decay_steps`` must fit in
    ``steps``; ``decay_steps`` combines with neither the early stop (``stop_accuracy``) nor the anneal
    (``anneal_below_loss``); the early stop needs ``check_every < steps``; ``anneal_steps`` and
    ``anneal_final_lr_ratio`` given without the anneal on are an error (they would silently train the default
    checkpoint); ``code_styles`` other than 1 only for a family with a tool; ``vocab_size`` must hold the bytes,
    the special and added tokens and the digit groups of ``digits_per_token``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the task and its data
    family: str = Field(DEFAULT_FAMILY, description=(
        "the job family (a registered stare_verl.jobs.families name or alias: tooluse, shortcot, longcot); "
        "its sft_defaults fill the fields left unset. Left out of the cache key for tool use "
        "(JobFamily.legacy_sft_key), whose keys predate the field"))
    data_seed: int = Field(0, **_SEED, description=(
        "reasoning-gym seed of every problem split (SFT demonstrations, dev, held-out); the RL data of the same "
        "seed is disjoint from the SFT problems and validates on the held-out ones"))
    n_train: int = Field(4096, ge=1, description=(
        "demonstrations trained on; the CoT families draw them from n_train // demos_per_problem problems "
        "(sft_problem_count), tool use from n_train problems"))
    n_heldout: int = Field(200, ge=1, description=(
        "held-out problems evaluated after the SFT (sft_report.json); the RL validation set of the same seed"))
    # tokenizer and model
    vocab_size: int = Field(384, ge=265, description=(
        "tokens of the byte-level BPE tokenizer trained on the demonstrations, in all: the 256 bytes, the special "
        "and added tokens, the digit groups of digits_per_token and BPE merges (fewer when the corpus has fewer "
        "to learn); at least 265 plus the digit groups"))
    digits_per_token: int = Field(1, ge=1, le=3, description=(
        "numbers are cut left to right into groups of this many digits, each group one token (1-3, "
        "envs.tiny_hf.build_tokenizer; 1: every digit its own token). In the cache key only when not 1"))
    model: TinyModelConfig = Field(default_factory=TinyModelConfig, description=(
        "architecture of the tiny Qwen2 model (envs.tiny_hf.TinyModelConfig; default its 4 layers); a dict is "
        "merged over the family's"))
    init_seed: int = Field(0, **_SEED, description="seed of the model's initial weights")
    # training
    train_seed: int = Field(0, **_SEED, description="seed of the data order and of the demonstrations' sampling")
    steps: int = Field(1000, ge=1, description=(
        "optimizer steps; with the early stop or the anneal on, the most steps"))
    batch_size: int = Field(32, ge=1, description="demonstrations per optimizer step")
    lr: float = Field(2e-3, gt=0, le=1.0, allow_inf_nan=False, description=(
        "AdamW learning rate after the warm-up, in (0, 1] (above 1 is a typo, not a schedule); constant unless "
        "decay_steps or the anneal lowers it"))
    weight_decay: float = Field(0.01, ge=0, allow_inf_nan=False, description=(
        "AdamW's decoupled weight-decay coefficient (each step every weight loses lr x weight_decay of its value)"))
    warmup_steps: int = Field(20, ge=0, description=(
        "steps of linear lr warm-up from 0 (0: none); then the lr is constant"))
    decay_steps: int = Field(0, ge=0, description=(
        "steps at the end of the run over which the lr falls linearly, by lr / decay_steps a step, reaching 0 "
        "just after the last (0: constant lr to the end, and left out of the cache key)"))
    max_grad_norm: float = Field(1.0, gt=0, allow_inf_nan=False, description=(
        "largest L2 norm of the gradient over all weights; a larger one is scaled down to it"))
    # early stop and anneal
    stop_accuracy: float | None = Field(None, gt=0, le=1, description=(
        "early stop, in (0, 1]: every check_every steps the greedy accuracy on n_dev problems of the data seed's "
        "sft_dev split (disjoint from the held-out and SFT splits) is measured, and training ends at the first "
        "check that reaches this. None: off (and the early stop's fields left out of the cache key)"))
    anneal_below_loss: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "anneal: the first logged training loss below this (mean token cross-entropy, nats) starts a linear lr "
        "fall over anneal_steps steps to anneal_final_lr_ratio x lr, and the run ends there (anneal_lr_factor); "
        "when the copy plateau ends depends on the seed, so a fixed step count would waste steps or stop before "
        "the drop. None: off (and the anneal's fields left out of the cache key)"))
    anneal_steps: int = Field(300, ge=1, description=(
        "steps of the anneal's linear lr fall, after which the run ends"))
    anneal_final_lr_ratio: float = Field(0.15, ge=0, le=1, allow_inf_nan=False, description=(
        "the lr at the anneal's end, as a share of lr"))
    check_every: int = Field(100, ge=1, description="steps between the early stop's dev checks")
    n_dev: int = Field(64, ge=1, le=4096, description=(
        "dev problems of each early-stop check (each check greedily runs them all: 4096 takes minutes a check)"))
    # evaluation
    max_response_tokens: int = Field(128, ge=8, description=(
        "episode token budget (model and tool tokens) of the held-out evaluation and the dev checks"))
    code_styles: int = Field(1, ge=1, le=3, description=(
        "tool use: equivalent programs of the demonstrations (stare_verl.jobs.families.tooluse.CODE_STYLES), one "
        "of the first N drawn per demonstration; 1: print(<expression>) only (and left out of the cache key)"))

    # run-only: not in the cache key
    cache_dir: str | None = Field(None, description=(
        "folder of the sft-<hash> checkpoints; None: $STARE_CACHE_DIR, else runs/cache (resolved_cache_dir)"))
    num_threads: int | None = Field(None, ge=1, description=(
        "torch threads of this SFT (restored afterwards); None: torch's default"))
    progress: bool = Field(True, description="show the training's tqdm progress bar")
    eval_every: int = Field(0, ge=0, description=(
        "greedy held-out accuracy on eval_every_n problems every this many steps, to see when the model learns "
        "(0: off)"))
    eval_every_n: int = Field(64, ge=1, description="held-out problems of each eval_every check")
    eval_temperatures: tuple[float, ...] = Field((0.0, 1.0), description=(
        "sampling temperatures of the final held-out evaluation (0.0: greedy), one report entry each"))


    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: Any) -> Any:
        """Fill fields the caller left unset with the family's ``sft_defaults``; a ``model`` given as a dict is
        merged over the family's (a ``TinyModelConfig`` instance is taken whole)."""
        if isinstance(data, dict):
            try:
                defaults = copy.deepcopy(dict(job_family(data.get("family", DEFAULT_FAMILY)).sft_defaults))
            except ValueError:  # an unknown family: the field's check names it
                defaults = {}
            for k, v in defaults.items():
                if k == "model" and isinstance(data.get(k), dict):  # a partial architecture: on top of the family's
                    data = {**data, k: {**v, **data[k]}}
                data = data if k in data else {**data, k: v}
        return data

    @field_validator("family")
    @classmethod
    def _known_family(cls, value: str) -> str:
        return job_family(value).name  # ValueError naming the registered families; an alias gives the name

    @model_validator(mode="after")
    def _schedule_fits(self) -> SFTConfig:
        need = MIN_VOCAB_SIZE + len(digit_groups(self.digits_per_token))
        if self.vocab_size < need:
            raise ValueError(f"vocab_size {self.vocab_size} is below {need}: the bytes, special and added tokens and "
                             f"the digit groups of digits_per_token {self.digits_per_token}")
        if self.code_styles != 1 and not job_family(self.family).multi_turn:
            raise ValueError(f"code_styles is for tool use (the programs of its tool calls); family {self.family!r} "
                             "has no tool")
        if self.decay_steps and self.warmup_steps + self.decay_steps > self.steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) + decay_steps ({self.decay_steps}) exceed steps ({self.steps})"
            )
        if self.stop_accuracy is not None and self.check_every >= self.steps:
            raise ValueError(f"stop_accuracy: no dev check would run (check_every {self.check_every} >= steps "
                             f"{self.steps}); lower check_every or turn the early stop off")
        unused = sorted(self.model_fields_set & {"anneal_steps", "anneal_final_lr_ratio"})
        if self.anneal_below_loss is None and unused:  # a variant that would silently train the default checkpoint
            raise ValueError(f"{' and '.join(unused)} {'shape' if len(unused) > 1 else 'shapes'} the anneal, which is off here (anneal_below_loss None: "
                             f"the default of family {self.family!r}, or turned off); set anneal_below_loss too "
                             "(demo.sft --anneal-below-loss 0.1)")
        if self.anneal_below_loss is not None and self.decay_steps:
            raise ValueError("decay_steps (a decay at the end of the run) cannot be combined with anneal_below_loss "
                             "(a decay once the loss falls; on by default for tool use): set anneal_below_loss to "
                             "None (--anneal-below-loss off) to use decay_steps")
        if self.decay_steps and self.stop_accuracy is not None:
            raise ValueError("stop_accuracy (an early stop) cannot be combined with decay_steps (a schedule that "
                             "needs the run's end): set one of them")
        return self

    def resolved_cache_dir(self) -> Path:
        """``cache_dir``, else ``$STARE_CACHE_DIR``, else ``runs/cache`` (relative to the working directory)."""
        return Path(self.cache_dir or os.environ.get("STARE_CACHE_DIR") or DEFAULT_CACHE_DIR)


def library_versions() -> dict[str, str]:
    """The versions the cache keys hold besides the configuration: :data:`FORMAT_VERSION` and the libraries'
    (torch, transformers, tokenizers, reasoning-gym)."""
    import reasoning_gym
    import tokenizers
    import torch
    import transformers

    return {
        "format": str(FORMAT_VERSION),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "reasoning_gym": getattr(reasoning_gym, "__version__", "unknown"),
    }


def key_config(cfg: SFTConfig) -> dict[str, Any]:
    """The part of the configuration (plus library versions) that the cache key hashes.

    ``family`` is left out for a family with ``legacy_sft_key`` (tool use: the keys of its checkpoints predate the
    field); the others add their demonstrations-per-problem count.
    """
    exclude = _NOT_IN_KEY | ({"decay_steps"} if cfg.decay_steps == 0 else set())  # keys from before the field
    if cfg.digits_per_token == 1:  # keys from before the field
        exclude = exclude | {"digits_per_token"}
    if cfg.stop_accuracy is None:  # keys from before the early stop
        exclude = exclude | _EARLY_STOP_FIELDS
    if cfg.anneal_below_loss is None:  # keys from before the anneal
        exclude = exclude | _ANNEAL_FIELDS
    if cfg.code_styles == 1:  # keys from before the field
        exclude = exclude | {"code_styles"}
    fam = job_family(cfg.family)
    if fam.legacy_sft_key:
        conf = cfg.model_dump(mode="json", exclude=exclude | {"family"})
    else:
        conf = {**cfg.model_dump(mode="json", exclude=exclude), "demos_per_problem": fam.demos_per_problem}
    if cfg.code_styles != 1:  # the programs themselves, so that another set of styles is another checkpoint
        from stare_verl.jobs.families.tooluse import CODE_STYLES

        conf["code_styles"] = list(CODE_STYLES[: cfg.code_styles])
    return {"config": conf, "versions": library_versions()}


def sft_problem_count(cfg: SFTConfig) -> int:
    """Problems behind ``cfg``'s ``n_train`` demonstrations: ``max(1, n_train // demos_per_problem)`` of the family
    (tool use: ``n_train``, one demonstration each; the CoT families: several sampled orders per problem)."""
    return max(1, cfg.n_train // job_family(cfg.family).demos_per_problem)


def config_hash(cfg: SFTConfig) -> str:
    """16 hex digits of sha256 over :func:`key_config` (sorted-key JSON)."""
    blob = json.dumps(key_config(cfg), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
