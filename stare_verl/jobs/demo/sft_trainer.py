"""The cold-start SFT's training run (:func:`train_sft`): demonstrations -> tokenizer -> tiny model -> supervised
fine-tuning -> held-out evaluation, into one checkpoint folder.

Pipeline: the family's problems and demonstrations (:func:`build_family_demos`) -> a tokenizer trained on the
rendered demonstrations -> a tiny Qwen2 model -> supervised fine-tuning with ``transformers.Trainer`` (AdamW, tqdm
progress bar) on an assistant-only loss -> held-out evaluation (greedy and T = 1.0, multi-turn with the real tool)
-> model, tokenizer, :data:`CONFIG_FILE` and :data:`REPORT_FILE` in the output folder.

Why not verl's SFT trainer here: ``verl.trainer.sft_trainer`` does run on this CPU with the CPU backend's patches
under torchrun (``python -m stare_verl.jobs.sft train --cpu-verl``), but it is slower per token than this plain
Trainer loop for the tiny model (FSDP2 over gloo, one rank; ``docs/gpu.md``), which would break the first-run time
budget. ``make sft-tooluse`` uses verl's trainer on GPU.

Token layout (built with verl's Continuous Token builder, as the agent loop builds it at RL time)::

    tool use: prompt (mask 0) | tool call + <|im_end|> (1) | "\\n" + tool turn + "<|im_start|>assistant\\n" (0) |
              \\boxed{..} + <|im_end|> (1)
    CoT:      prompt (mask 0) | answer + <|im_end|> (1)

Loss: mean token cross-entropy over mask-1 tokens only (labels -100 elsewhere). The lr schedule: warm-up, then
constant, or a linear decay at the end (``decay_steps``), or the anneal once the loss falls (:func:`anneal_lr_factor`).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from envs.tiny_hf import build_model, build_tokenizer, save_model
from stare_verl.jobs.demo.encode import encode_demo, render_demo
from stare_verl.jobs.demo.sft_config import SFTConfig, config_hash, key_config, sft_problem_count
from stare_verl.jobs.families import job_family
from stare_verl.jobs.families.problems import split_problems

__all__ = ["CONFIG_FILE", "REPORT_FILE", "anneal_lr_factor", "build_family_demos", "collate_demos", "train_sft"]

CONFIG_FILE = "sft_config.json"  # the checkpoint's cache key and hash
REPORT_FILE = "sft_report.json"  # what the training did and the held-out evaluation (train_sft's report)


def build_family_demos(cfg: SFTConfig, problems) -> tuple[list, list]:
    """``(demos, rejected)`` of ``cfg.family`` for ``problems``: the family's ``demonstrations`` with its
    ``demos_per_problem`` under ``train_seed`` (tool use: ``stare_verl.jobs.families.tooluse.build_demos``, real
    sandbox output; the CoT families: ``stare_verl.jobs.families.cot.CotDemonstrations``, sampled orders)."""
    fam = job_family(cfg.family)
    styles = {"code_styles": cfg.code_styles} if cfg.code_styles != 1 else {}  # tool use only (checked by SFTConfig)
    return fam.demonstrations(problems, seed=cfg.train_seed, per_problem=fam.demos_per_problem, **styles)



class _Features:
    """A map-style dataset of encoded demonstrations (torch ``Dataset`` protocol)."""

    def __init__(self, rows: list[tuple[list[int], list[int]]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        ids, mask = self.rows[i]
        return {"input_ids": ids, "loss_mask": mask}


def collate_demos(pad_id: int):
    """The collate function of encoded demonstrations (``{"input_ids", "loss_mask"}`` lists of ints): right-padded
    ``[B, T]`` int64 ``input_ids`` (``pad_id``), ``attention_mask`` (1 on the tokens) and ``labels`` (the ids where
    the loss mask is 1, -100 elsewhere: the assistant-only loss), ``T`` the longest row of the batch."""
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
        model=model, args=args, train_dataset=features, data_collator=collate_demos(tokenizer.pad_token_id),
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
