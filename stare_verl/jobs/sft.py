"""Cold-start SFT of the tool-use model with verl's own SFT trainer (``make sft-tooluse``).

Two subcommands::

    python -m stare_verl.jobs.sft data [--out data/sft] [--demos 512] [--retool] [--retool-file F] [--n-val 64]
        writes tooluse_train.parquet / tooluse_val.parquet (``envs.tool_use.sft_data`` rows: messages + tools) from
        programmatic demonstrations (real sandbox output, ``stare_verl.jobs.families.tooluse``) and, with --retool, the
        public ReTool-SFT set (Hugging Face, or a local copy with --retool-file); rejected rows are counted.

    python -m stare_verl.jobs.sft train [--nproc N] [--model PATH] [--recipe NAME] [--dry-run] [key=value ...]
        with a GPU (or ``--device gpu --dry-run`` on any machine: the plan only, for ``--nproc`` GPUs, default 8,
        the model check only on a local or cached model): composes ``recipes/sft/<recipe>.yaml`` (default ``tooluse_qwen2.5-7b``) with the
        overrides, validates it up front with verl's config dataclasses, then runs
        ``torchrun --standalone --nproc_per_node=N -m verl.trainer.sft_trainer --config-path recipes/sft
        --config-name <recipe> <overrides>`` and links the last HF checkpoint where the RL recipe's
        ``actor_rollout_ref.model.path`` looks (``checkpoints/sft/qwen2.5-7b-tooluse``).
        Without a GPU: the CPU default SFT of the tiny model (``python -m stare_verl.jobs.demo.sft``; the other
        ``--options`` are passed to it), or with ``--cpu-verl`` verl's SFT trainer itself on the project's
        CPU platform (``stare_verl.cpu``, ``VERL_PLATFORM=cpu``; recipe ``tooluse_tiny_cpu``).

Arguments of the form ``key=value`` (``+key=value``, ``~key``) are Hydra overrides for verl's trainer. The recipes
are composed and checked by ``stare_verl.jobs.sft_recipes``, the data written by ``stare_verl.jobs.sft_data``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stare_verl.jobs.exits import RUN_FAILED, USAGE_ERROR
from stare_verl.jobs.recipes import is_override, override_problem
from stare_verl.jobs.runlog import SFT_HF_SUBDIR, latest_hf_checkpoint
from stare_verl.jobs.sft_data import build_sft_data
from stare_verl.jobs.sft_recipes import DEFAULT_RECIPE, compose_sft, validate_sft
from stare_verl.recipe_files import recipes_dir

__all__ = [
    "DEFAULT_LINK",
    "DEFAULT_RECIPE",
    "build_sft_data",
    "compose_sft",
    "cpu_verl_env",
    "has_gpu",
    "link_checkpoint",
    "main",
    "mark_end_of_turn",
    "torchrun_command",
    "validate_sft",
]

# Where recipes/base/tooluse_qwen2.5-7b-sft.yaml's actor_rollout_ref.model.path looks by default.
DEFAULT_LINK = "checkpoints/sft/qwen2.5-7b-tooluse"


# ------------------------------------------------------------------------------------------- launch


def has_gpu() -> int:
    """Number of CUDA devices torch sees (0 without a GPU or with a CPU-only torch)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken CUDA setup counts as no GPU
        return 0


