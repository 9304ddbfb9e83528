"""``make compare``: STARE vs GRPO-ds on a CPU default task, several seeds each, one shared SFT checkpoint.

Each run is ``stare_verl.jobs.train`` (the CPU default of ``--family``: ``tooluse`` by default, or ``shortcot`` /
``longcot``, whose sums can be added in any order: more freedom in the answers, where plain GRPO may collapse
entropy) with the same budget; the GRPO-ds runs use the identical recipe with W = M = 1. Writes
``table.md`` / ``table.json`` (mean entropy over the first and the last quarter of steps, mean
|entropy - target|, share of steps with the gate on, final held-out accuracy greedy and at T = 1 with
``--eval-samples`` samples per problem, and pass@k at T = 1) and ``entropy_overlay.png`` (every run's entropy,
the target line) into ``runs/compare`` (tool use) or ``runs/compare-<family>`` under the working directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from stare_verl.jobs.families import DEFAULT_FAMILY, job_family, job_family_names
from stare_verl.jobs.runlog import RunFolder, step_axis

# The defaults of a comparison per family (RL steps per run, seeds per method, output folder) are the family's
# (stare_verl.jobs.families.JobFamily: compare_steps, compare_seeds, compare_dir; short CoT: 100 steps, seeds 0 1).


def run_stats(run_dir: Path) -> dict[str, Any]:
    """Per-run figures from a finished run folder (its ``metrics.jsonl`` and ``summary.json``, see
    ``stare_verl.jobs.runlog.RunFolder``).

    Entropy is ``actor/entropy`` (nats, verl's token mean over model tokens); the target is the run's
    ``stare/target_entropy``. Raises FileNotFoundError when the run did not finish.
    """
    run = RunFolder(run_dir)
    rows = run.read_metrics()
    summary = run.read_summary()
    ent = [r["actor/entropy"] for r in rows if "actor/entropy" in r]
    target = next((r["stare/target_entropy"] for r in rows if "stare/target_entropy" in r), float("nan"))
    gate = [r["stare/gate_on"] for r in rows if "stare/gate_on" in r]
    quarter = max(1, len(ent) // 4)
    first, last = ent[:quarter], ent[len(ent) - quarter :]
    after = summary.get("eval_after", {})
    before = summary.get("eval_before", {})
    t1 = after.get("T=1", {})
    passes = t1.get("pass_at_k") or {}
    k = max((int(x) for x in passes), default=None)
    return {
        "run": run.path.name,
        "method": summary["method"],
        "seed": summary["seed"],
        "steps": len(ent),
        "acc_before_greedy": before.get("T=0", {}).get("accuracy"),
        "acc_after_greedy": after.get("T=0", {}).get("accuracy"),
        "acc_after_t1": t1.get("accuracy"),
        "pass_k": k,
        "pass_at_k_after_t1": passes.get(str(k), passes.get(k)) if k is not None else None,
        "entropy_first_quarter": statistics.fmean(first) if first else float("nan"),
        "entropy_last_quarter": statistics.fmean(last) if last else float("nan"),
        "mean_abs_entropy_minus_target": statistics.fmean(abs(e - target) for e in ent)
        if ent
        else float("nan"),
        "gate_on_share": statistics.fmean(gate) if gate else float("nan"),
        "target_entropy": target,
        "entropy": ent,
        "cov_logp_adv_eff": [r["stare/cov_logp_adv_eff"] for r in rows if "stare/cov_logp_adv_eff" in r],
    }


def _fmt_mean_sd(xs: list[float | None]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{statistics.fmean(xs):.4f}" + (f" ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else "")


def write_report(stats: list[dict[str, Any]], out_dir: Path, family: str = DEFAULT_FAMILY) -> str:
    """Write table.md, table.json, entropy_overlay.png and (when the runs logged it) cov_overlay.png, the
    reweighted Cov(log pi, A) per run (titled with ``family``); returns the markdown table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = {s.get("pass_k") for s in stats} - {None}
    cols = [
        ("entropy_first_quarter", "entropy, first quarter (nats)"),
        ("entropy_last_quarter", "entropy, last quarter (nats)"),
        ("mean_abs_entropy_minus_target", "mean abs(entropy - target)"),
        ("gate_on_share", "steps with gate on"),
        ("acc_after_greedy", "held-out acc (greedy)"),
        ("acc_after_t1", "held-out acc (T=1)"),
        ("pass_at_k_after_t1", f"pass@{ks.pop() if len(ks) == 1 else 'k'} (T=1)"),
    ]
    lines = ["| method | seeds | " + " | ".join(c[1] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for method in ("stare", "grpo"):
        group = [s for s in stats if s["method"] == method]
        if not group:
            continue
        cells = [_fmt_mean_sd([s.get(k) for s in group]) for k, _ in cols]
        lines.append(f"| {method} | {len(group)} | " + " | ".join(cells) + " |")
    if stats:
        lines.append("")
        lines.append(
            f"target entropy {stats[0]['target_entropy']:.4f} nats; mean ± sd over seeds; held-out "
            "accuracy after RL (T=1: the mean over all samples, avg@k)"
        )
    lines.append("")
    lines.append("| run | steps | acc before (greedy) | " + " | ".join(c[1] for c in cols) + " |")
    lines.append("|---|---|---|" + "---|" * len(cols))
    for s in stats:
        cells = [f"{s[k]:.4f}" if s.get(k) is not None else "-" for k, _ in cols]
        before = f"{s['acc_before_greedy']:.4f}" if s["acc_before_greedy"] is not None else "-"
        lines.append(f"| {s['run']} | {s['steps']} | {before} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "table.md").write_text(table + "\n")
    (out_dir / "table.json").write_text(json.dumps(stats, indent=1))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for s in stats:
        color = "tab:blue" if s["method"] == "stare" else "tab:gray"
        ax.plot(
            range(1, len(s["entropy"]) + 1),
            s["entropy"],
            color=color,
            alpha=0.35,
            linewidth=0.8,
            label=f"{s['method']} seed {s['seed']}",
        )
    for method, color in (("stare", "tab:blue"), ("grpo", "black")):
        curves = [s["entropy"] for s in stats if s["method"] == method and s["entropy"]]
        if curves:
            n = min(len(c) for c in curves)
            mean = [statistics.fmean(c[i] for c in curves) for i in range(n)]
            ax.plot(
                range(1, n + 1), mean, color=color, linewidth=2.2, label=f"{method} mean of {len(curves)}"
            )
    if stats:
        ax.axhline(stats[0]["target_entropy"], color="red", linewidth=1, label="target")
    step_axis(ax)
    ax.set_ylabel("actor/entropy (nats)")
    ax.set_title(f"STARE vs GRPO-ds: policy entropy (CPU {family} task)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out_dir / "entropy_overlay.png", dpi=100)
    plt.close(fig)

    cov_runs = [s for s in stats if s.get("cov_logp_adv_eff")]
    if cov_runs:  # runs from before the covariance metrics existed have none
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for s in cov_runs:
            color = "tab:blue" if s["method"] == "stare" else "tab:gray"
            xs = range(1, len(s["cov_logp_adv_eff"]) + 1)
            ax.plot(
                xs,
                s["cov_logp_adv_eff"],
                color=color,
                alpha=0.5,
                linewidth=0.8,
                label=f"{s['method']} seed {s['seed']}",
            )
        ax.axhline(0.0, color="black", linewidth=0.6)
        step_axis(ax)
        ax.set_ylabel("Cov(log pi, A_eff) over model tokens (nats)")
        ax.set_title(f"Entropy dynamics: dH ~ -eta * Cov; > 0 lowers entropy (CPU {family} task)")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out_dir / "cov_overlay.png", dpi=100)
        plt.close(fig)
    return table


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (``python -m stare_verl.jobs.compare``); returns the exit status."""
    from stare_verl.jobs.procs import interrupt_on_termination
    from stare_verl.jobs.train import bad_option, train_cpu
    from stare_verl.jobs.train import build_parser as train_parser

    interrupt_on_termination()  # Ctrl-C (even when inherited as ignored), kill, a closed terminal stop the current run

    p = argparse.ArgumentParser(prog="stare-verl compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=sorted(job_family_names()), default=DEFAULT_FAMILY, help="the CPU default task")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="seeds per method (default: 0 1 for shortcot, 0 1 2 otherwise)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="RL steps per run (default: 100 for shortcot, where the entropy "
        "of GRPO-ds and STARE separate only after ~50 steps; 30 otherwise)",
    )
    p.add_argument("--n-eval", type=int, default=200)
    p.add_argument(
        "--eval-samples", type=int, default=4, help="samples per held-out problem at T = 1 (pass@k)"
    )
    p.add_argument(
        "--out", default=None, help="output folder (default runs/compare, or runs/compare-<family>)"
    )
    p.add_argument(
        "overrides", nargs="*", default=[], help="Hydra overrides for every run (the GRPO-ds runs keep W = M = 1)"
    )
    args = p.parse_args(argv)
    fam = job_family(args.family)
    if args.steps is None:
        args.steps = fam.compare_steps
    # a seed given twice would be one run counted twice in the table's mean and sd
    args.seeds = list(
        dict.fromkeys(list(fam.compare_seeds) if args.seeds is None else args.seeds)
    )
    default_out = Path("runs") / fam.compare_dir
    out = Path(args.out or default_out).resolve()

    def run_args(method: str, seed: int, run_dir: Path) -> argparse.Namespace:
        return train_parser().parse_args(
            ["--cpu", "--family", args.family, "--method", method, "--seed", str(seed),
             "--steps", str(args.steps), "--n-eval", str(args.n_eval), "--run-dir", str(run_dir),
             "--eval-samples", str(args.eval_samples), *args.overrides]
        )  # fmt: skip

    # options are checked once, up front (a finished run folder would skip the per-run check)
    problem = bad_option(run_args("stare", args.seeds[0], out / f"stare-seed{args.seeds[0]}"))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    stats = []
    for seed in args.seeds:
        for method in ("stare", "grpo"):
            run_dir = out / f"{method}-seed{seed}"
            if not RunFolder(run_dir).is_finished():
                rc = train_cpu(run_args(method, seed, run_dir))
                if rc != 0:
                    print(
                        f"error: run {run_dir.name} failed ({rc}); the comparison stops here", file=sys.stderr
                    )
                    return rc
            stats.append(run_stats(run_dir))
    print(write_report(stats, out, args.family))
    print(f"\n{out}/table.md, table.json, entropy_overlay.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
