"""Overlay the training curves of several run folders, finished or still running: the batch entropy (nats per model
token) with each run's target, the training reward and Cov(log pi, A) of the update, one line per run, read from
verl's metric parts under ``<run>/logs/`` (so a run that is still training shows what it has logged).

``python -m stare_verl.jobs.curves RUN [RUN ...] --out FIG.png [--title T] [--smooth N] [--labels A,B]``; the
``make compare`` report draws its own overlays for the runs it trains.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stare_verl.jobs.runlog import RunFolder, read_verl_jsonl

REWARD_KEYS = ("critic/score/mean", "reward/acc/mean")


def _first(row: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            return float(value)
    return None


def run_curves(run_dir: Path) -> dict[str, list]:
    """``{"step", "entropy", "target", "reward", "cov"}`` lists (equal lengths, None where a step lacks the value) of
    the run at ``run_dir``, read from its verl metric parts (a resumed run's later part wins for a repeated step).
    The target is None throughout for STARE's GRPO-ds twin (``stare/w`` and ``stare/m`` 1 at every step), which logs
    a target it never acts on."""
    from stare_verl.methods import metric_names

    rows = read_verl_jsonl(RunFolder(run_dir).verl_metric_parts())
    # the shared quantities under entropy_control/, or the names older runs logged them under (the registry's)
    entropy_keys = (*metric_names("batch_entropy"), "actor/entropy")
    target_keys = metric_names("target_entropy")
    cov_keys = (*metric_names("cov_logp_adv_eff"), *metric_names("cov_logp_adv"))
    out: dict[str, list] = {"step": [], "entropy": [], "target": [], "reward": [], "cov": []}
    # the GRPO-ds twin logs STARE's target with W = M = 1: a target it never acts on is not drawn
    twin = bool(rows) and all(row.get("stare/w", 1.0) == 1.0 and row.get("stare/m", 1.0) == 1.0
                              and "stare/w" in row for row in rows)  # fmt: skip
    for row in rows:
        out["step"].append(row["step"])
        out["entropy"].append(_first(row, entropy_keys))
        out["target"].append(None if twin else _first(row, target_keys))
        out["reward"].append(_first(row, REWARD_KEYS))
        out["cov"].append(_first(row, cov_keys))
    return out


def _smoothed(xs: list[int], ys: list[float | None], n: int) -> tuple[list[int], list[float]]:
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    if n <= 1 or not pts:
        return [p[0] for p in pts], [p[1] for p in pts]
    out = []
    for i in range(len(pts)):
        window = [p[1] for p in pts[max(0, i - n + 1) : i + 1]]
        out.append(sum(window) / len(window))
    return [p[0] for p in pts], out


def plot_curves(runs: list[Path], out: Path, labels: list[str] | None = None, title: str | None = None,
                smooth: int = 5) -> Path:  # fmt: skip
    """Draw the overlay of ``runs`` into the PNG ``out`` (three panels: entropy with the target as a dashed line of
    the same colour, reward and Cov(log pi, A), both as a running mean over ``smooth`` steps); returns ``out``.

    Raises:
        ValueError: no run has a logged step, or ``labels`` does not match ``runs``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or [Path(r).name for r in runs]
    if len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
    curves = [run_curves(Path(r)) for r in runs]
    if not any(c["step"] for c in curves):
        raise ValueError("no run has a logged step yet")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, (c, label) in enumerate(zip(curves, labels, strict=True)):
        color = f"C{i}"
        x, y = _smoothed(c["step"], c["entropy"], 1)
        axes[0].plot(x, y, color=color, label=label, lw=1.6)
        tx, ty = _smoothed(c["step"], c["target"], 1)
        if ty and max(ty) > 0:
            axes[0].plot(tx, ty, color=color, ls="--", lw=0.9, alpha=0.7)
        x, y = _smoothed(c["step"], c["reward"], smooth)
        axes[1].plot(x, y, color=color, label=label, lw=1.6)
        x, y = _smoothed(c["step"], c["cov"], smooth)
        axes[2].plot(x, y, color=color, label=label, lw=1.6)
    axes[0].set_ylabel("entropy (nats per model token)")
    axes[0].set_title("batch entropy (dashed: target)")
    axes[1].set_ylabel("training reward")
    axes[1].set_title(f"reward (running mean of {smooth})")
    axes[2].set_ylabel("Cov(log pi, A)")
    axes[2].set_title(f"Cov(log pi, A) of the update (running mean of {smooth})")
    axes[2].axhline(0.0, color="0.6", lw=0.8)
    for ax in axes:
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (2 with one line for runs that logged nothing)."""
    ap = argparse.ArgumentParser(prog="python -m stare_verl.jobs.curves", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--labels", default=None, help="comma-separated, one per run (default: the folder names)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--smooth", type=int, default=5)
    args = ap.parse_args(argv)
    try:
        path = plot_curves(args.runs, args.out, args.labels.split(",") if args.labels else None, args.title,
                           max(1, args.smooth))  # fmt: skip
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
