"""Phase breakdown of the main job (``make train-<family>``), first run and cached run.

Runs ``python -m stare_verl.jobs.train --family F`` twice in a temporary folder: first with an empty SFT cache
(cold-start SFT, held-out evaluation, verl RL, evaluation after), then again in a new run folder with the SFT
checkpoint and its held-out evaluation cached. For each run it prints the wall time of every phase (from the
run's ``summary.json``: ``phases_s``) and, inside RL, verl's start-up (RL wall minus the steps) and the median
step with its parts (verl's ``timing_s/*`` from ``metrics.jsonl``).

This is where the times in ``docs/results/cpu-main-jobs.md`` come from; timing targets never go into tests.
Targets (idle 2-core machine): first run <= 600 s, cached run <= 300 s.

Usage: ``python bench/main_job.py [--family tooluse] [--steps 30] [--keep DIR] [--sft-cache DIR] [train options ...]``
(``--sft-cache`` with a filled cache runs the cached run only; ``--rollout vllm`` from ``.venv-vllm`` times verl's
vLLM rollout) (``make bench-main-job FAMILY=tooluse [ROLLOUT=vllm]``). Takes as long as the two runs (10-30 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP_KEYS = ("gen", "old_log_prob", "adv", "update_actor", "update_weights", "step")
TARGET_S = {"first": 600.0, "cached": 300.0}


def run_once(family: str, steps: int, run_dir: Path, cache: Path, extra: list[str]) -> dict:
    """One ``stare_verl.jobs.train`` run; returns its summary.json plus ``total_s`` (process wall seconds).

    Raises:
        RuntimeError: the run exited non-zero (its last output lines are in the message).
    """
    cmd = [sys.executable, "-m", "stare_verl.jobs.train", "--cpu", "--family", family, "--steps", str(steps),
           "--run-dir", str(run_dir), "--sft-cache", str(cache), *extra]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    total = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["total_s"] = round(total, 1)
    return summary


def step_breakdown(metrics_path: Path) -> dict[str, float]:
    """Median seconds of each ``timing_s/<key>`` over the run's steps (``STEP_KEYS``), the steps' total seconds
    (``steps_total``) and their number (``n_steps``)."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    out = {}
    for key in STEP_KEYS:
        vals = [r[f"timing_s/{key}"] for r in rows if f"timing_s/{key}" in r]
        if vals:
            out[key] = statistics.median(vals)
    out["steps_total"] = sum(r.get("timing_s/step", 0.0) for r in rows)
    out["n_steps"] = len(rows)
    return out


def _accuracies(evals: dict | None, sep: str = " / ") -> str:
    """``"<key> <accuracy>"`` of each evaluation in ``evals`` (``{"T=0": {"accuracy": ..}, ...}``), joined."""
    return sep.join(f"{k} {v['accuracy']:.3f}" for k, v in (evals or {}).items() if isinstance(v, dict))


def sft_line(sft_dir: Path) -> str:
    """The SFT's steps (and early stop), speed and held-out accuracy, from its ``sft_report.json``."""
    try:
        rep = json.loads((sft_dir / "sft_report.json").read_text())
    except (OSError, ValueError) as err:
        return f"(no SFT report: {err})"
    stop = f", early stop at {rep['stopped_at']} of {rep['max_steps']}" if rep.get("stopped_at") else ""
    checks = f", dev checks {rep['check_eval_s']:.0f} s" if rep.get("checks") else ""
    return (f"{rep['steps']} steps{stop}, {rep['steps_per_s']} steps/s, training {rep['train_s']:.0f} s{checks}; "
            f"held-out {_accuracies(rep.get('heldout'), ', ')}")


def report(label: str, summary: dict, run_dir: Path) -> str:
    """One block of the printout: phases, verl start-up, the median step and the target."""
    phases = summary.get("phases_s", {})
    steps = step_breakdown(run_dir / "metrics.jsonl")
    engine = summary.get("rollout_engine", "?")
    lines = [f"{label}: {summary['total_s']:.0f} s total (target <= {TARGET_S[label]:.0f} s), rollout engine {engine}"]
    for k, v in phases.items():
        lines.append(f"  {k:<12} {v:7.1f} s")
        if k == "sft" and v > 5 and summary.get("sft_checkpoint"):  # trained in this run: its steps
            lines.append("    " + sft_line(Path(summary["sft_checkpoint"])))
    if "rl" in phases:
        lines.append(f"    verl start-up + shut-down {phases['rl'] - steps['steps_total']:7.1f} s")
        lines.append(f"    {steps['n_steps']} steps                  {steps['steps_total']:7.1f} s")
    parts = ", ".join(f"{k} {steps[k]:.2f}" for k in STEP_KEYS if k in steps and k != "step")
    lines.append(f"  median RL step {steps.get('step', float('nan')):.2f} s ({parts})")
    if summary.get("eval_before") or summary.get("eval_after"):
        before = _accuracies(summary.get("eval_before")) or "-"
        after = _accuracies(summary.get("eval_after")) or "-"
        lines.append(f"  held-out before RL {before}; after {after}")
    rest = summary["total_s"] - sum(phases.values())
    lines.append(f"  other (start, data, plots) {rest:7.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="tooluse", choices=["tooluse", "shortcot", "longcot"])
    p.add_argument("--steps", type=int, default=30, help="RL steps (the make target's default: 30)")
    p.add_argument("--keep", default=None, help="folder to keep the runs in (default: a temporary one)")
    p.add_argument("--sft-cache", default=None,
                   help="an SFT cache folder that already holds the checkpoint: run the cached run only")
    args, extra = p.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-main-job-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        cache = Path(args.sft_cache) if args.sft_cache else root / "cache"
        cache.mkdir(parents=True, exist_ok=True)  # train's --sft-cache names an existing folder
        env_note = f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        print(f"main job benchmark: family {args.family}, {args.steps} steps, {env_note}", flush=True)
        for label in ("cached",) if args.sft_cache else ("first", "cached"):
            run_dir = root / f"run-{label}"
            summary = run_once(args.family, args.steps, run_dir, cache, extra)
            print(report(label, summary, run_dir), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
