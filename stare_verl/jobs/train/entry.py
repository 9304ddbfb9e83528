"""``python -m stare_verl.jobs.train`` / ``stare-verl train``: parse the options, probe the machine once, take the
path (the dry run, the GPU recipe, or the tiny recipe on the CPU or a GPU without SGLang), and turn what stops it
into an exit status: 2 for options that cannot run (one ``error: ...`` line), 130 for a stop before RL.
"""

from __future__ import annotations

import os
import sys

from stare_verl.jobs.backend import choose_backend, probe_gpu
from stare_verl.jobs.procs import interrupt_on_termination
from stare_verl.jobs.train import cpu, gpu, plan
from stare_verl.jobs.train.engine import with_rollout
from stare_verl.jobs.train.launch import INTERRUPTED, stopped_before_rl
from stare_verl.jobs.train.options import OptionsError, parse_options


def main(argv: list[str] | None = None) -> int:
    """Entry point (``python -m stare_verl.jobs.train``); returns the exit status (argparse's usage errors exit
    with 2 themselves)."""
    interrupt_on_termination()  # Ctrl-C (even when inherited as ignored), kill, timeout, a closed terminal: one clean-up
    try:
        opts = parse_options(argv)
    except OptionsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    probe = probe_gpu()
    if opts.dry_run:
        return plan.dry_run(opts, probe)
    backend = choose_backend(probe, force_cpu=opts.cpu)
    warning = probe.idle_gpu_warning()
    if backend.path == "cpu" and not opts.cpu and warning:
        print(warning, file=sys.stderr)  # never a silent CPU fallback on a GPU machine
    backend, problem = with_rollout(opts, backend)  # before any path is taken: --rollout vllm is the CPU's
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if opts.gpu and backend.path != "gpu-sglang":
        print(f"error: --gpu asks for the GPU recipe (verl + SGLang), but {plan.no_gpu_recipe_here(probe)}; "
              "--dry-run --gpu shows what it would run", file=sys.stderr)  # fmt: skip
        return 2
    if backend.path == "gpu-sglang":
        return gpu.train_gpu(opts, backend)  # probed once: nvidia-smi and CUDA are not asked again
    if backend.path == "cpu" and os.environ.get("MODEL"):
        print(plan.model_on_cpu_error(opts), file=sys.stderr)
        return 2
    try:
        return cpu.train_cpu(opts, backend)
    except KeyboardInterrupt as exc:  # before RL (the SFT, the evaluation): RL reports its own stop
        print(stopped_before_rl(f"train-{opts.family}", exc), file=sys.stderr)
        return INTERRUPTED