def torchrun_command(recipe: str, overrides: list[str], nproc: int) -> list[str]:
    """The torchrun command line that runs verl's SFT trainer on recipe ``recipe`` (one node)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc_per_node={nproc}",
        "-m", "verl.trainer.sft_trainer",
        f"--config-path={recipes_dir() / 'sft'}", f"--config-name={recipe}", *overrides,
    ]


def cpu_verl_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for verl's SFT trainer on the CPU platform: ``stare_verl.jobs.procs.cpu_env`` (``VERL_PLATFORM=cpu``,
    offline Hugging Face) plus one torch thread per rank unless ``OMP_NUM_THREADS`` is set."""
    from stare_verl.jobs.procs import cpu_env

    env = cpu_env(extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def mark_end_of_turn(hf_dir: str | os.PathLike, token: str = "<|im_end|>") -> bool:
    """Make ``token`` (the chat template's end of turn) an EOS of the checkpoint's ``generation_config.json``.

    A base model's generation config stops only at its pre-training EOS (``<|endoftext|>`` for Qwen2.5-7B);
    after SFT on chat data the model ends each turn with ``<|im_end|>``, and servers that read the generation
    config (SGLang, vLLM, ``transformers.generate``) should stop there too, as Qwen's instruct releases do.

    Returns:
        True when the file was changed; False when ``token`` is not in the tokenizer or already an EOS.
    """
    from transformers import AutoTokenizer, GenerationConfig

    hf_dir = Path(hf_dir)
    tok = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    tid = tok.convert_tokens_to_ids(token)
    if not isinstance(tid, int) or tid < 0 or tid == tok.unk_token_id:
        return False
    gen = GenerationConfig.from_pretrained(hf_dir, local_files_only=True)
    eos = gen.eos_token_id
    ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if tid in ids:
        return False
    gen.eos_token_id = [tid, *ids]
    gen.save_pretrained(hf_dir)
    return True


def link_checkpoint(hf_dir: str | os.PathLike, link: str | os.PathLike) -> Path:
    """Point ``link`` (a symlink, relative when possible) at ``hf_dir``; an existing symlink is replaced.

    Raises:
        FileExistsError: ``link`` exists and is not a symlink (never overwritten).
    """
    link, target = Path(link), Path(hf_dir).resolve()
    if link.exists() and not link.is_symlink():
        raise FileExistsError(f"{link} exists and is not a symlink; not replacing it (point RL at {target})")
    link.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(target, link.parent.resolve())
    tmp = link.with_name(f".{link.name}.tmp{os.getpid()}")
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(rel, target_is_directory=True)
    os.replace(tmp, link)
    return link


DRY_RUN_NPROC = 8
"""The ranks a ``--device gpu --dry-run`` plans where torch sees no CUDA device (one 8-GPU node, as the RL recipes'
``trainer.n_gpus_per_node``), unless ``--nproc`` says otherwise."""


def _model_is_here(model: str | None) -> bool:
    """Whether ``model`` (``model.path``) loads without a download: a local folder, or a hub id whose
    ``config.json`` is in the Hugging Face cache."""
    if not model or model == "None":
        return False
    from stare_verl.jobs.backend import in_hf_cache

    return Path(model).expanduser().is_dir() or in_hf_cache(model)


def _run(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` in its own process group; on Ctrl-C or exit, end that group (torchrun and its ranks)."""
    proc = None
    try:  # the launch inside the try: a Ctrl-C / kill landing just after it still ends the group
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        return proc.wait()
    except BaseException:
        if proc is None:
            raise
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise


def _last_loss(metrics: Path) -> tuple[int, float] | None:
    import json

    last = None
    try:
        for line in metrics.read_text().splitlines():
            rec = json.loads(line)
            if "train/loss" in rec.get("data", {}):
                last = (int(rec["step"]), float(rec["data"]["train/loss"]))
    except (OSError, ValueError):
        return None
    return last


def _train(args: argparse.Namespace, overrides: list[str], passthrough: list[str]) -> int:
    bad = next(filter(None, map(override_problem, overrides)), None)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    gpus = has_gpu()
    use_gpu = args.device == "gpu" or (args.device == "auto" and gpus > 0)
    if args.device == "gpu" and gpus == 0 and not args.dry_run:
        print("error: --device gpu but torch sees no CUDA device (--dry-run prints the plan without one)",
              file=sys.stderr)  # fmt: skip
        return 2
    if not use_gpu and not args.cpu_verl:
        if overrides:
            print(f"error: no GPU: the CPU default SFT (python -m stare_verl.jobs.demo.sft) takes --options, not "
                  f"Hydra overrides ({' '.join(overrides)}); use --cpu-verl to run verl's trainer on CPU",
                  file=sys.stderr)
            return 2
        gpu_only = [f"--{k}" for k in ("model", "nproc", "recipe") if getattr(args, k)]
        if gpu_only:
            print(f"error: no GPU: {' '.join(gpu_only)} is for verl's SFT trainer (GPU, or --cpu-verl); the CPU "
                  "default SFT trains the tiny model (python -m stare_verl.jobs.demo.sft --help)", file=sys.stderr)
            return 2
        cmd = [sys.executable, "-m", "stare_verl.jobs.demo.sft", *passthrough]
        if args.dry_run:  # never trains: what would run, and where its checkpoint would go
            print("no GPU: would run the CPU default SFT of the tiny model: " + " ".join(cmd), flush=True)
            return 0
        print("no GPU: running the CPU default SFT of the tiny model (python -m stare_verl.jobs.demo.sft)", flush=True)
        from stare_verl.jobs.demo.sft import main as cpu_sft_main

        return int(cpu_sft_main(passthrough) or 0)
    if passthrough:
        print(f"error: unknown options for verl's SFT trainer: {' '.join(passthrough)}", file=sys.stderr)
        return 2
    recipe = args.recipe or (DEFAULT_RECIPE if use_gpu else "tooluse_tiny_cpu")
    nproc = args.nproc or (gpus if use_gpu else 1)
    if use_gpu and nproc == 0:  # a dry run of --device gpu where torch sees no CUDA device
        nproc = DRY_RUN_NPROC
        print(f"dry run without a CUDA device here: planned for {nproc} GPUs on one node (--nproc N to change)",
              flush=True)  # fmt: skip
    if args.model:
        overrides = [f"model.path={args.model}", *overrides]
    env = dict(os.environ) if use_gpu else cpu_verl_env()
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        cfg = compose_sft(recipe, overrides)
        check_model = not args.skip_model_check
        if check_model and args.dry_run and not _model_is_here(str(cfg.model.path)):
            check_model = False  # a dry run downloads nothing
            print(f"dry run: model check skipped: {cfg.model.path} is neither a local folder nor in the Hugging "
                  "Face cache (a dry run downloads nothing)", flush=True)  # fmt: skip
        validate_sft(cfg, nproc, check_model=check_model)
    except Exception as err:  # noqa: BLE001 - a config that would fail at launch: one clear line
        if args.dry_run:  # the plan still, then why it would fail
            print("would run (but see the error below): " + " ".join(torchrun_command(recipe, overrides, nproc)))
        print(f"error: recipe sft/{recipe} would fail at launch: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    out_dir = Path(str(cfg.trainer.default_local_dir))
    metrics = None
    if "file" in cfg.trainer.logger:
        metrics = out_dir / f"metrics-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        env["VERL_FILE_LOGGER_PATH"] = str(metrics.resolve())
    cmd = torchrun_command(recipe, overrides, nproc)
    print(("would run: " if args.dry_run else "running: ") + " ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rc = _run(cmd, env)
    if rc != 0:
        print(f"error: verl's SFT trainer exited with status {rc}", file=sys.stderr)
        return rc
    hf = latest_hf_checkpoint(out_dir, SFT_HF_SUBDIR)  # the latest checkpoint, in verl's meaning (jobs.runlog)
    if hf is None:
        print(f"error: the trainer finished but left no HF checkpoint under {out_dir}", file=sys.stderr)
        return 1
    if mark_end_of_turn(hf):
        print(f"generation_config.json: <|im_end|> added to eos_token_id ({hf})")
    link = args.link if args.link is not None else (DEFAULT_LINK if recipe == DEFAULT_RECIPE else "")
    shown = hf
    if link:
        shown = link_checkpoint(hf, link)
    loss = _last_loss(metrics) if metrics else None
    print(f"SFT done in {time.monotonic() - t0:.0f} s" + (f"; step {loss[0]} train/loss {loss[1]:.4f}" if loss else ""))
    print(f"checkpoint (HF): {shown}" + (f" -> {hf}" if shown != hf else ""))
    print(f"RL from it: make train-tooluse MODEL={shown}")
    return 0


# ---------------------------------------------------------------------------------------------- CLI


def _split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    overrides = [a for a in argv if is_override(a)]
    rest = [a for a in argv if a not in overrides]
    return overrides, rest


def main(argv: list[str] | None = None) -> int:
    """CLI (module docstring). Returns the exit status."""
    from stare_verl.jobs.procs import interrupt_on_termination

    interrupt_on_termination()  # Ctrl-C (even when inherited as ignored), kill, a closed terminal end torchrun too
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m stare_verl.jobs.sft", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="write the multi-turn SFT parquet files")
    d.add_argument("--out", default=os.path.join(os.environ.get("DATA_DIR", "data"), "sft"),
                   help="folder of tooluse_train.parquet / tooluse_val.parquet (default $DATA_DIR/sft or data/sft)")
    d.add_argument("--demos", type=int, default=512, help="programmatic demonstrations (0: none)")
    d.add_argument("--demo-seed", type=int, default=0, help="seed of the programmatic demonstrations (default 0)")
    d.add_argument("--retool", action="store_true", help="add ReTool-SFT from Hugging Face")
    d.add_argument("--retool-file", default=None, help="a local copy of ReTool-SFT (parquet/jsonl)")
    d.add_argument("--retool-limit", type=int, default=None, help="the first N rows of ReTool-SFT (default: all)")
    d.add_argument("--n-val", type=int, default=64, help="rows held out into tooluse_val.parquet (default 64)")
    d.add_argument("--seed", type=int, default=0, help="seed of the shuffle and the train / val split (default 0)")
    d.add_argument("--tokenizer", default=None, help="drop rows longer than --max-length tokens with it")
    d.add_argument("--max-length", type=int, default=None,
                   help="most tokens a row may have, counted with --tokenizer (default: no limit)")
    t = sub.add_parser("train", help="run the SFT (verl on GPU; CPU default otherwise)")
    t.add_argument("--recipe", default=None, help=f"recipes/sft/<name>.yaml (GPU default {DEFAULT_RECIPE})")
    t.add_argument("--nproc", type=int, default=None, help="ranks (default: all GPUs; 1 on CPU)")
    t.add_argument("--model", default=None, help="base model path or hub id (model.path)")
    t.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                   help="auto (default): verl's SFT trainer where torch sees a GPU, else the CPU default SFT; gpu: "
                        "verl's trainer (--dry-run plans it on any machine); cpu: the CPU default SFT")
    t.add_argument("--cpu-verl", action="store_true", help="without a GPU, run verl's SFT trainer on the CPU")
    t.add_argument("--link", default=None, help=f"symlink to the final HF checkpoint (default {DEFAULT_LINK})")
    t.add_argument("--dry-run", action="store_true", help="compose, validate and print the command only")
    t.add_argument("--skip-model-check", action="store_true", help="do not load the model config/tokenizer")
    if argv and argv[0] == "train":
        overrides, rest = _split_overrides(argv[1:])
        args, passthrough = t.parse_known_args(rest)
        return _train(args, overrides, passthrough)
    args = p.parse_args(argv)
    from envs.datasets import DatasetUnavailableError

    try:
        res = build_sft_data(args.out, args.demos, args.demo_seed, args.retool, args.retool_file,
                             args.retool_limit, args.n_val, args.seed, args.tokenizer, args.max_length)
    except (FileNotFoundError, ValueError, KeyError, DatasetUnavailableError) as err:  # a missing/malformed input
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return USAGE_ERROR
    except Exception as err:  # noqa: BLE001 - CLI: one clear line, non-zero status
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return RUN_FAILED
    print(f"train: {res['train']}\nval: {res['val']}\ncounts: {res['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
