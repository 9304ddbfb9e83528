"""PNG plots of a run (:func:`plot_run`): policy entropy against the target, entropy dynamics, reward and response
length over the steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stare_verl.jobs.runlog.metrics import own_metric, shared_metric_key
from stare_verl.jobs.runlog.report import heldout_curve


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in rows if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def _titled(ax, what: str, title: str | None) -> None:
    """Title a run plot: what it shows, then the run's title (method, seed, settings) when given."""
    ax.set_title(what if not title else f"{what}\n{title}", fontsize=10 if not title else 8)


HELDOUT_CURVE_LABEL = "held-out entropy (fixed episodes, teacher-forced)"


def plot_run(
    rows: list[dict[str, Any]], out_dir: Path, target_entropy: float | None = None, title: str | None = None,
    heldout: dict[str, Any] | None = None,
) -> list[Path]:
    """Write entropy.png (actor/entropy with the target and the steps the gate was on; with ``heldout``, the
    report's ``heldout_entropy`` (:func:`stare_verl.jobs.runlog.report.entropy_report`), also its curve over the
    saved checkpoints), entropy_dynamics.png (see :func:`plot_entropy_dynamics`), reward.png and response_length.png into ``out_dir``; returns the files
    written (a plot without data is skipped). ``title``: the run's (``stare_verl.jobs.dashboard.run_title``:
    method, seed, key settings), under each plot's own title."""
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
        ent_key = shared_metric_key(rows, "batch_entropy")
        s2, model_ent = _series(rows, ent_key) if ent_key else ([], [])
        if s2:
            ax.plot(s2, model_ent, linestyle="--", label=f"{ent_key} (model tokens)")
        hs, hv = heldout_curve(heldout)
        if hs:
            ax.plot(hs, hv, marker="s", color="black", linewidth=1.8, label=HELDOUT_CURVE_LABEL)
        if target_entropy is None:
            tgt_key = shared_metric_key(rows, "target_entropy")
            _, tgt = _series(rows, tgt_key) if tgt_key else ([], [])
            target_entropy = tgt[-1] if tgt else None
        if target_entropy is not None:
            ax.axhline(target_entropy, color="red", linewidth=1, label=f"target {target_entropy:g}")
        gs, gate = _series(rows, own_metric("stare", "gate_on"))
        for s, g in zip(gs, gate, strict=True):
            if g > 0.5:
                ax.axvspan(s - 0.5, s + 0.5, color="orange", alpha=0.15, linewidth=0)
        if any(g > 0.5 for g in gate):
            ax.plot([], [], color="orange", alpha=0.3, linewidth=6, label="gate on")
        step_axis(ax)
        ax.set_ylabel("entropy (nats)")
        ax.legend(fontsize=8)
        _titled(ax, "Policy entropy", title)
        fig.tight_layout()
        written.append(out_dir / "entropy.png")
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)

    written.extend(plot_entropy_dynamics(rows, out_dir, title))

    for key, name, ylabel, what in (
        ("critic/score/mean", "reward.png", "reward (mean per response)", "Reward"),
        ("response_length/mean", "response_length.png", "response length (tokens)", "Response length"),
    ):
        steps, vals = _series(rows, key)
        if not steps:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(steps, vals, marker=".")
        step_axis(ax)
        ax.set_ylabel(ylabel)
        _titled(ax, what, title)
        fig.tight_layout()
        written.append(out_dir / name)
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written


def step_axis(ax) -> None:
    """Label a matplotlib axis "step" and put its ticks on whole steps only (a 5-step run would show 0.5, 1.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


QUADRANT_LABELS = {
    "pos_high": "A>0, surprisal > H",
    "pos_low": "A>0, surprisal <= H",
    "neg_high": "A<0, surprisal > H",
    "neg_low": "A<0, surprisal <= H",
    "zero_adv": "A=0",
}


def plot_entropy_dynamics(rows: list[dict[str, Any]], out_dir: Path, title: str | None = None) -> list[Path]:
    """Write entropy_dynamics.png: per step, Cov(log pi, A) over model tokens before
    (``entropy_control/cov_logp_adv``; older runs ``stare/...``) and after the method
    (``entropy_control/cov_logp_adv_eff``), and the token classes' contributions to the covariance after it
    (``entropy_control/cov_quadrant_eff/*``). First-order theory (Cui et al. 2025, arXiv 2505.22617) gives
    dH ~ -eta * Cov(log pi, A): a positive covariance drives entropy down. ``title``: the run's, under the plot's
    own (as :func:`plot_run`).

    Returns ``[path]``, or ``[]`` when the rows carry no covariance metric (runs from before they existed)."""
    cov_key = shared_metric_key(rows, "cov_logp_adv")
    steps, cov = _series(rows, cov_key) if cov_key else ([], [])
    if not steps:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax1.plot(steps, cov, color="gray", label="Cov(log pi, A), GRPO advantage")
    eff_key = shared_metric_key(rows, "cov_logp_adv_eff")
    s_eff, cov_eff = _series(rows, eff_key) if eff_key else ([], [])
    if s_eff:
        ax1.plot(s_eff, cov_eff, color="tab:blue", linestyle="--", label="Cov(log pi, A_eff), after the method")
    ax1.axhline(0.0, color="black", linewidth=0.6)
    ax1.set_ylabel("covariance (nats)")
    _titled(ax1, "Entropy dynamics (dH ~ -eta * Cov): > 0 lowers entropy", title)
    ax1.legend(fontsize=8)
    for q, label in QUADRANT_LABELS.items():
        q_key = shared_metric_key(rows, f"cov_quadrant_eff/{q}")
        sq, vals = _series(rows, q_key) if q_key else ([], [])
        if sq:
            ax2.plot(sq, vals, label=label)
    ax2.axhline(0.0, color="black", linewidth=0.6)
    step_axis(ax2)
    ax2.set_ylabel("contribution (nats)")
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(out_dir) / "entropy_dynamics.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
