"""``stare-verl plot``: a run's dashboard, one PNG of its training curves, from any verl file-logger output.

Input (:func:`load_run`): one of our run folders (:class:`~stare_verl.jobs.runlog.RunFolder`: its verl metric parts
``logs/verl_metrics.*.jsonl``, else ``metrics.jsonl``; ``summary.json``, ``eval_before.json`` / ``eval_after.json``
and Hydra's ``logs/hydra/.hydra/config.yaml`` when present), or a single JSONL file: verl's ``FileLogger`` lines
(``{"step": n, "data": {...}}``, what ``trainer.logger=[file]`` writes on any machine) or our ``metrics.jsonl``
rows (``{"step": n, <metric>: value, ...}``).

Panels (:func:`draw_dashboard`), each from the metrics a verl run logs, drawn as "not logged" when a run lacks them:
the policy entropy (nats) with the target entropy and the steps STARE's gate was on (and, from the summary's
``entropy_report``, the held-out entropy of each saved checkpoint); reward and training accuracy
with the held-out evaluations before and after RL; the response length; the tool calls and tool errors per response
(tool-use runs only: skipped when none is logged); Cov(log pi, A) before and after the method's change of the
advantages (:mod:`stare_verl.methods.metrics`).
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare_verl.jobs.runlog import (
    HELDOUT_CURVE_LABEL,
    RunFolder,
    heldout_curve,
    own_metric,
    read_verl_jsonl,
    shared_metric_key,
    step_axis,
)

DASHBOARD_NAME = "dashboard.png"

# Metric names. The shared quantities every method logs (entropy_control/*, older runs under a method's own prefix)
# are looked up by their key in the registry (stare_verl.methods.metric_names), first found wins.
ENTROPY = "actor/entropy"
MODEL_ENTROPY = "batch_entropy"
TARGET = "target_entropy"
SCORE = "critic/score/mean"
ACC = "reward/acc/mean"
LENGTH, LENGTH_MAX = "response_length/mean", "response_length/max"
COV = "cov_logp_adv"
COV_EFF = "cov_logp_adv_eff"
# The tool-use reward's per-episode statistics (envs.tool_use.task.TOOL_STAT_KEYS) as the trainer logs them
# (stare_verl.trainer.reward_extra_metric: reward/<key>/mean), with their legend labels.
TOOL_METRICS = (
    ("reward/num_tool_calls/mean", "tool calls"),
    ("reward/num_tool_executed/mean", "executed"),
    ("reward/num_tool_errors/mean", "tool errors (malformed + exceptions + timeouts)"),
)

PANEL_ENTROPY = "Policy entropy"
PANEL_REWARD = "Reward and accuracy"
PANEL_LENGTH = "Response length"
PANEL_TOOLS = "Tool calls per response"
PANEL_COV = "Entropy dynamics: Cov(log pi, A)"

COV_CAPTION = (
    "Cov(log pi, A): token-level covariance of the old log-prob and the advantage over model tokens (tool output "
    "excluded). First order, dH ~ -eta * Cov, so a positive value lowers the entropy. before = the advantages of "
    "the baseline estimator (GRPO), after = what the method sends to the loss; the two coincide on steps where the "
    "method changes nothing (e.g. STARE with its gate off) and throughout for methods that act in the loss, not on "
    "the advantages (entropy bonus, Clip-Cov, KL-Cov)."
)


class NoMetricsError(ValueError):
    """The path holds no per-step metrics (no line with a ``step`` and numeric values)."""


@dataclass(frozen=True)
class RunData:
    """What :func:`load_run` read: the metric ``rows`` (``{"step": n, <metric>: value}``, sorted by step), the run's
    ``summary`` (``summary.json``, or the evaluation files of an unfinished run; ``{}`` for a bare file), the
    method's ``settings`` (its ``algorithm.<method>`` section of Hydra's config; ``{}`` when unknown), the
    ``source`` read and ``out_dir``, the default folder of the dashboard (the run's ``plots/``)."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    settings: dict[str, Any]
    source: Path
    out_dir: Path


@dataclass(frozen=True)
class Dashboard:
    """What :func:`draw_dashboard` drew: the PNG ``path``, the figure's ``title``, the titles of the ``panels``
    drawn with data (in order) and of those ``not_logged`` (drawn saying so); ``skipped``: panels left out."""

    path: Path
    title: str
    panels: list[str] = field(default_factory=list)
    not_logged: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------- reading
def read_metric_rows(path: str | Path) -> list[dict[str, Any]]:
    """The per-step rows of one JSONL file: verl ``FileLogger`` lines (:func:`~stare_verl.jobs.runlog.
    read_verl_jsonl`) or, when it has none, flat ``metrics.jsonl`` rows; a repeated step merges (later lines win).
    Only numeric metric values are kept (bools and strings are dropped); malformed lines are skipped.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when missing).
    """
    path = Path(path)
    text = path.read_text(errors="replace")
    rows = read_verl_jsonl([path])
    if not rows:
        merged: dict[int, dict[str, Any]] = {}
        for line in text.splitlines():
            try:
                rec = json.loads(line)
                step = int(rec["step"])
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(rec, dict):
                merged.setdefault(step, {}).update(rec)
        rows = [{**merged[s], "step": s} for s in sorted(merged)]
    out = []
    for row in rows:
        metrics = {k: v for k, v in row.items() if k != "step" and _number(v) is not None}
        if metrics:
            out.append({"step": row["step"], **metrics})
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def method_settings(run: RunFolder, summary: dict[str, Any]) -> dict[str, Any]:
    """The settings of the method named in ``summary`` (its spec, e.g. ``entropy_bonus:coef=0.01``): its
    ``algorithm.<name>`` section of the run's Hydra config (``logs/hydra/.hydra/config.yaml``) when there is one,
    else the settings the spec gives explicitly (``coef=0.01``; the others may be the recipe's, not the method's
    defaults, so none is claimed). ``{}`` for a run without a known method. Never raises."""
    from stare_verl.methods import recorded_method

    method = recorded_method(summary.get("method"))
    if method is None:  # no method recorded, or an old or unknown one: no settings shown
        return {}
    try:
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(run.logs / "hydra" / ".hydra" / "config.yaml")
        # resolved against the whole config: a target that follows STARE's (${algorithm.stare.target_entropy}) shows
        # its value, not the interpolation
        section = OmegaConf.to_container(cfg.algorithm[method.name], resolve=True)
        if isinstance(section, dict):
            try:  # typed as the method reads it (YAML may keep 1e-06 as a string)
                return type(method).parse(section).model_dump()
            except Exception:  # noqa: BLE001 - a section of an older config: as written
                return section
    except Exception:  # noqa: BLE001 - no such section (a method that sets verl keys) or no Hydra config
        pass
    return method.config.model_dump(include=method.config.model_fields_set)


def load_run(path: str | Path) -> RunData:
    """Read a run folder or a metrics JSONL file for :func:`draw_dashboard` (module docstring).

    A run folder's rows come from its verl metric parts (the source, current while the run is going) and, when it
    has none, from ``metrics.jsonl``; its ``summary.json`` (or ``eval_before.json`` / ``eval_after.json`` of an
    unfinished run) and method settings are read when present. A file inside a run folder (its ``metrics.jsonl``
    or a ``logs/`` part) uses that run's summary and ``plots/``; a bare file, ``plots/`` next to it.

    Raises:
        FileNotFoundError: ``path`` does not exist. NoMetricsError: it holds no per-step metrics (a folder with
        neither metric file, an empty file, a file of other JSON or text).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    if path.is_dir():
        run = RunFolder(path)
        sources = run.verl_metric_parts()
        rows = read_verl_jsonl(sources)
        if not rows and run.metrics.is_file():
            sources, rows = [run.metrics], read_metric_rows(run.metrics)
        rows = [r for r in rows if len(r) > 1]
        if not rows:
            raise NoMetricsError(
                f"{path} holds no metrics (no logs/verl_metrics.*.jsonl or metrics.jsonl with a step); give a run "
                "folder or a verl file-logger JSONL"
            )
        source = sources[-1] if len(sources) == 1 else run.logs
    else:
        try:
            rows = read_metric_rows(path)
        except OSError as err:
            raise NoMetricsError(f"cannot read {path}: {err.strerror or err}") from None
        if not rows:
            raise NoMetricsError(
                f"{path} holds no metrics (no JSON line with a step and numeric values, as verl's file logger "
                "writes them)"
            )
        parent = path.parent
        home = parent.parent if parent.name == "logs" else parent
        looks_like_run = (home / "summary.json").is_file() or (home / "metrics.jsonl").is_file()
        run = RunFolder(home if looks_like_run else parent)
        source = path
    summary = _json(run.summary)
    for key, file in (("eval_before", run.eval_before), ("eval_after", run.eval_after)):
        if not summary.get(key) and _json(file):  # an unfinished run's evaluations
            summary[key] = _json(file)
    return RunData(rows, summary, method_settings(run, summary), source, run.plots)


# --------------------------------------------------------------------------------------------------- titles
def _names(key: str) -> tuple[str, ...]:
    from stare_verl.methods import metric_names

    return metric_names(key)


def _series(rows: list[dict[str, Any]], key: str | None) -> tuple[list[int], list[float]]:
    if key is None:
        return [], []
    pts = [(r["step"], float(r[key])) for r in rows if key in r and math.isfinite(float(r[key]))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"


FEW_SETTINGS = 4
"""A method with at most this many settings has all of them in the title; one with more, those off its defaults."""


def run_title(
    rows: list[dict[str, Any]],
    summary: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    name: str | None = None,
) -> str:
    """The title of a run's plots, two lines: the method, seed and family (``summary``: ``method``, ``seed``,
    ``family``; a run without one says what the metrics tell: "method not recorded" and ``name``), the steps; then
    the key settings: the method's settings (``settings``, e.g. its ``algorithm.<method>`` section; unset ones
    left out, and when a known method has more than :data:`FEW_SETTINGS`, those at its defaults), the target entropy the metrics logged (nats) and,
    when no settings are given, what the method's own metrics tell of its settings (``title_metrics``: STARE's
    weights W / M from ``stare/w`` / ``stare/m``, a range when they moved; every method's for an unknown one).
    Pure: reads nothing."""
    from stare_verl.methods import recorded_method

    summary = summary or {}
    spec = summary.get("method")
    method = recorded_method(spec)  # None for an old spelling: shown as written
    head = [method.name if method is not None else spec if isinstance(spec, str) else "method not recorded"]
    if summary.get("seed") is not None:
        head.append(f"seed {summary['seed']}")
    if summary.get("family"):
        head.append(str(summary["family"]))
    if not isinstance(spec, str) and name:
        head.append(name)
    steps = [r["step"] for r in rows]
    if steps:
        head.append(f"steps {min(steps)}-{max(steps)}")
    parts = []
    given = {k: v for k, v in (settings or {}).items() if v is not None}
    if method is not None and len(given) > FEW_SETTINGS:
        defaults = type(method.config)().model_dump()
        shown = {k: v for k, v in given.items() if defaults.get(k, object()) != v}
        parts.append(", ".join([*(f"{k}={_fmt(v)}" for k, v in shown.items()),
                                "others at defaults" if shown else "settings at defaults"]))  # fmt: skip
    elif given:
        parts.append(", ".join(f"{k}={_fmt(v)}" for k, v in given.items()))
    _, target = _series(rows, shared_metric_key(rows, TARGET))
    if target:
        parts.append(f"target H {_span(target)} nats")
    if not settings:  # what the metrics tell of the method's settings
        from stare_verl.methods import METHODS

        told = []
        for cls in [type(method)] if method is not None else METHODS.values():
            for label, key in cls.title_metrics.items():
                _, v = _series(rows, f"{cls.metric_prefix}{key}")
                told += [f"{label} {_span(v)}"] if v else []
        if told:
            parts.append(", ".join(told))
    return ", ".join(head) + ("\n" + "; ".join(parts) if parts else "")


# --------------------------------------------------------------------------------------------------- drawing
def _not_logged(ax, title: str, keys: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, f"not logged\n({keys})", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _entropy_panel(ax, rows: list[dict[str, Any]], summary: dict[str, Any] | None = None) -> bool:
    steps, ent = _series(rows, ENTROPY)
    model_key = shared_metric_key(rows, MODEL_ENTROPY)
    s2, model_ent = _series(rows, model_key)
    if not steps and not s2:
        _not_logged(ax, PANEL_ENTROPY, ENTROPY)
        return False
    if steps:
        ax.plot(steps, ent, marker=".", label="actor/entropy (all response tokens)")
    if s2:
        ax.plot(s2, model_ent, linestyle="--", label="model tokens only")
    report = (summary or {}).get("entropy_report")
    hs, hv = heldout_curve(report.get("heldout_entropy") if isinstance(report, dict) else None)
    if hs:
        ax.plot(hs, hv, marker="s", color="black", linewidth=1.8, label=HELDOUT_CURVE_LABEL)
    ts, target = _series(rows, shared_metric_key(rows, TARGET))
    if target and min(target) == max(target):
        ax.axhline(target[0], color="red", linewidth=1, label=f"target {target[0]:g}")
    elif target:
        ax.plot(ts, target, color="red", linewidth=1, drawstyle="steps-mid", label="target")
    gs, gate = _series(rows, own_metric("stare", "gate_on"))
    for s, g in zip(gs, gate, strict=True):
        if g > 0.5:
            ax.axvspan(s - 0.5, s + 0.5, color="orange", alpha=0.15, linewidth=0)
    if any(g > 0.5 for g in gate):
        ax.plot([], [], color="orange", alpha=0.3, linewidth=6, label="gate on (entropy < target)")
    ax.set_ylabel("entropy (nats)")
    ax.set_title(PANEL_ENTROPY, fontsize=10)
    ax.legend(fontsize=7)
    step_axis(ax)
    return True


def _accuracy(ev: Any, key: str) -> float | None:
    v = (ev or {}).get(key) if isinstance(ev, dict) else None
    acc = v.get("accuracy") if isinstance(v, dict) else None
    return _number(acc)


def _reward_panel(ax, rows: list[dict[str, Any]], summary: dict[str, Any]) -> bool:
    steps, score = _series(rows, SCORE)
    s2, acc = _series(rows, ACC)
    if not steps and not s2:
        _not_logged(ax, PANEL_REWARD, f"{SCORE}, {ACC}")
        return False
    if steps:
        ax.plot(steps, score, marker=".", label="reward (mean score)")
    if s2:
        ax.plot(s2, acc, linestyle="--", label="training accuracy")
    all_steps = steps + s2
    first, last = min(all_steps), max(all_steps)
    for key, marker, label in (("T=0", "o", "held-out greedy"), ("T=1", "s", "held-out T = 1")):
        before, after = _accuracy(summary.get("eval_before"), key), _accuracy(summary.get("eval_after"), key)
        xs = [x for x, v in ((first - 1, before), (last, after)) if v is not None]
        ys = [v for v in (before, after) if v is not None]
        if ys:
            arrow = " -> ".join("-" if v is None else f"{v:.3f}" for v in (before, after))
            ax.plot(xs, ys, marker=marker, linestyle="none", markersize=7, label=f"{label} ({arrow})")
    ax.set_ylabel("reward / accuracy")
    ax.set_title(PANEL_REWARD + (" (held-out: before RL at step 0, after at the end)" if any(
        _accuracy(summary.get(k), t) is not None for k in ("eval_before", "eval_after") for t in ("T=0", "T=1")
    ) else ""), fontsize=10)  # fmt: skip
    ax.legend(fontsize=7)
    step_axis(ax)
    return True


def _length_panel(ax, rows: list[dict[str, Any]]) -> bool:
    steps, mean = _series(rows, LENGTH)
    if not steps:
        _not_logged(ax, PANEL_LENGTH, LENGTH)
        return False
    ax.plot(steps, mean, marker=".", label="mean")
    s2, mx = _series(rows, LENGTH_MAX)
    if s2:
        ax.plot(s2, mx, linestyle=":", color="gray", label="max")
    ax.set_ylabel("response length (tokens)")
    ax.set_title(PANEL_LENGTH, fontsize=10)
    ax.legend(fontsize=7)
    step_axis(ax)
    return True


def _tool_panel(ax, rows: list[dict[str, Any]]) -> None:
    for key, label in TOOL_METRICS:
        steps, vals = _series(rows, key)
        if steps:
            ax.plot(steps, vals, marker=".", label=label)
    ax.set_ylabel("per response (step mean)")
    ax.set_title(PANEL_TOOLS, fontsize=10)
    ax.legend(fontsize=7)
    step_axis(ax)


def _cov_panel(ax, rows: list[dict[str, Any]]) -> bool:
    steps, cov = _series(rows, shared_metric_key(rows, COV))
    s2, eff = _series(rows, shared_metric_key(rows, COV_EFF))
    if not steps and not s2:
        _not_logged(ax, PANEL_COV, ", ".join(_names(COV)))
        return False
    if steps:
        ax.plot(steps, cov, color="gray", marker=".", label="before (baseline advantages)")
    if s2:
        ax.plot(s2, eff, color="tab:blue", linestyle="--", label="after (what the loss receives)")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_ylabel("Cov(log pi, A) (nats x adv.)")
    ax.set_title(PANEL_COV + ": > 0 lowers entropy", fontsize=10)
    ax.legend(fontsize=7)
    step_axis(ax)
    return True


def draw_dashboard(
    rows: list[dict[str, Any]],
    out_path: str | Path,
    summary: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    name: str | None = None,
) -> Dashboard:
    """Draw the dashboard of one run (module docstring) into ``out_path`` (a PNG; its folder is created).

    Args:
        rows: the run's per-step metrics (``{"step": n, <metric>: value}``; entropies and covariances in nats,
            lengths in tokens, tool counts per response).
        summary: the run's ``summary.json`` (``method``, ``seed``, ``family``, ``eval_before`` / ``eval_after``:
            ``{"T=0": {"accuracy": ...}, "T=1": {...}}``); optional.
        settings: the method's settings for the title (:func:`run_title`); ``name``: what a run without a summary
            is called there (e.g. its file name).

    Returns:
        the :class:`Dashboard`: path, title, the panels drawn with data and those drawn as "not logged"; the tool
        panel is skipped when no tool metric is logged (a run without tools).

    Raises:
        NoMetricsError: ``rows`` has no step with a metric. OSError: the PNG cannot be written.
    """
    if not any(len(r) > 1 for r in rows):
        raise NoMetricsError("no per-step metrics to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summary or {}
    title = run_title(rows, summary, settings, name)
    has_tools = any(k in r for r in rows for k, _ in TOOL_METRICS)
    top = [PANEL_ENTROPY, PANEL_REWARD, PANEL_LENGTH] + ([PANEL_TOOLS] if has_tools else [])
    per_row = 3 if len(top) == 3 else 2  # one row of three, or two rows of two; the covariance below, full width
    n_rows = math.ceil(len(top) / per_row) + 1
    fig = plt.figure(figsize=(13, 3.6 * n_rows + 1.0))
    grid = fig.add_gridspec(n_rows, 6)  # 6 columns: a panel spans 6 / per_row of them
    span = 6 // per_row
    axes = [fig.add_subplot(grid[i // per_row, (i % per_row) * span:(i % per_row + 1) * span]) for i in range(len(top))]
    drawn, missing = [], []
    for ax, panel in zip(axes, top, strict=True):
        if panel == PANEL_ENTROPY:
            ok = _entropy_panel(ax, rows, summary)
        elif panel == PANEL_REWARD:
            ok = _reward_panel(ax, rows, summary)
        elif panel == PANEL_LENGTH:
            ok = _length_panel(ax, rows)
        else:
            _tool_panel(ax, rows)
            ok = True
        (drawn if ok else missing).append(panel)
    cov_ax = fig.add_subplot(grid[n_rows - 1, :])
    (drawn if _cov_panel(cov_ax, rows) else missing).append(PANEL_COV)
    fig.suptitle(title, fontsize=11)
    fig.text(0.5, 0.005, textwrap.fill(COV_CAPTION, 170), ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=90)
    finally:
        plt.close(fig)
    return Dashboard(path, title, drawn, missing, [] if has_tools else [PANEL_TOOLS])


def plot_path(path: str | Path, out: str | Path | None = None) -> Dashboard:
    """``stare-verl plot PATH [--out DIR]``: :func:`load_run` of ``path``, then :func:`draw_dashboard` into
    ``DIR/dashboard.png`` (default: the run's ``plots/``). Raises what those raise."""
    data = load_run(path)
    out_dir = Path(out).expanduser() if out is not None else data.out_dir
    name = None if data.summary.get("method") else data.source.name
    return draw_dashboard(data.rows, out_dir / DASHBOARD_NAME, data.summary, data.settings, name)
