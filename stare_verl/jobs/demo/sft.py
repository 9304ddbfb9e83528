"""Cold-start SFT of the tiny model of a CPU default family, cached by its configuration.

A pretrained model's warm start (``--model`` runs of a family whose pretrained task needs one, tool use) is the
other entry, :func:`ensure_warm_start`: full fine-tuning of the given Hugging Face folder on the family's
demonstrations encoded with that model's own tokenizer and chat template, cached under ``<cache_dir>/warm-<hash>``
by the model's identity and the settings (:class:`WarmStartConfig`).

Families (``SFTConfig.family``): ``tooluse`` (tool-use demonstrations with real sandbox output,
``stare_verl.jobs.families.tooluse``), ``shortcot`` / ``longcot`` (chain-of-thought sums with a sampled order of the terms,
``stare_verl.jobs.families.cot``; single turn, no tool). The rest of the pipeline is shared.

Pipeline (:func:`ensure_sft_checkpoint`): problems and demonstrations -> tokenizer trained on the rendered demonstrations -> tiny Qwen2 model ->
supervised fine-tuning with ``transformers.Trainer`` (AdamW, tqdm progress bar) on an assistant-only loss ->
held-out evaluation (greedy and T = 1.0, multi-turn with the real tool) -> one directory with model,
tokenizer, ``sft_config.json`` and ``sft_report.json``, under ``<cache_dir>/sft-<hash>`` where the hash covers
the whole configuration and the library versions. A later call with the same configuration returns that
directory without training.

Why not verl's SFT trainer here: ``verl.trainer.sft_trainer`` does run on this CPU with the CPU backend's
patches under torchrun (``python -m stare_verl.jobs.sft train --cpu-verl``), but measured ~2.7x slower per token than
this plain Trainer loop for the 0.84 M-parameter 4-layer model (FSDP2 over gloo, one rank), which would break the
first-run time budget. ``make sft-tooluse`` uses verl's trainer on GPU.

Token layout (built with verl's Continuous Token builder, as the agent loop builds it at RL time)::

    tool use: prompt (mask 0) | tool call + <|im_end|> (1) | "\\n" + tool turn + "<|im_start|>assistant\\n" (0) |
              \\boxed{..} + <|im_end|> (1)
    CoT:      prompt (mask 0) | answer + <|im_end|> (1)

Loss: mean token cross-entropy over mask-1 tokens only (labels -100 elsewhere).

Defaults follow the calibration (``docs/cpu-demo-calibration.md``): batch 32, AdamW lr 2e-3, 1000
steps at a constant lr after warm-up; held-out greedy accuracy >= 0.5 is the check before RL. Tool use trains a
2-layer model (0.44 M parameters; ``JobFamily.sft_defaults``), the CoT families the calibrated 4-layer one (0.84 M).

Tool use trains with two digits a token (``digits_per_token=2``) and an lr anneal after the copy plateau
(``anneal_below_loss``); the measurements behind these defaults (seeds, layers, early stop, lr, batch size, the CoT
families' speeds and accuracies) are in ``docs/results/tiny-sft-calibration.md``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from envs.tiny_hf import (
    MIN_VOCAB_SIZE,
    TinyModelConfig,
    build_model,
    build_tokenizer,
    digit_groups,
    load_tokenizer,
    save_model,
)
from stare_verl.jobs.demo.encode import encode_demo, render_demo
from stare_verl.jobs.families import DEFAULT_FAMILY, family_arg, job_family, job_family_names
from stare_verl.jobs.families.problems import split_problems
from stare_verl.models.registry import model_identity

__all__ = [
    "DEFAULT_CACHE_DIR",
    "FORMAT_VERSION",
    "SFTConfig",
    "WarmStartConfig",
    "build_family_demos",
    "config_hash",
    "encode_demo",
    "ensure_sft_checkpoint",
    "ensure_warm_start",
    "read_report",
    "render_demo",
    "sft_problem_count",
    "train_sft",
    "warm_start_dir",
    "warm_start_key",
    "warm_start_problems",
    "write_rl_data",
]

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = "runs/cache"
# Bump when the data format, tokenizer recipe or training code changes in a way the config does not show.
FORMAT_VERSION = 1
CONFIG_FILE = "sft_config.json"
REPORT_FILE = "sft_report.json"

# Fields that do not change the checkpoint (left out of the cache key).
_NOT_IN_KEY = {"cache_dir", "eval_every", "eval_every_n", "num_threads", "progress", "eval_temperatures"}
# The early stop's fields: in the key only when the early stop is on.
_EARLY_STOP_FIELDS = {"stop_accuracy", "check_every", "n_dev"}
# The anneal's fields: in the key only when the anneal is on.
_ANNEAL_FIELDS = {"anneal_below_loss", "anneal_steps", "anneal_final_lr_ratio"}


class SFTConfig(BaseModel):
    """Everything that determines the cold-start SFT checkpoint (and a few run-only knobs).

    Family: ``family`` (a registered ``stare_verl.jobs.families`` name: ``tooluse``, ``shortcot``, ``longcot``;
    left out of the cache key for tool use (``JobFamily.legacy_sft_key``), so tool-use keys are the same as before
    the field existed).
    Data: ``data_seed`` (reasoning-gym seeds of all splits), ``n_train`` demonstrations (CoT families: from
    ``n_train // COT_DEMOS_PER_PROBLEM`` problems, see :func:`sft_problem_count`), ``n_heldout`` held-out
    problems (evaluated after SFT; the RL val set of the same seed). Tokenizer: ``vocab_size`` (total, the digit
    groups included), ``digits_per_token`` (1-3; ``envs.tiny_hf.build_tokenizer``; in the key only when not 1).
    Model: ``model`` (architecture), ``init_seed``. Fields the caller leaves unset default per family
    (``JobFamily.sft_defaults``: tool use's 2-layer model, the CoT families' ``steps`` and ``max_response_tokens``). Training: ``steps``, ``batch_size``, ``lr`` (AdamW),
    ``weight_decay``, ``warmup_steps`` (then constant lr), ``decay_steps`` (the lr falls linearly over the
    last ``decay_steps`` steps, by lr / decay_steps a step, reaching 0 just after the last; 0: constant to the end,
    and left out of the cache key; warm-up plus decay must fit in ``steps``),
    ``max_grad_norm``, ``train_seed`` (data order).
    Early stop (in the cache key only when on): ``stop_accuracy`` (None: off; else every ``check_every`` steps the
    greedy accuracy on ``n_dev`` problems of the data seed's ``sft_dev`` split, disjoint from the held-out and SFT
    splits, is measured, and training ends at the first check that reaches it; ``steps`` is then the most steps).
    It cannot be combined with ``decay_steps``.
    Anneal (in the cache key only when on): ``anneal_below_loss`` (None: off; else the first logged training loss
    below it starts a linear lr fall over ``anneal_steps`` steps to ``anneal_final_lr_ratio`` x ``lr``, and the run
    ends there; ``steps`` is then the most steps; see :func:`anneal_lr_factor`). Not with ``decay_steps``; with
    ``stop_accuracy`` whichever ends the run first. Why: when the copy plateau ends depends on the seed (and on the
    machine's floating-point order), so a fixed step count either wastes steps or stops before the drop.

    Run-only (not in the cache key): ``cache_dir`` (default ``$STARE_CACHE_DIR`` or ``runs/cache``),
    ``num_threads`` (torch threads), ``progress`` (tqdm bar), ``eval_every`` (0 = off; else greedy held-out
    accuracy on ``eval_every_n`` problems every that many steps, to measure when the model learns),
    ``eval_temperatures`` (of the final held-out evaluation).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str = DEFAULT_FAMILY  # a registered job family (stare_verl.jobs.families)
    data_seed: int = Field(0, ge=0, le=2**32 - 1)
    n_train: int = Field(4096, ge=1)
    n_heldout: int = Field(200, ge=1)
    vocab_size: int = Field(384, ge=265)
    digits_per_token: int = Field(1, ge=1, le=3)
    model: TinyModelConfig = Field(default_factory=TinyModelConfig)
    init_seed: int = Field(0, ge=0, le=2**32 - 1)
    train_seed: int = Field(0, ge=0, le=2**32 - 1)
    steps: int = Field(1000, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-3, gt=0, le=1.0, allow_inf_nan=False)  # AdamW: above 1 is a typo, not a schedule
    weight_decay: float = Field(0.01, ge=0, allow_inf_nan=False)
    warmup_steps: int = Field(20, ge=0)
    decay_steps: int = Field(0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0, allow_inf_nan=False)
    stop_accuracy: float | None = Field(None, gt=0, le=1)
    anneal_below_loss: float | None = Field(None, gt=0, allow_inf_nan=False)
    anneal_steps: int = Field(300, ge=1)
    anneal_final_lr_ratio: float = Field(0.15, ge=0, le=1, allow_inf_nan=False)
    check_every: int = Field(100, ge=1)
    n_dev: int = Field(64, ge=1, le=4096)  # each check greedily runs them all: 4096 takes minutes a check
    max_response_tokens: int = Field(128, ge=8, description="episode token budget of the held-out evaluation")
    code_styles: int = Field(1, ge=1, le=3, description="tool use: equivalent programs of the demonstrations "
                             "(stare_verl.jobs.families.tooluse.CODE_STYLES), one of the first N drawn per "
                             "demonstration; 1: print(<expression>) only")

    cache_dir: str | None = None
    num_threads: int | None = Field(None, ge=1)
    progress: bool = True
    eval_every: int = Field(0, ge=0)
    eval_every_n: int = Field(64, ge=1)
    eval_temperatures: tuple[float, ...] = (0.0, 1.0)

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


def _versions() -> dict[str, str]:
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
    return {"config": conf, "versions": _versions()}


def sft_problem_count(cfg: SFTConfig) -> int:
    """Problems behind ``cfg``'s ``n_train`` demonstrations: ``max(1, n_train // demos_per_problem)`` of the family
    (tool use: ``n_train``, one demonstration each; the CoT families: several sampled orders per problem)."""
    return max(1, cfg.n_train // job_family(cfg.family).demos_per_problem)


def build_family_demos(cfg: SFTConfig, problems) -> tuple[list, list]:
    """``(demos, rejected)`` of ``cfg.family`` for ``problems``: the family's ``demonstrations`` with its
    ``demos_per_problem`` under ``train_seed`` (tool use: ``stare_verl.jobs.families.tooluse.build_demos``, real
    sandbox output; the CoT families: ``stare_verl.jobs.families.cot.CotDemonstrations``, sampled orders)."""
    fam = job_family(cfg.family)
    styles = {"code_styles": cfg.code_styles} if cfg.code_styles != 1 else {}  # tool use only (checked by SFTConfig)
    return fam.demonstrations(problems, seed=cfg.train_seed, per_problem=fam.demos_per_problem, **styles)


def config_hash(cfg: SFTConfig) -> str:
    """16 hex digits of sha256 over :func:`key_config` (sorted-key JSON)."""
    blob = json.dumps(key_config(cfg), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class _Features:
    """A map-style dataset of encoded demonstrations (torch ``Dataset`` protocol)."""

    def __init__(self, rows: list[tuple[list[int], list[int]]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        ids, mask = self.rows[i]
        return {"input_ids": ids, "loss_mask": mask}


def _collate(pad_id: int):
    import torch

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for i, b in enumerate(batch):
            n = len(b["input_ids"])
            row = torch.tensor(b["input_ids"], dtype=torch.long)
            ids[i, :n] = row
            att[i, :n] = 1
            keep = torch.tensor(b["loss_mask"], dtype=torch.bool)
            labels[i, :n] = torch.where(keep, row, torch.full_like(row, -100))
        return {"input_ids": ids, "attention_mask": att, "labels": labels}

    return collate


def _make_callback(cfg: SFTConfig, tokenizer, heldout, history: dict[str, Any], dev=()):
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        """Keeps the logged losses and, with ``eval_every``, greedy held-out accuracy along the way; with
        ``stop_accuracy``, checks greedy accuracy on ``dev`` every ``check_every`` steps and ends the training at
        the first check that reaches it."""

        def __init__(self):
            self.t0 = time.perf_counter()
            self.eval_s = 0.0  # all evaluations along the way (dev checks and eval_every)
            self.check_s = 0.0  # the dev checks alone

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                step, loss = int(state.global_step), float(logs["loss"])
                history["loss"].append((step, loss))
                if cfg.anneal_below_loss is not None and history["anneal_from"] is None and loss < cfg.anneal_below_loss:
                    history["anneal_from"] = step
                    print(f"[sft] step {step}: training loss {loss:.3f} < {cfg.anneal_below_loss}: the lr decays to "
                          f"{cfg.anneal_final_lr_ratio} x over the next {cfg.anneal_steps} steps, then the SFT ends",
                          file=sys.stderr, flush=True)
            if logs and "learning_rate" in logs:
                history["lr"].append((int(state.global_step), float(logs["learning_rate"])))

        def _greedy_accuracy(self, model, problems) -> tuple[float, float]:
            """Greedy accuracy on ``problems`` and the seconds it took (also added to ``eval_s``)."""
            from stare_verl.jobs.demo.evaluate import evaluate_model

            t = time.perf_counter()
            was_training = model.training
            model.eval()
            res = evaluate_model(model, tokenizer, problems, (0.0,), max_response_tokens=cfg.max_response_tokens,
                                 family=cfg.family)
            model.train(was_training)
            seconds = time.perf_counter() - t
            self.eval_s += seconds
            return res[0.0][0].accuracy, seconds

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step = int(state.global_step)
            start = history["anneal_from"]
            if start is not None and step >= start + cfg.anneal_steps:
                control.should_training_stop = True
            if cfg.stop_accuracy is not None and dev and step % cfg.check_every == 0 and step < cfg.steps:
                acc, seconds = self._greedy_accuracy(model, dev)
                self.check_s += seconds
                history["checks"].append({"step": step, "dev_greedy_acc": acc})
                if acc >= cfg.stop_accuracy:
                    history["stopped_at"] = step
                    control.should_training_stop = True
                    print(f"[sft] step {step}: greedy accuracy {acc:.3f} on {len(dev)} dev problems >= "
                          f"{cfg.stop_accuracy}: early stop", file=sys.stderr, flush=True)
            stopping = bool(control.should_training_stop)
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps or stopping) and model is not None:
                acc, _ = self._greedy_accuracy(model, heldout[: cfg.eval_every_n])
                train_s = time.perf_counter() - self.t0 - self.eval_s
                history["evals"].append({"step": step, "greedy_acc": acc, "train_s": round(train_s, 1)})
                print(f"[sft] step {step}: greedy held-out accuracy {acc:.3f} ({cfg.eval_every_n} problems, "
                      f"{train_s:.0f} s of training)", file=sys.stderr, flush=True)

    return Recorder()


def anneal_lr_factor(step: int, cfg: SFTConfig, anneal_from: int | None) -> float:
    """The lr multiplier of the anneal schedule at optimizer step ``step`` (0-based count of steps taken).

    Linear warm-up over ``cfg.warmup_steps`` (``step / warmup_steps``, as transformers' ``constant_with_warmup``),
    then 1 until the anneal starts (``anneal_from``, the step whose logged training loss first fell below
    ``cfg.anneal_below_loss``; None: not yet), then a linear fall to ``cfg.anneal_final_lr_ratio`` over
    ``cfg.anneal_steps`` steps, where the run ends.
    """
    if step < cfg.warmup_steps:
        return step / cfg.warmup_steps
    if anneal_from is None or step <= anneal_from:
        return 1.0
    done = min(1.0, (step - anneal_from) / cfg.anneal_steps)
    return 1.0 - (1.0 - cfg.anneal_final_lr_ratio) * done


def train_sft(cfg: SFTConfig, out_dir: str | Path) -> dict[str, Any]:
    """Run the whole cold-start SFT into ``out_dir`` (model, tokenizer, config, report); returns the report.

    Report keys: ``hash``, ``n_demos``, ``rejected_demos``, ``steps`` (trained), ``max_steps`` (``cfg.steps``),
    ``stopped_at`` (the early stop's step, or None), ``checks`` (the early stop's ``{"step", "dev_greedy_acc"}``),
    ``train_s`` (without any evaluation along the way), ``steps_per_s``, ``check_eval_s`` (seconds of the dev checks),
    ``loss`` (list of ``[step, loss]``), ``first_loss``, ``final_loss``, ``evals`` (with ``eval_every``),
    ``heldout`` (``{"T=0.0": EvalReport dict, "T=1.0": ...}``), ``data_s``, ``eval_s``.

    ``num_threads`` applies to this call only (torch's thread count is restored afterwards).

    Raises:
        stare_verl.jobs.families.problems.DemoError: the sandbox could not produce the demonstrations.
    """
    import torch

    threads = torch.get_num_threads()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    try:
        return _train_sft(cfg, Path(out_dir))
    finally:
        torch.set_num_threads(threads)


def _train_sft(cfg: SFTConfig, out: Path) -> dict[str, Any]:
    import torch
    from transformers import Trainer, TrainingArguments
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from stare_verl.jobs.demo.evaluate import evaluate_model

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    n_dev = cfg.n_dev if cfg.stop_accuracy is not None else 0
    splits = split_problems(sft_problem_count(cfg), cfg.n_heldout, cfg.data_seed, family=cfg.family, n_dev=n_dev)
    demos, rejected = build_family_demos(cfg, splits["sft_train"])
    if not demos:
        raise RuntimeError("no demonstration survived the check against the ground truth")
    tokenizer = build_tokenizer([render_demo(d) for d in demos], out, vocab_size=cfg.vocab_size,
                                digits_per_token=cfg.digits_per_token)
    builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen2")
    features = _Features([encode_demo(d, tokenizer, builder) for d in demos])
    data_s = time.perf_counter() - t0
    model = build_model(tokenizer, cfg.model, seed=cfg.init_seed)
    history: dict[str, Any] = {"loss": [], "lr": [], "evals": [], "checks": [], "stopped_at": None,
                               "anneal_from": None}
    recorder = _make_callback(cfg, tokenizer, splits["heldout"], history, splits.get("sft_dev", ()))
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="warmup_stable_decay" if cfg.decay_steps else "constant_with_warmup",
        lr_scheduler_kwargs={"num_decay_steps": cfg.decay_steps, "decay_type": "linear"} if cfg.decay_steps else {},
        warmup_steps=cfg.warmup_steps,
        max_grad_norm=cfg.max_grad_norm,
        optim="adamw_torch",
        logging_steps=max(1, min(25, cfg.steps // 10)),
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=cfg.train_seed,
        data_seed=cfg.train_seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=not cfg.progress,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=features, data_collator=_collate(tokenizer.pad_token_id),
        callbacks=[recorder],
    )
    if cfg.anneal_below_loss is not None:  # the Trainer keeps a scheduler it is given
        trainer.create_optimizer()
        trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            trainer.optimizer, lambda step: anneal_lr_factor(step, cfg, history["anneal_from"]))
    t1 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t1 - recorder.eval_s
    steps = int(trainer.state.global_step)
    shutil.rmtree(out / "trainer", ignore_errors=True)
    model.eval()
    save_model(model, tokenizer, out)
    t2 = time.perf_counter()
    res = evaluate_model(model, tokenizer, splits["heldout"], cfg.eval_temperatures, seed=0,
                         max_response_tokens=cfg.max_response_tokens, family=cfg.family)
    losses = history["loss"]
    report = {
        "hash": config_hash(cfg),
        "family": cfg.family,
        "n_demos": len(demos),
        "rejected_demos": len(rejected),
        "demo_tokens_mean": sum(len(r[0]) for r in features.rows) / len(features),
        "model_tokens_mean": sum(sum(r[1]) for r in features.rows) / len(features),
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "steps": steps,
        "max_steps": cfg.steps,
        "stopped_at": history["stopped_at"],
        "anneal_from": history["anneal_from"],
        "checks": history["checks"],
        "train_s": round(train_s, 2),
        "steps_per_s": round(steps / train_s, 3) if train_s > 0 else None,
        "check_eval_s": round(recorder.check_s, 2),
        "data_s": round(data_s, 2),
        "eval_s": round(time.perf_counter() - t2, 2),
        "loss": losses,
        "first_loss": losses[0][1] if losses else None,
        "final_loss": losses[-1][1] if losses else None,
        "lr": history["lr"],
        "evals": history["evals"],
        "heldout": {f"T={t}": rep.to_dict() for t, (rep, _) in res.items()},
        "torch_threads": torch.get_num_threads(),
    }
    (out / CONFIG_FILE).write_text(json.dumps({**key_config(cfg), "hash": config_hash(cfg)}, indent=1))
    (out / REPORT_FILE).write_text(json.dumps(report, indent=1))
    return report


def _complete(path: Path, digest: str) -> bool:
    try:
        saved = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return saved.get("hash") == digest and (path / REPORT_FILE).is_file() and (path / "config.json").is_file()


def ensure_sft_checkpoint(cfg: SFTConfig | None = None, *, force: bool = False) -> Path:
    """The directory of the cold-start SFT checkpoint for ``cfg``: reused from the cache, or trained now.

    The directory ``<cache_dir>/sft-<config_hash(cfg)>`` holds the model (``save_pretrained``), the tokenizer
    (same directory: pass it as both model and tokenizer path), ``sft_config.json`` and ``sft_report.json``
    (see :func:`train_sft`; :func:`read_report` reads it). Training writes to a temporary sibling directory
    that is renamed into place at the end, so an interrupted run never leaves a half-written checkpoint that
    later runs would reuse; when two runs race, the first to finish wins and the other's copy is discarded.

    Args:
        cfg: the configuration (defaults: the calibrated one).
        force: train again even if a cached checkpoint exists (it is replaced).
    Returns:
        the checkpoint directory (``pathlib.Path``).
    Raises:
        stare_verl.jobs.families.problems.DemoError: the sandbox could not produce the demonstrations.
    """
    cfg = cfg or SFTConfig()
    digest = config_hash(cfg)
    root = cfg.resolved_cache_dir()
    final = root / f"sft-{digest}"
    if not force and _complete(final, digest):
        logger.info("cold-start SFT: cache hit %s", final)
        print(f"[sft] cache hit: {final}; {_summary(read_report(final))}", file=sys.stderr, flush=True)
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".sft-{digest}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    plan = f"{cfg.steps} steps" if cfg.stop_accuracy is None else (
        f"at most {cfg.steps} steps, early stop at dev greedy accuracy >= {cfg.stop_accuracy}")
    if cfg.anneal_below_loss is not None:
        plan = (f"at most {cfg.steps} steps; once the training loss falls below {cfg.anneal_below_loss}, "
                f"{cfg.anneal_steps} more with the lr falling to {cfg.anneal_final_lr_ratio} x"
                + ("" if cfg.stop_accuracy is None else f"; early stop at dev greedy accuracy >= {cfg.stop_accuracy}"))
    print(f"[sft] cache miss: training {final} ({plan})", file=sys.stderr, flush=True)
    try:
        train_sft(cfg, tmp)
        if final.exists():
            if force or not _complete(final, digest):
                shutil.rmtree(final)
            else:  # another run finished first
                return final
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[sft] saved {final}; {_summary(read_report(final))}", file=sys.stderr, flush=True)
    return final


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
    return {"format": 1, "model": model_identity(Path(cfg.model_dir)), **settings, "versions": _versions()}


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
    collate = _collate(int(tok.pad_token_id if tok.pad_token_id is not None else 0))
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


def _summary(rep: dict[str, Any]) -> str:
    accs = ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in rep.get("heldout", {}).items())
    n = next(iter(rep.get("heldout", {}).values()), {}).get("n", 0)
    return f"held-out accuracy ({n} problems): {accs}"


def write_rl_data(
    cfg: SFTConfig | None, out_dir: str | Path, n_train: int = 1024, n_val: int | None = None,
    agent_name: str | None = None,
) -> dict[str, Path]:
    """RL ``train.parquet`` / ``val.parquet`` for the model SFT-trained with ``cfg``.

    Training problems are disjoint from ``cfg``'s demonstrations and held-out set; ``val.parquet`` holds the
    first ``n_val`` (default all) of the held-out problems ``cfg``'s SFT report was measured on.
    See :func:`stare_verl.jobs.families.problems.write_rl_parquet`; ``agent_name`` defaults to the family's
    (``stare_tool_agent`` for tool use, ``single_turn_agent`` for the CoT families).
    """
    from stare_verl.jobs.families.problems import write_rl_parquet

    cfg = cfg or SFTConfig()
    return write_rl_parquet(out_dir, n_train=n_train, n_val=n_val, seed=cfg.data_seed, agent_name=agent_name,
                            n_sft_train=sft_problem_count(cfg), n_heldout=cfg.n_heldout, family=cfg.family)


def read_report(path: str | Path) -> dict[str, Any]:
    """The ``sft_report.json`` of a checkpoint directory (held-out accuracy under ``heldout``)."""
    return json.loads((Path(path) / REPORT_FILE).read_text())


def load_checkpoint(path: str | Path):
    """``(model, tokenizer)`` of a checkpoint directory (CPU, float32, eval mode)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
    model.eval()
    return model, load_tokenizer(path)


def _number_arg(ok, allowed: str, off: bool = True):
    """An argparse type: a number for which ``ok(value)`` holds, or ``off`` when ``off`` is allowed (else a usage
    error naming ``allowed``; NaN never passes a check written as a comparison)."""
    import argparse

    expected = f"'off' or {allowed}" if off else allowed

    def parse(text: str) -> float | str:
        if off and text == "off":
            return text
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


# --stop-accuracy, --anneal-below-loss and --min-accuracy
_stop_accuracy_arg = _number_arg(lambda v: 0 < v <= 1, "a number in (0, 1]")
_off_or_positive = _number_arg(lambda v: 0 < v < float("inf"), "a number > 0")
_accuracy_arg = _number_arg(lambda v: 0 <= v <= 1, "a number in [0, 1]", off=False)


def main(argv: list[str] | None = None) -> int:
    """``python -m stare_verl.jobs.demo.sft --out DIR [--steps N] ...``: train (or reuse) and print held-out accuracy.

    ``--out`` is the cache directory; the checkpoint lands in ``DIR/sft-<hash>``. Exit status 0, or 2 with
    ``--min-accuracy A`` when the greedy held-out accuracy is below ``A``.
    """
    import argparse

    from stare_verl.jobs.procs import interrupt_on_termination

    interrupt_on_termination()
    ap = argparse.ArgumentParser(description="Cold-start SFT of the tiny model of a CPU family (cached by config).")
    ap.add_argument("--family", type=family_arg, choices=job_family_names(), default=DEFAULT_FAMILY)
    ap.add_argument("--out", default=None, help="cache directory (default $STARE_CACHE_DIR or runs/cache)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--n-heldout", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--warmup-steps", type=int, default=None)
    ap.add_argument("--decay-steps", type=int, default=None,
                    help="linear lr decay over the last N steps, to 0 after the last (default 0: constant lr)")
    ap.add_argument("--max-response-tokens", type=int, default=None,
                    help="episode token budget of the held-out evaluation")
    ap.add_argument("--stop-accuracy", default=None, type=_stop_accuracy_arg,
                    help="end early at the first check whose greedy accuracy on the dev split reaches this "
                         "(default: off; checks every --check-every steps on --n-dev problems; --steps is then the "
                         "most steps). make train-* take it as ARGS=\"--sft-stop-accuracy X\"")
    ap.add_argument("--code-styles", type=int, default=None,
                    help="tool use: equivalent programs drawn per demonstration (1-3; 1: print(<expression>))")
    ap.add_argument("--vocab-size", type=int, default=None)
    ap.add_argument("--digits-per-token", type=int, default=None)
    ap.add_argument("--anneal-below-loss", type=_off_or_positive, default=None,
                    help="when the logged training loss first falls below this, the lr decays linearly over "
                         "--anneal-steps to --anneal-final-lr-ratio x and the SFT ends there ('off': no anneal; "
                         "default: the family's, 0.1 for tool use, off for the CoT families)")
    ap.add_argument("--anneal-steps", type=int, default=None, help="steps of the anneal's decay (300)")
    ap.add_argument("--anneal-final-lr-ratio", type=float, default=None,
                    help="the lr at the anneal's end, as a share of --lr (0.15)")
    ap.add_argument("--check-every", type=int, default=None, help="steps between the early stop's checks (100)")
    ap.add_argument("--n-dev", type=int, default=None, help="dev problems of each early-stop check (64)")
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--init-seed", type=int, default=0)
    ap.add_argument("--train-seed", type=int, default=0, help="data order (and the demonstrations' sampling)")
    ap.add_argument("--eval-every", type=int, default=0, help="greedy held-out check every N steps (0: off)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--force", action="store_true", help="retrain even if cached")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--min-accuracy", type=_accuracy_arg, default=None,
                    help="exit 2 when the greedy held-out accuracy is below this (in [0, 1])")
    a = ap.parse_args(argv)
    given = {k: getattr(a, k) for k in ("steps", "n_train", "n_heldout", "lr", "batch_size", "warmup_steps",
                                         "decay_steps", "max_response_tokens", "check_every", "n_dev",
                                         "anneal_steps", "anneal_final_lr_ratio", "vocab_size", "digits_per_token",
                                         "code_styles")
             if getattr(a, k) is not None}  # fmt: skip
    for key in ("stop_accuracy", "anneal_below_loss"):
        if getattr(a, key) is not None:
            given[key] = None if getattr(a, key) == "off" else getattr(a, key)
    try:
        cfg = SFTConfig(
            family=a.family, cache_dir=a.out, data_seed=a.data_seed, init_seed=a.init_seed, train_seed=a.train_seed, eval_every=a.eval_every,
            num_threads=a.threads, progress=not a.no_progress, **given,
        )
    except ValidationError as err:
        ap.error("; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg'].removeprefix('Value error, ')}"
                           for e in err.errors()))  # fmt: skip
    if a.warmup_steps is not None and a.warmup_steps > cfg.steps:  # the lr would never reach --lr
        ap.error(f"--warmup-steps {a.warmup_steps} exceeds the run's {cfg.steps} steps: the lr would never reach "
                 f"--lr ({cfg.lr:g})")
    path = ensure_sft_checkpoint(cfg, force=a.force)
    rep = read_report(path)
    print(f"checkpoint: {path}")
    stop = f" (early stop at step {rep['stopped_at']} of {rep['max_steps']})" if rep.get("stopped_at") else ""
    print(f"steps {rep['steps']}{stop}, {rep['steps_per_s']} steps/s, loss {rep['first_loss']} -> {rep['final_loss']}")
    for key, r in rep["heldout"].items():
        print(f"held-out {key}: accuracy {r['accuracy']:.3f} (n {r['n']}), mean turns {r['mean_turns']:.2f}, "
              f"tool calls {r['mean_tool_calls']:.2f}, tool errors/call {r['tool_error_rate']:.3f}")
    greedy = rep["heldout"].get("T=0.0", {}).get("accuracy")
    if a.min_accuracy is not None and (greedy is None or greedy < a.min_accuracy):
        print(f"greedy held-out accuracy {greedy} is below --min-accuracy {a.min_accuracy}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
