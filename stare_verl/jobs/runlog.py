"""Run folder outputs: per-step metrics.jsonl from verl's file logger, and PNG plots of a run."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Metric keys kept in metrics.jsonl (prefix match), in verl's and our naming.
KEPT_PREFIXES = (
    "critic/score/",
    "critic/rewards/",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "stare/",
    "response_length/",
    "num_turns/",
    "agent/",
    "tool/",
    "reward/",
    "val-core/",
    "val-aux/",
    "training/rollout_probs_diff",
    "timing_s/",
)
KEPT_SUBSTRINGS = ("acc", "tool")


def read_verl_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Read verl ``FileLogger`` lines (``{"step": n, "data": {...}}``) from several files, one row per step.

    Later files win for a repeated step (a resumed run re-logs from its checkpoint); malformed lines are
    skipped. Returns rows ``{"step": n, **metrics}`` sorted by step.
    """
    rows: dict[int, dict[str, Any]] = {}
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
                step = int(rec["step"])
                data = dict(rec["data"])
            except (ValueError, KeyError, TypeError):
                continue
            rows.setdefault(step, {}).update(data)
    return [{"step": s, **rows[s]} for s in sorted(rows)]


def select_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """Keep the step and the finite scalar metrics worth plotting/comparing (see ``KEPT_PREFIXES``)."""
    out: dict[str, Any] = {"step": row["step"]}
    for key, value in row.items():
        if key == "step" or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if not math.isfinite(float(value)):
            continue
        if key.startswith(KEPT_PREFIXES) or any(s in key for s in KEPT_SUBSTRINGS):
            out[key] = value
    return out


def write_metrics_jsonl(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write ``select_metrics`` of each row as one JSON line per step; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(select_metrics(row)) + "\n")
    return path


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in rows if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(rows: list[dict[str, Any]], out_dir: Path, target_entropy: float | None = None) -> list[Path]:
    """Write entropy.png (actor/entropy with the target and the steps the gate was on), entropy_dynamics.png
    (see :func:`plot_entropy_dynamics`), reward.png and response_length.png into ``out_dir``; returns the files
    written (a plot without data is skipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    steps, ent = _series(rows, "actor/entropy")
    if steps:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(steps, ent, marker=".", label="actor/entropy (nats)")
        s2, model_ent = _series(rows, "stare/batch_entropy")
        if s2:
            ax.plot(s2, model_ent, linestyle="--", label="stare/batch_entropy (model tokens)")
        if target_entropy is None:
            _, tgt = _series(rows, "stare/target_entropy")
            target_entropy = tgt[-1] if tgt else None
        if target_entropy is not None:
            ax.axhline(target_entropy, color="red", linewidth=1, label=f"target {target_entropy:g}")
        gs, gate = _series(rows, "stare/gate_on")
        for s, g in zip(gs, gate, strict=True):
            if g > 0.5:
                ax.axvspan(s - 0.5, s + 0.5, color="orange", alpha=0.15, linewidth=0)
        if any(g > 0.5 for g in gate):
            ax.plot([], [], color="orange", alpha=0.3, linewidth=6, label="gate on")
        ax.set_xlabel("step")
        ax.set_ylabel("entropy (nats)")
        ax.legend(fontsize=8)
        ax.set_title("Policy entropy")
        fig.tight_layout()
        written.append(out_dir / "entropy.png")
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)

    written.extend(plot_entropy_dynamics(rows, out_dir))

    for key, name, ylabel in (
        ("critic/score/mean", "reward.png", "reward (mean per response)"),
        ("response_length/mean", "response_length.png", "response length (tokens)"),
    ):
        steps, vals = _series(rows, key)
        if not steps:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(steps, vals, marker=".")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(key)
        fig.tight_layout()
        written.append(out_dir / name)
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written


QUADRANT_LABELS = {
    "pos_high": "A>0, surprisal > H",
    "pos_low": "A>0, surprisal <= H",
    "neg_high": "A<0, surprisal > H",
    "neg_low": "A<0, surprisal <= H",
    "zero_adv": "A=0",
}


def plot_entropy_dynamics(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write entropy_dynamics.png: per step, Cov(log pi, A) over model tokens before (``stare/cov_logp_adv``)
    and after reweighting (``stare/cov_logp_adv_eff``), and the token classes' contributions to the
    reweighted covariance (``stare/cov_quadrant_eff/*``). First-order theory (Cui et al. 2025, arXiv
    2505.22617) gives dH ~ -eta * Cov(log pi, A): a positive covariance drives entropy down.

    Returns ``[path]``, or ``[]`` when the rows carry no covariance metric (runs from before they existed)."""
    steps, cov = _series(rows, "stare/cov_logp_adv")
    if not steps:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax1.plot(steps, cov, color="gray", label="Cov(log pi, A), GRPO advantage")
    s_eff, cov_eff = _series(rows, "stare/cov_logp_adv_eff")
    if s_eff:
        ax1.plot(s_eff, cov_eff, color="tab:blue", linestyle="--", label="Cov(log pi, A_eff), after STARE")
    ax1.axhline(0.0, color="black", linewidth=0.6)
    ax1.set_ylabel("covariance (nats)")
    ax1.set_title("Entropy dynamics (dH ~ -eta * Cov): > 0 lowers entropy")
    ax1.legend(fontsize=8)
    for q, label in QUADRANT_LABELS.items():
        sq, vals = _series(rows, f"stare/cov_quadrant_eff/{q}")
        if sq:
            ax2.plot(sq, vals, label=label)
    ax2.axhline(0.0, color="black", linewidth=0.6)
    ax2.set_xlabel("step")
    ax2.set_ylabel("contribution (nats)")
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(out_dir) / "entropy_dynamics.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
