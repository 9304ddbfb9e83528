"""``make compare``: entropy-control methods side by side on a CPU default task, several seeds each, one shared SFT
checkpoint, the same data order and step budget for every method.

Each run is ``stare_verl.jobs.train`` (the CPU default of ``--family``: ``tooluse`` by default, or ``shortcot`` /
``longcot``) with ``--method <name>[:key=value,...]`` (``stare_verl.methods``: grpo, stare, entropy_bonus,
adaptive_entropy, clip_cov, kl_cov, forking, entropy_adv, repo_r; the default is STARE against its GRPO-ds twin). Same
seed = same SFT checkpoint, same training data order and same rollout seed for every method. Writes ``table.md``
/ ``table.json`` (per method, mean +- sd over seeds: entropy over the first and last quarter of steps and their
ratio, mean |entropy - target| for methods with a target, the forking-token entropy, Cov(log pi, A) after the
method's change, the PPO clip fraction, held-out greedy accuracy, avg@k and pass@k at T = 1, response length,
seconds per step; then one row per run), ``entropy_overlay.png`` (every run's entropy, each method's mean, the
target line), ``accuracy_overlay.png`` (training accuracy per method, held-out accuracies marked) and, when the runs
logged them, ``heldout_entropy_overlay.png`` (the held-out entropy of every saved checkpoint, free of the batches'
swing) and ``cov_overlay.png`` into ``runs/compare`` (tool use) or ``runs/compare-<family>``.

``--mini-batches N`` runs the off-policy regime (N updates per rollout batch: the importance ratio leaves 1, so the
clip-based methods can act); the default is one update per batch (on-policy), where they can barely act.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stare_verl.jobs.families import DEFAULT_FAMILY, job_family
from stare_verl.jobs.runlog import RunFolder, heldout_curve, own_metric, shared_metric_key, step_axis
from stare_verl.jobs.train.options import settings_differ

if TYPE_CHECKING:
    from stare_verl.jobs.train import TrainOptions

# The defaults of a comparison per family (RL steps per run, seeds per method, output folder) are the family's
# (stare_verl.jobs.families.JobFamily: compare_steps, compare_seeds, compare_dir; short CoT: 100 steps, seeds 0 1).


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return statistics.fmean(vals) if vals else None


def run_stats(run_dir: Path, pass_k: int | None = None) -> dict[str, Any]:
    """Per-run figures from a finished run folder (its ``metrics.jsonl`` and ``summary.json``, see
    ``stare_verl.jobs.runlog.RunFolder``).

    ``pass_k``: the k of the reported pass@k at T = 1 (the comparison's ``--eval-samples``), so a run evaluated with
    more samples (a folder reused from another comparison) is reported at the same k as the others (its pass@k
    estimate from n > k samples is unbiased); None, or a k the run lacks, reports its largest k.

    Entropy is ``actor/entropy`` (nats, verl's token mean over model tokens, the same aggregation for every
    method); the target is the run's ``entropy_control/target_entropy`` (in older runs a method's own name for it,
    :func:`stare_verl.jobs.runlog.shared_metric_key`);
    ``has_target`` says whether the method itself steers toward it (STARE, the adaptive coefficient). Raises
    FileNotFoundError when the run did not finish.
    """
    from stare_verl.methods import recorded_method

    run = RunFolder(run_dir)
    rows = run.read_metrics()
    summary = run.read_summary()
    ent = [r["actor/entropy"] for r in rows if "actor/entropy" in r]
    tkey = shared_metric_key(rows, "target_entropy")
    target = next((r[tkey] for r in rows if tkey in r), float("nan")) if tkey else float("nan")
    gate_key = own_metric("stare", "gate_on")
    gate = [r[gate_key] for r in rows if gate_key in r]
    quarter = max(1, len(ent) // 4)
    first, last = ent[:quarter], ent[len(ent) - quarter :]
    after = summary.get("eval_after", {})
    before = summary.get("eval_before", {})
    t1 = after.get("T=1", {})
    passes = t1.get("pass_at_k") or {}
    k = max((int(x) for x in passes), default=None)
    if pass_k is not None and (str(pass_k) in passes or pass_k in passes):
        k = pass_k
    method = summary["method"]
    recorded = recorded_method(method)
    has_target = recorded is not None and recorded.target_key is not None
    e_first = statistics.fmean(first) if first else float("nan")
    e_last = statistics.fmean(last) if last else float("nan")
    report = summary.get("entropy_report")
    heldout = report.get("heldout_entropy") if isinstance(report, dict) else None
    heldout = heldout if isinstance(heldout, dict) else {}  # a damaged summary reads as not measured
    after_probe = heldout.get("after") if isinstance(heldout.get("after"), dict) else {}
    cov_key = shared_metric_key(rows, "cov_logp_adv_eff")
    return {
        "run": run.path.name,
        "method": method,
        "seed": summary["seed"],
        "steps": len(ent),
        "acc_before_greedy": before.get("T=0", {}).get("accuracy"),
        "acc_after_greedy": after.get("T=0", {}).get("accuracy"),
        "acc_after_t1": t1.get("accuracy"),
        "pass_k": k,
        "pass_at_k_after_t1": passes.get(str(k), passes.get(k)) if k is not None else None,
        "pass_at_k_curve": {str(kk): v for kk, v in passes.items()},
        "entropy_first_quarter": e_first,
        "entropy_last_quarter": e_last,
        "entropy_ratio_last_first": e_last / e_first if first and e_first > 0 else float("nan"),
        "mean_abs_entropy_minus_target": statistics.fmean(abs(e - target) for e in ent)
        if ent and has_target
        else None,
        "has_target": has_target,
        "heldout_entropy_after": after_probe.get("entropy"),
        "heldout_entropy_ratio": heldout.get("ratio"),
        "heldout_curve": _heldout_points(heldout, len(ent)),
        "gate_on_share": statistics.fmean(gate) if gate else float("nan"),
        "target_entropy": target,
        "forking_entropy": _mean(rows, "entropy_control/forking_entropy"),
        "cov_logp_adv_mean": _mean(rows, cov_key) if cov_key else None,
        "pg_clipfrac": _mean(rows, "actor/pg_clipfrac"),
        "response_length": _mean(rows, "response_length/mean"),
        "seconds_per_step": _median([r.get("timing_s/step") for r in rows]),
        "entropy": ent,
        "train_acc": [r.get("reward/acc/mean", r.get("critic/score/mean")) for r in rows],
        "cov_logp_adv_eff": [r[cov_key] for r in rows if cov_key in r],
    }


def _baseline_text(g: Any) -> str:
    norm = "GRPO (divided by the group std)" if g.norm_adv_by_std_in_grpo else "Dr.GRPO (not divided by the group std)"
    return f"{norm}, epsilon {g.epsilon:g}, zero_variance_tol {g.zero_variance_tol:g}"


def baseline_mismatch(runs: list[TrainOptions]) -> str | None:
    """Why the methods of ``runs`` (one run's options per method) cannot be compared: each method's run config (its
    family's CPU recipe composed with the overrides it launches with, ``EntropyControl.compose_overrides``) gives
    the GRPO group baseline its advantages start from (``stare_verl.methods.group_config_of``: std normalisation,
    epsilon, zero-variance tolerance); a comparison of methods whose baselines differ would measure the baselines,
    so a message naming each method's baseline is returned; None when all are equal. A method whose config does not
    compose is left to the run's own check.

    Raises:
        stare_verl.methods.MethodConfigError: a boolean key (``norm_adv_by_std_in_grpo``) that holds no boolean.
    """
    from stare_verl.jobs.recipes import compose_recipe
    from stare_verl.methods import group_config_of

    baselines = {}
    for opts in runs:
        method = opts.entropy_method
        launch, _ = method.compose_overrides(list(opts.overrides))
        try:
            cfg = compose_recipe(f"cpu/{opts.job_family.cpu_recipe}_{method.recipe}", launch, resolve=False)
        except Exception:  # noqa: BLE001 - a bad override is the run's own check's to report
            continue
        baselines[opts.method] = group_config_of(cfg.algorithm)
    if len(set(baselines.values())) <= 1:
        return None
    each = "; ".join(f"{m}: {_baseline_text(g)}" for m, g in baselines.items())
    return (f"the methods' GRPO baselines differ ({each}): the comparison would measure the baselines, not the "
            "methods. Give every method the same one (e.g. the override algorithm.norm_adv_by_std_in_grpo=true or "
            "false for all, and no method setting of its own such as stare:norm_adv_by_std_in_grpo=...)")


def reuse_mismatch(summary: dict[str, Any], steps: int, n_eval: int, eval_samples: int,
                   settings: dict[str, Any] | None = None) -> str | None:
    """Why a finished run (its ``summary.json``) cannot stand in a comparison of ``steps`` RL steps evaluated on
    ``n_eval`` held-out problems with ``eval_samples`` samples at T = 1, its run trained with ``settings``
    (:meth:`~stare_verl.jobs.train.options.TrainOptions.run_settings`: the method, seed, model, Hydra overrides, so
    ``--lr`` and ``--mini-batches`` too): other steps, another number of problems, fewer samples (more are fine:
    pass@k is reported at the comparison's k), or other settings (each one that differs is named); None when it can.
    A run without held-out evaluations (a run from ``MODEL``) is checked on its steps only; what a summary does not
    say (a run from before ``settings`` was recorded) is not checked."""
    why = []
    if settings is not None:
        why += settings_differ(summary.get("settings"), settings)
    if "steps" in summary and summary["steps"] != steps:
        why.append(f"{summary.get('steps')} steps, not {steps}")
    after = summary.get("eval_after") if isinstance(summary.get("eval_after"), dict) else {}
    greedy, sampled = after.get("T=0"), after.get("T=1")
    if isinstance(greedy, dict) and "n" in greedy and greedy["n"] != n_eval:
        why.append(f"{greedy['n']} held-out problems, not {n_eval}")
    spp = sampled.get("samples_per_problem") if isinstance(sampled, dict) else None
    if isinstance(spp, int) and spp < eval_samples:
        why.append(f"{spp} samples per problem, fewer than {eval_samples}")
    return "; ".join(why) or None


def _heldout_points(heldout: dict[str, Any], steps: int) -> list[list[float]]:
    """``[[step, entropy], ...]`` of a run's held-out entropy: its curve (``by_step``), or, for a run from before the
    curve, its SFT value at step 0 and its value after RL at its last step ``steps``; ``[]`` when not measured."""
    xs, ys = heldout_curve(heldout)
    if len(xs) < 2 and steps > 0:
        b, a = (heldout.get(k) if isinstance(heldout.get(k), dict) else {} for k in ("before", "after"))
        xs, ys = heldout_curve({"by_step": [{**b, "step": 0}, {**a, "step": steps}]})
    return [[x, y] for x, y in zip(xs, ys, strict=True)]


def _finite_or_null(value: Any) -> Any:
    """``value`` with every NaN / inf float replaced by None (JSON's null), in nested lists and dicts: a run without
    a metric (a method without STARE's gate) is NaN in the statistics, which strict JSON readers refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def _median(xs: list) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def _fmt_mean_sd(xs: list[float | None]) -> str:
    xs = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]  # NaN: the run has no value
    if not xs:
        return "-"
    return f"{statistics.fmean(xs):.4f}" + (f" ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else "")


TABLE_COLUMNS = [
    ("entropy_first_quarter", "entropy, first quarter (nats)"),
    ("entropy_last_quarter", "entropy, last quarter (nats)"),
    ("entropy_ratio_last_first", "last / first"),
    ("mean_abs_entropy_minus_target", "mean abs(H - target)"),
    ("heldout_entropy_after", "held-out entropy after (nats)"),
    ("heldout_entropy_ratio", "held-out entropy after / before"),
    ("forking_entropy", "forking-token entropy"),
    ("cov_logp_adv_mean", "Cov(log pi, A)"),
    ("gate_on_share", "steps with gate on"),
    ("pg_clipfrac", "clip fraction"),
    ("acc_after_greedy", "held-out acc (greedy)"),
    ("acc_after_t1", "avg@k (T=1)"),
    ("pass_at_k_after_t1", "pass@k (T=1)"),
    ("response_length", "response length"),
    ("seconds_per_step", "s / step"),
]
"""(key in :func:`run_stats`, column title) of the tables, per method and per run."""


def _methods_in_order(stats: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(s["method"] for s in stats))


def _colors(methods: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {m: ("black" if m == "grpo" else cmap(i % 10)) for i, m in enumerate(methods)}


def write_report(stats: list[dict[str, Any]], out_dir: Path, family: str = DEFAULT_FAMILY, regime: str = "") -> str:
    """Write table.md, table.json, entropy_overlay.png, accuracy_overlay.png and, when the runs logged them,
    heldout_entropy_overlay.png and cov_overlay.png (titled with ``family`` and ``regime``); returns the markdown
    table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = {s.get("pass_k") for s in stats} - {None}
    k_title = f"{ks.pop()}" if len(ks) == 1 else "k"
    cols = [(k, t.replace("pass@k", f"pass@{k_title}").replace("avg@k", f"avg@{k_title}")) for k, t in TABLE_COLUMNS]
    methods = _methods_in_order(stats)
    lines = ["| method | seeds | " + " | ".join(c[1] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for method in methods:
        group = [s for s in stats if s["method"] == method]
        cells = [_fmt_mean_sd([s.get(k) for s in group]) for k, _ in cols]
        lines.append(f"| {method} | {len(group)} | " + " | ".join(cells) + " |")
    if stats:
        lines.append("")
        lines.append(
            f"target entropy {stats[0]['target_entropy']:.4f} nats; mean ± sd over seeds; held-out "
            "accuracy after RL (T=1: the mean over all samples, avg@k); Cov(log pi, A): the run's mean after the "
            "method's change; mean abs(H - target) only for methods that steer toward the target; held-out "
            "entropy: per model token, teacher-forced on the held-out problems' demonstrations (the same episodes "
            "for every run and for the SFT checkpoint, so free of the rollout batches' swing)"
            + (f"; {regime}" if regime else "")
        )
    lines.append("")
    lines.append("| run | steps | acc before (greedy) | " + " | ".join(c[1] for c in cols) + " |")
    lines.append("|---|---|---|" + "---|" * len(cols))
    for s in stats:
        cells = [f"{s[k]:.4f}" if isinstance(s.get(k), (int, float)) and math.isfinite(s[k]) else "-" for k, _ in cols]
        before = f"{s['acc_before_greedy']:.4f}" if s["acc_before_greedy"] is not None else "-"
        lines.append(f"| {s['run']} | {s['steps']} | {before} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "table.md").write_text(table + "\n")
    (out_dir / "table.json").write_text(json.dumps(_finite_or_null(stats), indent=1, allow_nan=False))
    colors = _colors(methods)
    where = f"CPU {family} task" + (f", {regime}" if regime else "")

    def overlay(key: str, ylabel: str, title: str, name: str, smooth: int = 1, marks: str | None = None) -> None:
        fig, ax = plt.subplots(figsize=(9, 5))
        for s in stats:
            ys = [y for y in s[key] if y is not None]
            ax.plot(range(1, len(ys) + 1), _rolling(ys, smooth), color=colors[s["method"]], alpha=0.3, linewidth=0.8)
        for method in methods:
            curves = [[y for y in s[key] if y is not None] for s in stats if s["method"] == method]
            curves = [c for c in curves if c]
            if curves:
                n = min(len(c) for c in curves)
                mean = [statistics.fmean(c[i] for c in curves) for i in range(n)]
                ax.plot(range(1, n + 1), _rolling(mean, smooth), color=colors[method], linewidth=2.2,
                        label=f"{method} (mean of {len(curves)})")  # fmt: skip
                if marks:
                    accs = [s[marks] for s in stats if s["method"] == method and s.get(marks) is not None]
                    if accs:
                        ax.scatter([n + 1], [statistics.fmean(accs)], color=colors[method], marker="D", zorder=3)
        if key == "entropy" and stats and math.isfinite(stats[0]["target_entropy"]):
            ax.axhline(stats[0]["target_entropy"], color="red", linewidth=1, linestyle="--", label="target")
        if key == "cov_logp_adv_eff":
            ax.axhline(0.0, color="black", linewidth=0.6)
        step_axis(ax)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} ({where})")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=100)
        plt.close(fig)

    overlay("entropy", "actor/entropy (nats, model tokens)", "Policy entropy per method", "entropy_overlay.png")
    overlay("train_acc", "training accuracy (rolling mean of 5 steps)",
            "Accuracy per method; diamonds: held-out greedy after RL", "accuracy_overlay.png", smooth=5,
            marks="acc_after_greedy")  # fmt: skip
    for name in ("heldout_entropy_overlay.png", "cov_overlay.png"):  # an earlier comparison's plot in this folder
        (out_dir / name).unlink(missing_ok=True)
    if any(len(s.get("heldout_curve") or []) > 2 for s in stats):  # runs that read more than before and after
        _heldout_overlay(stats, methods, colors, out_dir / "heldout_entropy_overlay.png", where)
    if any(s.get("cov_logp_adv_eff") for s in stats):  # runs from before the covariance metrics existed have none
        overlay("cov_logp_adv_eff", "Cov(log pi, A_eff) over model tokens",
                "Entropy dynamics: dH ~ -eta * Cov; > 0 lowers entropy", "cov_overlay.png")  # fmt: skip
    return table


def _heldout_overlay(stats: list[dict[str, Any]], methods: list[str], colors: dict[str, Any], path: Path,
                     where: str) -> None:  # fmt: skip
    """``heldout_entropy_overlay.png``: each run's held-out entropy at its saved checkpoints (thin) and each
    method's mean over the runs at the steps they all read (thick), the runs' SFT value at step 0 and the target."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for method in methods:
        curves = [dict(s["heldout_curve"]) for s in stats if s["method"] == method and s.get("heldout_curve")]
        for c in curves:
            ax.plot(list(c), list(c.values()), color=colors[method], alpha=0.3, linewidth=0.8, marker=".")
        common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if common:
            ax.plot(common, [statistics.fmean(c[k] for c in curves) for k in common], color=colors[method],
                    linewidth=2.2, marker="s", label=f"{method} (mean of {len(curves)})")  # fmt: skip
    if stats and math.isfinite(stats[0]["target_entropy"]):
        ax.axhline(stats[0]["target_entropy"], color="red", linewidth=1, linestyle="--", label="target")
    step_axis(ax)
    ax.set_ylabel("held-out entropy (nats per model token)")
    head = textwrap.fill(f"Held-out entropy per method ({where})", 95)
    ax.set_title(f"{head}\nfixed episodes, teacher-forced; step 0: the SFT checkpoint; runs from before the curve: "
                 "2 points", fontsize=10)  # fmt: skip
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _same_runs(methods: list[str], runs: list[TrainOptions]) -> str | None:
    """Two ``--methods`` that are one run (the same method and settings given, so the same run folder: ``stare`` and
    ``stare:``, ``stare:reweight_w=1.1`` and ``stare:reweight_w=1.10``), as one line naming them; None when there are
    none (the second would reuse the first's finished run as its own)."""
    seen: dict[str, str] = {}
    for method, opts in zip(methods, runs, strict=True):
        label = opts.entropy_method.label
        if label in seen:
            return (f"--methods {seen[label]} and {method} are one run (method {label}, the same settings): give "
                    "each method once")  # fmt: skip
        seen[label] = method
    return None


def _recipe_problem(runs: list[TrainOptions]) -> str | None:
    """The first run of ``runs`` (one per method) whose recipe with the overrides would stop it at launch (an
    impossible value such as ``data.max_response_length=0``, a key the recipe does not have: the check of
    ``stare-verl train``, :func:`stare_verl.jobs.train.cpu.tiny_recipe_problem`), as one line; None when all pass.
    Checked up front: a finished run folder skips its run's own check, and a problem of one method's run would
    otherwise show only after the runs before it."""
    from stare_verl.jobs.backend import GpuProbe, choose_backend
    from stare_verl.jobs.train.cpu import tiny_recipe_problem

    backend = choose_backend(GpuProbe(gpu=False, name=None, sglang=False), force_cpu=True)  # compare's runs: --cpu
    with contextlib.redirect_stdout(io.StringIO()):  # verl's notes of a valid config: each run prints its own
        return next(filter(None, (tiny_recipe_problem(opts, backend) for opts in runs)), None)


def _dry_run(runs: list[TrainOptions], family: str, steps: int, n_eval: int, eval_samples: int) -> int:
    """``compare --dry-run``: each run's plan (:func:`stare_verl.jobs.train.dry_run`: the composed config, the
    ``main_ppo`` command, validated as verl would at launch), or, for a finished run folder, whether it is reused;
    nothing is trained, written or launched. Returns 0, or 2 when a run's plan or a finished folder would stop the
    comparison."""
    from stare_verl.jobs.backend import probe_gpu
    from stare_verl.jobs.train import dry_run

    probe = probe_gpu()
    rc = 0
    for i, opts in enumerate(runs, 1):
        run_dir = Path(opts.run_dir)
        print(f"[compare] dry run {i}/{len(runs)}: {run_dir.name} (stare-verl train {' '.join(opts.to_argv())})",
              flush=True)  # fmt: skip
        if RunFolder(run_dir).is_finished():
            other = reuse_mismatch(RunFolder(run_dir).read_summary(), steps, n_eval, eval_samples,
                                   opts.run_settings())
            if other:
                print(f"error: {run_dir} holds a finished run of other settings ({other})", file=sys.stderr)
                rc = 2
            else:
                print(f"[compare] {run_dir} is finished: reused, not run again", flush=True)
            continue
        rc = max(rc, dry_run(opts, probe))
    print(f"[compare] dry run of {len(runs)} {family} runs: nothing was trained, written or launched", flush=True)
    return rc


def _rolling(ys: list[float], n: int) -> list[float]:
    if n <= 1:
        return list(ys)
    return [statistics.fmean(ys[max(0, i - n + 1) : i + 1]) for i in range(len(ys))]


LR_MAX = 1.0
"""The largest ``--lr`` (AdamW's learning rate; above 1 is a typo, not a schedule)."""
COMPARE_FLAGS = {"seed": "--seeds", "method": "--methods"}
"""compare's flags of the run options it sets per run (for the errors of :meth:`TrainOptions.parse`)."""


def build_parser() -> argparse.ArgumentParser:
    """``stare-verl compare``'s parser (the family and the ``--sft-*`` options are :class:`TrainOptions` fields);
    parse it with :func:`stare_verl.jobs.train.options.parse_command_line`, which ends ``--methods`` and
    ``--seeds`` at the first Hydra override."""
    from stare_verl.jobs.train import SFT_SHARED_OPTIONS, TrainOptions, add_options
    from stare_verl.jobs.train.options import option_range

    p = argparse.ArgumentParser(prog="stare-verl compare", description=__doc__.split("\n\n")[0])
    add_options(p, TrainOptions, ["family"])
    p.add_argument(
        "--methods", nargs="+", action="extend", default=None, metavar="METHOD[:KEY=VALUE,...]",
        help="the methods to compare (default: stare grpo); a setting after a colon, e.g. entropy_bonus:coef=0.01; "
             "each once (two spellings of one run, as stare:reweight_w=1.1 and stare:reweight_w=1.10, are an error)",
    )  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", action="extend", default=None, metavar="SEED",
                   help="seeds per method (default: 0 1 for shortcot, 0 1 2 otherwise; each once; "
                        f"{option_range('seed')})")  # fmt: skip
    p.add_argument("--steps", type=int, default=None,
                   help="RL steps per run (default: 100 for shortcot, where the entropy of GRPO-ds and STARE separate "
                        f"only after ~50 steps; 30 otherwise; {option_range('steps')})")  # fmt: skip
    p.add_argument("--n-eval", type=int, default=200,
                   help=f"held-out problems evaluated before and after RL (default 200; {option_range('n_eval')})")
    p.add_argument("--eval-samples", type=int, default=4,
                   help=f"samples per held-out problem at T = 1 (pass@k up to this k; default 4; "
                        f"{option_range('eval_samples')})")  # fmt: skip
    p.add_argument(
        "--mini-batches", type=int, default=1, choices=(1, 2, 4, 8),
        help="actor updates per rollout batch, a divisor of the 8 prompts of a step (1: on-policy, the importance "
             "ratio is 1; 2-8: off-policy)",
    )  # fmt: skip
    p.add_argument("--lr", type=float, default=None,
                   help=f"actor learning rate for every run, in (0, {LR_MAX:g}] (default: the recipe's)")
    p.add_argument("--out", default=None, help="output folder (default runs/compare, or runs/compare-<family>)")
    p.add_argument("--dry-run", action="store_true",
                   help="check every run's options and print each run's plan (as stare-verl train --dry-run: the "
                        "composed config, the main_ppo command, validated as verl would at launch), then stop: "
                        "nothing is trained, written or launched")  # fmt: skip
    add_options(p, TrainOptions, SFT_SHARED_OPTIONS)
    p.add_argument(
        "overrides", nargs="*", default=[],
        help="Hydra overrides for every run (the GRPO-ds twin keeps W = M = 1); also after --methods / --seeds",
    )  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (``python -m stare_verl.jobs.compare``); returns the exit status: 2 for options that
    cannot run (one ``error: ...`` line), a run's own status when it fails, 130 for a stop before a run's RL."""
    import tempfile

    from stare_verl.jobs.backend import stderr_to
    from stare_verl.jobs.procs import interrupt_on_termination
    from stare_verl.jobs.train import (
        INTERRUPTED,
        SFT_SHARED_OPTIONS,
        OptionsError,
        TrainOptions,
        bad_option,
        stopped_before_rl,
    )
    from stare_verl.jobs.train import cpu as tiny_run  # its train_cpu looked up per run (a test's stand-in)
    from stare_verl.jobs.train.options import parse_command_line

    interrupt_on_termination()  # Ctrl-C (even when inherited as ignored), kill, a closed terminal stop the current run

    args = parse_command_line(build_parser(), argv)
    shared = {k: v for k, v in vars(args).items() if k in ("family", *SFT_SHARED_OPTIONS)}  # the options given
    fam = job_family(shared.get("family", DEFAULT_FAMILY))
    steps = fam.compare_steps if args.steps is None else args.steps
    # a seed or method given twice would be one run counted twice in the table's mean and sd: refused, as two
    # spellings of one run are (_same_runs), not silently dropped
    for flag, given in (("--seeds", args.seeds), ("--methods", args.methods)):
        twice = [str(x) for x in dict.fromkeys(x for x in given or [] if given.count(x) > 1)]
        if twice:
            print(f"error: {flag} {' '.join(twice)} given twice: give each once", file=sys.stderr)
            return 2
    seeds = list(fam.compare_seeds) if args.seeds is None else list(args.seeds)
    methods = list(args.methods or ["stare", "grpo"])
    if args.lr is not None and not (math.isfinite(args.lr) and 0 < args.lr <= LR_MAX):
        print(f"error: --lr must be in (0, {LR_MAX:g}] (got {args.lr:g})", file=sys.stderr)
        return 2
    regime_overrides = []
    regime = "on-policy (one update per batch)"
    if args.mini_batches > 1:
        # 8 prompts x 8 samples per step (the tiny recipes): each mini-batch is 64 / N sequences, which verl's
        # update must split into whole micro-batches, so the micro-batch is the whole mini-batch
        regime_overrides += [f"actor_rollout_ref.actor.ppo_mini_batch_size={8 // args.mini_batches}",
                             f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={64 // args.mini_batches}"]
        regime = f"off-policy ({args.mini_batches} updates per batch)"
    if args.lr is not None:
        regime_overrides.append(f"actor_rollout_ref.actor.optim.lr={args.lr}")
        regime += f", lr {args.lr:g}"
    out = Path(args.out or Path("runs") / fam.compare_dir).resolve()

    def run_options(method: str, seed: int) -> TrainOptions:
        """One run's options: the CPU default of the family, its folder ``<method label>-seed<seed>`` under out."""
        opts = TrainOptions.parse({**shared, "cpu": True, "method": method, "seed": seed, "steps": steps,
                                   "n_eval": args.n_eval, "eval_samples": args.eval_samples,
                                   "overrides": [*regime_overrides, *args.overrides]}, COMPARE_FLAGS)  # fmt: skip
        return opts.model_copy(update={"run_dir": str(out / f"{opts.entropy_method.label}-seed{seed}")})

    # every run's options are checked once, up front (a finished run folder would skip the run's own check); verl's
    # import-time warnings (optional engines, the accelerator probe) are not the console's, as in train
    try:
        with tempfile.TemporaryFile() as noise, stderr_to(noise):
            runs = [run_options(method, seed) for seed in seeds for method in methods]
            problem = (_same_runs(methods, runs[: len(methods)]) or next(filter(None, map(bad_option, runs[: len(methods)])), None)
                       or _recipe_problem(runs[: len(methods)]) or baseline_mismatch(runs[: len(methods)]))  # fmt: skip
    except (OptionsError, ValueError) as err:  # ValueError: a boolean key that holds no boolean
        problem = str(err)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(runs, fam.name, steps, args.n_eval, args.eval_samples)
    print(f"[compare] {fam.name}: {', '.join(methods)} x seeds {seeds}, {steps} steps each, {regime}",
          flush=True)  # fmt: skip
    stats = []
    for opts in runs:
        run_dir = Path(opts.run_dir)
        if not RunFolder(run_dir).is_finished():
            try:
                rc = tiny_run.train_cpu(opts)
            except KeyboardInterrupt as exc:  # before the run's RL (its SFT, its evaluation): one line, 130
                print(stopped_before_rl(f"compare {run_dir.name}", exc) + "; finished runs are kept",
                      file=sys.stderr)  # fmt: skip
                return INTERRUPTED
            if rc != 0:
                print(f"error: run {run_dir.name} failed ({rc}); the comparison stops here", file=sys.stderr)
                return rc
        other = reuse_mismatch(RunFolder(run_dir).read_summary(), steps, args.n_eval, args.eval_samples,
                               opts.run_settings())
        if other:  # a finished folder of another comparison: never reported as if it were this one's
            print(f"error: {run_dir} holds a finished run of other settings ({other}); use another --out, or "
                  "delete that folder to run it again", file=sys.stderr)  # fmt: skip
            return 2
        stats.append(run_stats(run_dir, pass_k=args.eval_samples))
    print(write_report(stats, out, fam.name, regime))
    extra = [n for n in ("heldout_entropy_overlay.png", "cov_overlay.png") if (out / n).is_file()]
    print(f"\n{out}/table.md, table.json, entropy_overlay.png, accuracy_overlay.png" + "".join(f", {n}" for n in extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
