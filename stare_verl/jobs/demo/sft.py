"""Cold-start SFT of the tiny model of a CPU default family, cached by its configuration; the SFT's entry points.

:func:`ensure_sft_checkpoint` returns the folder ``<cache_dir>/sft-<hash>`` of a configuration
(:class:`~stare_verl.jobs.demo.sft_config.SFTConfig`; the hash covers the whole configuration and the library
versions, :func:`~stare_verl.jobs.demo.sft_config.config_hash`): reused when it is complete, else trained now
(:func:`~stare_verl.jobs.demo.sft_trainer.train_sft`: model, tokenizer, ``sft_config.json`` and ``sft_report.json``
in one folder). ``python -m stare_verl.jobs.demo.sft`` is its command line (:func:`main`).

Families (``SFTConfig.family``): ``tooluse`` (tool-use demonstrations with real sandbox output,
``stare_verl.jobs.families.tooluse``), ``shortcot`` / ``longcot`` (chain-of-thought sums with a sampled order of the
terms, ``stare_verl.jobs.families.cot``; single turn, no tool). The rest of the pipeline is shared.

A pretrained model's warm start (``--model`` runs of a family whose pretrained task needs one, tool use) is the other
entry, :func:`~stare_verl.jobs.demo.warm_start.ensure_warm_start`.

The pieces, one module each: ``sft_config`` (the configuration and its cache key), ``sft_trainer`` (the training
run), ``warm_start``; every name they export is importable from here too.

Defaults follow the calibration (``docs/cpu-demo-calibration.md``): batch 32, AdamW lr 2e-3, 1000
steps at a constant lr after warm-up; held-out greedy accuracy >= 0.5 is the check before RL. Tool use trains a
2-layer model (``JobFamily.sft_defaults``), the CoT families the calibrated 4-layer one. Tool use trains with two
digits a token (``digits_per_token=2``) and an lr anneal after the copy plateau (``anneal_below_loss``); the
measurements behind these defaults (seeds, layers, early stop, lr, batch size, the CoT families' speeds and
accuracies) are in ``docs/results/tiny-sft-calibration.md``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envs.tiny_hf import load_tokenizer
from stare_verl.jobs.demo.encode import encode_demo, render_demo
from stare_verl.jobs.demo.sft_config import (
    DEFAULT_CACHE_DIR,
    FORMAT_VERSION,
    SFTConfig,
    config_hash,
    key_config,
    sft_problem_count,
)
from stare_verl.jobs.demo.sft_trainer import (
    CONFIG_FILE,
    REPORT_FILE,
    anneal_lr_factor,
    build_family_demos,
    train_sft,
)
from stare_verl.jobs.demo.warm_start import (
    WARM_CONFIG_FILE,
    WarmStartConfig,
    ensure_warm_start,
    warm_start_dir,
    warm_start_key,
    warm_start_problems,
)
from stare_verl.jobs.families import DEFAULT_FAMILY, family_arg, job_family, job_family_names
from stare_verl.validation import error_text

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_CACHE_DIR",
    "FORMAT_VERSION",
    "REPORT_FILE",
    "WARM_CONFIG_FILE",
    "SFTConfig",
    "WarmStartConfig",
    "anneal_lr_factor",
    "build_family_demos",
    "config_hash",
    "encode_demo",
    "ensure_sft_checkpoint",
    "ensure_warm_start",
    "key_config",
    "load_checkpoint",
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


def _field_help(name: str) -> str:
    """The help of the option of ``SFTConfig`` field ``name``: its description and its default, with the families'
    own where ``JobFamily.sft_defaults`` sets one."""
    info = SFTConfig.model_fields[name]
    own = [f"{f} {job_family(f).sft_defaults[name]}" for f in job_family_names() if name in job_family(f).sft_defaults]
    return f"{info.description}; default {info.default}" + (f" ({', '.join(own)})" if own else "")


def main(argv: list[str] | None = None) -> int:
    """``python -m stare_verl.jobs.demo.sft --out DIR [--steps N] ...``: train (or reuse) and print held-out accuracy.

    ``--out`` is the cache directory; the checkpoint lands in ``DIR/sft-<hash>``. Exit status 0, or 2 with
    ``--min-accuracy A`` when the greedy held-out accuracy is below ``A``.
    """
    import argparse

    from stare_verl.jobs.procs import interrupt_on_termination

    interrupt_on_termination()
    ap = argparse.ArgumentParser(description="Cold-start SFT of the tiny model of a CPU family (cached by config).")
    ap.add_argument("--family", type=family_arg, choices=job_family_names(), default=DEFAULT_FAMILY, help=_field_help("family"))
    ap.add_argument("--out", default=None, help="cache directory (default $STARE_CACHE_DIR or runs/cache)")
    ap.add_argument("--steps", type=int, default=None, help=_field_help("steps"))
    ap.add_argument("--n-train", type=int, default=None, help=_field_help("n_train"))
    ap.add_argument("--n-heldout", type=int, default=None, help=_field_help("n_heldout"))
    ap.add_argument("--lr", type=float, default=None, help=_field_help("lr"))
    ap.add_argument("--batch-size", type=int, default=None, help=_field_help("batch_size"))
    ap.add_argument("--warmup-steps", type=int, default=None, help=_field_help("warmup_steps"))
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
    ap.add_argument("--vocab-size", type=int, default=None, help=_field_help("vocab_size"))
    ap.add_argument("--digits-per-token", type=int, default=None, help=_field_help("digits_per_token"))
    ap.add_argument("--anneal-below-loss", type=_off_or_positive, default=None,
                    help="when the logged training loss first falls below this, the lr decays linearly over "
                         "--anneal-steps to --anneal-final-lr-ratio x and the SFT ends there ('off': no anneal; "
                         "default: the family's, 0.1 for tool use, off for the CoT families)")
    ap.add_argument("--anneal-steps", type=int, default=None, help="steps of the anneal's decay (300)")
    ap.add_argument("--anneal-final-lr-ratio", type=float, default=None,
                    help="the lr at the anneal's end, as a share of --lr (0.15)")
    ap.add_argument("--check-every", type=int, default=None, help="steps between the early stop's checks (100)")
    ap.add_argument("--n-dev", type=int, default=None, help="dev problems of each early-stop check (64)")
    ap.add_argument("--data-seed", type=int, default=0, help=_field_help("data_seed"))
    ap.add_argument("--init-seed", type=int, default=0, help=_field_help("init_seed"))
    ap.add_argument("--train-seed", type=int, default=0, help="data order (and the demonstrations' sampling)")
    ap.add_argument("--eval-every", type=int, default=0, help="greedy held-out check every N steps (0: off)")
    ap.add_argument("--threads", type=int, default=None, help=_field_help("num_threads"))
    ap.add_argument("--force", action="store_true", help="retrain even if cached")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm progress bar of the training")
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
        ap.error("; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {error_text(e)}"
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
