"""Run folders: :class:`RunFolder` (the paths of ``runs/<run>/`` and its latest checkpoint), per-step
metrics.jsonl from verl's file logger, and PNG plots of a run.

**Latest checkpoint** has one meaning in this project, verl's own (``verl.utils.checkpoint.checkpoint_manager.
find_latest_ckpt_path``, what a resumed run starts from): in a verl checkpoint folder
(``trainer.default_local_dir``), the step N written in ``latest_checkpointed_iteration.txt``, provided its
``global_step_N`` folder exists (:func:`latest_checkpoint_step`). Its Hugging Face model folder
(``global_step_N/actor/huggingface`` of RL, ``global_step_N/huggingface`` of verl's SFT trainer) counts only when it
holds weights (:func:`latest_hf_checkpoint`). A different question, "which run under ``runs/`` was checkpointed
last", has its own name: :meth:`RunFolder.newest`.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# verl's checkpoint tracker (``get_checkpoint_tracker_filename``): the latest saved step, what a resume loads.
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"
RL_HF_SUBDIR = "actor/huggingface"  # a global_step_N folder's HF model (checkpoint.save_contents with hf_model)
SFT_HF_SUBDIR = "huggingface"  # the same for verl's SFT trainer
_WEIGHTS = ("*.safetensors", "*.bin")


def has_hf_weights(folder: str | Path) -> bool:
    """Whether ``folder`` is a loadable Hugging Face model folder: ``config.json`` and at least one
    ``*.safetensors`` / ``*.bin`` weight file. Never raises (a missing folder is False)."""
    d = Path(folder)
    return (d / "config.json").is_file() and any(any(d.glob(p)) for p in _WEIGHTS)


def latest_checkpoint_step(checkpoints: str | Path) -> int | None:
    """The latest checkpoint step of a verl checkpoint folder (module docstring): the N in its
    ``latest_checkpointed_iteration.txt`` when ``global_step_N`` exists; None when the tracker is missing or not
    an integer, or its step folder is gone (verl then starts from scratch). Never raises."""
    root = Path(checkpoints)
    try:
        step = int((root / CHECKPOINT_TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None
    return step if (root / f"global_step_{step}").is_dir() else None


def latest_hf_checkpoint(checkpoints: str | Path, hf_subdir: str = RL_HF_SUBDIR) -> Path | None:
    """``<checkpoints>/global_step_N/<hf_subdir>`` of the latest checkpoint (:func:`latest_checkpoint_step`)
    when it holds weights (:func:`has_hf_weights`); None otherwise (an older step is never taken instead).
    ``hf_subdir``: :data:`RL_HF_SUBDIR` (verl's PPO trainer) or :data:`SFT_HF_SUBDIR` (its SFT trainer).
    Never raises."""
    step = latest_checkpoint_step(checkpoints)
    if step is None:
        return None
    hf = Path(checkpoints) / f"global_step_{step}" / hf_subdir
    return hf if has_hf_weights(hf) else None


def hf_checkpoints(checkpoints: str | Path, hf_subdir: str = RL_HF_SUBDIR) -> list[tuple[int, Path]]:
    """Every ``<checkpoints>/global_step_N/<hf_subdir>`` that holds weights (:func:`has_hf_weights`), as
    ``(N, path)`` in increasing N, up to the latest checkpoint (:func:`latest_checkpoint_step`): a step folder
    past it (one being written when a run stopped) is not taken. ``[]`` when there is none. Never raises."""
    latest = latest_checkpoint_step(checkpoints)
    if latest is None:
        return []
    found = []
    try:
        folders = list(Path(checkpoints).glob("global_step_*"))
    except OSError:
        return []
    for d in folders:
        step = _step_of(d.name.removeprefix("global_step_"))
        if step is not None and step <= latest and has_hf_weights(d / hf_subdir):
            found.append((step, d / hf_subdir))
    return sorted(found)


def _step_of(text: str) -> int | None:
    """The step of a ``global_step_<N>`` folder as verl names it (ASCII digits, no leading zero; "05", "²" or
    "٣" are not steps); None otherwise."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


@dataclass(frozen=True)
class RunFolder:
    """The folder of one RL run (``runs/<family>-<method>-seed<seed>`` or ``RUN_DIR``), as ``stare-verl train``
    writes it and ``compare`` and the evaluation read it. Attributes are paths; nothing is created or read until
    a method says so.

    Layout: ``checkpoints/`` (verl's ``trainer.default_local_dir``: ``global_step_N/actor/huggingface`` and the
    tracker), ``logs/`` (verl's metric parts ``verl_metrics.<time>.jsonl`` and Hydra's output), ``data/``
    (train/val parquet), ``metrics.jsonl`` (the selected metrics of all parts), ``plots/``, ``eval_before.json``
    / ``eval_after.json`` (held-out evaluations; ``eval_before.json`` is reused by a resumed run),
    ``summary.json`` (written last: its presence means the run finished) and ``train.log``.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def checkpoints(self) -> Path:
        """verl's checkpoint folder of the run: ``checkpoints/``; for a folder that is itself a
        ``trainer.default_local_dir`` (its own tracker file, no ``checkpoints/``), the folder itself."""
        sub = self.path / "checkpoints"
        if not sub.is_dir() and (self.path / CHECKPOINT_TRACKER).is_file():
            return self.path
        return sub

    @property
    def logs(self) -> Path:
        """``logs/``: verl's metric parts and Hydra's run folder."""
        return self.path / "logs"

    @property
    def data(self) -> Path:
        """``data/``: the run's train/val parquet files."""
        return self.path / "data"

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``: one line per step (:func:`write_metrics_jsonl`)."""
        return self.path / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        """``summary.json``: written when the run finished."""
        return self.path / "summary.json"

    @property
    def train_log(self) -> Path:
        """``train.log``: the run's own lines, then everything verl printed."""
        return self.path / "train.log"

    @property
    def plots(self) -> Path:
        """``plots/``: :func:`plot_run`'s PNG files and ``dashboard.png`` (``stare_verl.jobs.dashboard``)."""
        return self.path / "plots"

    @property
    def eval_before(self) -> Path:
        """``eval_before.json``: the held-out evaluation before RL (kept across resumes)."""
        return self.path / "eval_before.json"

    @property
    def eval_after(self) -> Path:
        """``eval_after.json``: the held-out evaluation of the latest checkpoint after RL."""
        return self.path / "eval_after.json"

    def verl_metric_parts(self) -> list[Path]:
        """verl's file-logger parts under ``logs/``, oldest first (one per invocation of the run)."""
        return sorted(self.logs.glob("verl_metrics.*.jsonl"))

    def new_verl_metric_part(self) -> Path:
        """The path of this invocation's verl file-logger part (``logs/verl_metrics.<local time>.jsonl``; not
        created)."""
        return self.logs / f"verl_metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl"

    def checkpoint_step_dir(self, step: int) -> Path:
        """``checkpoints/global_step_<step>`` (whether or not it exists)."""
        return self.checkpoints / f"global_step_{step}"

    def latest_step(self) -> int | None:
        """The latest checkpoint step (:func:`latest_checkpoint_step` of ``checkpoints``); None: none. Never raises."""
        return latest_checkpoint_step(self.checkpoints)

    def latest_checkpoint(self) -> Path | None:
        """The HF model folder of the latest checkpoint (``checkpoints/global_step_N/actor/huggingface``) when it
        holds weights, else None (:func:`latest_hf_checkpoint`). Never raises."""
        return latest_hf_checkpoint(self.checkpoints, RL_HF_SUBDIR)

    def hf_checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, HF model folder)`` of every checkpoint with weights, oldest first (:func:`hf_checkpoints`)."""
        return hf_checkpoints(self.checkpoints, RL_HF_SUBDIR)

    def is_finished(self) -> bool:
        """Whether the run wrote its ``summary.json``."""
        return self.summary.is_file()

    def read_metrics(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` (blank lines skipped).

        Raises:
            FileNotFoundError: no ``metrics.jsonl`` (the run did not get that far); ValueError: a malformed line.
        """
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def read_summary(self) -> dict[str, Any]:
        """``summary.json`` as a dict. Raises FileNotFoundError (run not finished) or ValueError (malformed)."""
        return json.loads(self.summary.read_text())

    def write_summary(self, summary: dict[str, Any]) -> Path:
        """Write ``summary.json`` (indented JSON); returns its path. Raises OSError / TypeError (not JSON)."""
        self.summary.write_text(json.dumps(summary, indent=1))
        return self.summary

    @classmethod
    def newest(cls, runs_dir: str | Path) -> RunFolder | None:
        """The run under ``runs_dir`` (its direct subfolders) whose latest checkpoint was recorded last (the
        modification time of its tracker file; ties: the larger step, then the name); only runs with a latest
        checkpoint (:meth:`latest_step`) count, with or without HF weights. None when there is none. Never raises.
        """
        best, best_key = None, None
        try:
            children = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir())
        except OSError:
            return None
        for child in children:
            run = cls(child)
            step = run.latest_step()
            if step is None:
                continue
            try:
                mtime = (run.checkpoints / CHECKPOINT_TRACKER).stat().st_mtime
            except OSError:
                continue
            key = (mtime, step, child.name)
            if best_key is None or key > best_key:
                best, best_key = run, key
        return best

# Metric keys kept in metrics.jsonl (prefix match), in verl's naming; the entropy-control methods' prefixes (the
# shared entropy_control/ and each method's own) come from the registry, :func:`kept_prefixes`.
KEPT_PREFIXES = (
    "critic/score/",
    "critic/rewards/",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy_loss",
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

    Later files win for a repeated step (a resumed run re-logs from its checkpoint); malformed lines (bytes that
    are no UTF-8 included) are skipped, missing files too. Returns rows ``{"step": n, **metrics}`` sorted by step.
    """
    rows: dict[int, dict[str, Any]] = {}
    for path in paths:
        try:
            lines = Path(path).read_text(errors="replace").splitlines()  # a stray byte spoils its line only
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


@functools.cache
def kept_prefixes() -> tuple[str, ...]:
    """:data:`KEPT_PREFIXES` and the prefixes of the entropy-control methods' metrics
    (:func:`stare_verl.methods.metric_prefixes`; imported on first use: the registry brings torch)."""
    from stare_verl.methods import metric_prefixes

    return (*KEPT_PREFIXES, *metric_prefixes())


def shared_metric_key(rows: list[dict[str, Any]], key: str) -> str | None:
    """The name a shared quantity ``key`` (``batch_entropy``, ``target_entropy``, ``cov_logp_adv``, ...) has in
    ``rows``: ``entropy_control/<key>``, or in older runs a method's own name for it
    (:func:`stare_verl.methods.metric_names`); None when no row holds it."""
    from stare_verl.methods import metric_names

    return next((name for name in metric_names(key) if any(name in r for r in rows)), None)


def own_metric(method: str, key: str) -> str:
    """The name of the method called ``method``'s own metric ``key`` (its declared prefix, ``EntropyControl.metric_prefix``)."""
    from stare_verl.methods import get_method

    return f"{get_method(method).metric_prefix}{key}"


def select_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """Keep the step and the finite scalar metrics worth plotting/comparing (see :func:`kept_prefixes`)."""
    prefixes = kept_prefixes()
    out: dict[str, Any] = {"step": row["step"]}
    for key, value in row.items():
        if key == "step" or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if not math.isfinite(float(value)):
            continue
        if key.startswith(prefixes) or any(s in key for s in KEPT_SUBSTRINGS):
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


def _titled(ax, what: str, title: str | None) -> None:
    """Title a run plot: what it shows, then the run's title (method, seed, settings) when given."""
    ax.set_title(what if not title else f"{what}\n{title}", fontsize=10 if not title else 8)


def _curve_point(e: Any) -> tuple[int, float] | None:
    """``(step, entropy)`` of one ``by_step`` entry: an integer step >= 0 (not a boolean) and a finite number
    (not a boolean) as entropy, else None. Never raises (an integer too large for a float is None)."""
    if not isinstance(e, dict):
        return None
    step, h = e.get("step"), e.get("entropy")
    if not (isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**63):
        return None
    return (step, float(h)) if _finite(h) else None


def _finite(x: Any) -> bool:
    """Whether ``x`` is a finite int or float (not a boolean; an integer beyond a float is not). Never raises."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def heldout_curve(heldout: Any) -> tuple[list[int], list[float]]:
    """``(steps, entropies)`` of a report's ``heldout_entropy["by_step"]`` (:func:`entropy_report`; nats per model
    token, step 0 the SFT checkpoint), in increasing step with one point per step (the last entry of a step wins);
    entries that are not a step and a finite entropy are left out; empty lists when there is none or it is not a
    list. Never raises."""
    raw = heldout.get("by_step") if isinstance(heldout, dict) else None
    pts = dict(p for p in map(_curve_point, raw if isinstance(raw, list) else []) if p is not None)
    steps = sorted(pts)
    return steps, [pts[k] for k in steps]


HELDOUT_CURVE_LABEL = "held-out entropy (fixed episodes, teacher-forced)"


def plot_run(
    rows: list[dict[str, Any]], out_dir: Path, target_entropy: float | None = None, title: str | None = None,
    heldout: dict[str, Any] | None = None,
) -> list[Path]:
    """Write entropy.png (actor/entropy with the target and the steps the gate was on; with ``heldout``, the
    report's ``heldout_entropy`` (:func:`entropy_report`), also its curve over the saved checkpoints), entropy_dynamics.png
    (see :func:`plot_entropy_dynamics`), reward.png and response_length.png into ``out_dir``; returns the files
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


# The entropy report's band: a last quarter within this share of the target counts as held (the
# criterion the tool-use calibration judged a hold by).
ENTROPY_BAND = 0.25


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _accuracy(ev: dict[str, Any] | None, key: str) -> float | None:
    """``ev[key]["accuracy"]`` of a held-out evaluation (``T=0`` greedy, ``T=1``); None when missing."""
    v = (ev or {}).get(key) or {}
    return v.get("accuracy")


def is_probe_result(d: Any) -> bool:
    """Whether ``d`` has the form of ``stare_verl.jobs.demo.evaluate.reference_entropy``'s dict (finite numbers,
    not booleans, for ``entropy``, ``nll``, ``episodes`` and ``tokens``). Never raises."""
    return isinstance(d, dict) and all(_finite(d.get(k)) for k in ("entropy", "nll", "episodes", "tokens"))


def _heldout_entropy(heldout: dict[str, Any] | None) -> dict[str, Any] | None:
    """``heldout`` with ``ratio`` (after / before entropy) added and ``by_step`` kept as
    ``[{"step", "entropy", "nll", "episodes", "tokens", "ratio"}, ...]`` in increasing step, one entry per step
    (entries without an integer step >= 0 or the probe's numbers dropped; ``[]`` when none was given); None when
    either side is missing or lacks a number of ``reference_entropy``'s dict."""
    b, a = (heldout or {}).get("before"), (heldout or {}).get("after")
    if not (is_probe_result(b) and is_probe_result(a)):
        return None  # missing, or not the probe's numbers: no line rather than a failed report
    ratio = a["entropy"] / b["entropy"] if b["entropy"] > 0 else None
    raw = (heldout or {}).get("by_step")
    by_step = {}
    for e in raw if isinstance(raw, list) else []:
        point = _curve_point(e)
        if point is not None and is_probe_result(e):
            by_step[point[0]] = {**{k: e[k] for k in ("step", "entropy", "nll", "episodes", "tokens")},
                                 "ratio": e["entropy"] / b["entropy"] if b["entropy"] > 0 else None}  # fmt: skip
    return {"before": b, "after": a, "ratio": ratio, "by_step": [by_step[k] for k in sorted(by_step)]}


def _clean_rows(rows: list[Any]) -> list[dict[str, float]]:
    """The metrics rows the report can read: dicts with a numeric ``step``, each keeping only its finite numeric
    values (a null, a string that is no number, NaN or inf reads as not logged); others are skipped, so a hand-made
    or damaged ``metrics.jsonl`` gives a report of what is there rather than an error."""
    out = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        clean = {}
        for k, v in row.items():
            try:
                x = float(v)
            except (TypeError, ValueError):
                continue
            if math.isfinite(x):
                clean[k] = x
        if "step" in clean:
            out.append(clean)
    return out


def entropy_report(
    rows: list[dict[str, Any]],
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    band: float = ENTROPY_BAND,
    heldout: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a run did to its entropy (``summary.json``'s ``entropy_report``; :func:`format_entropy_report` prints it).

    ``rows``: the run's metrics rows (``metrics.jsonl``). ``before`` / ``after``: the held-out evaluations
    (``{"T=0": {"accuracy": ...}, "T=1": {...}}``), optional.
    Entropy is the gate's, ``entropy_control/batch_entropy`` (``stare/batch_entropy`` in older runs; token mean
    over model tokens; ``actor/entropy`` when a run did
    not log it), averaged over the first and the last quarter of the steps (a quarter is ``max(1, n // 4)`` steps,
    as ``make compare`` counts). ``gate_on_share``: steps with ``stare/gate_on`` over steps that logged it. L+ / L-:
    over the steps with the gate on, the mean weight applied (``stare/w`` / ``stare/m``; None for a set that
    never held a token, e.g. L- of variant C1) and the mean share of model tokens in the set; ``mean_token_weight``:
    ``stare/mean_weight`` over all steps. ``reweighting``: False when every step ran with W = M = 1 (the GRPO-ds
    twin). ``heldout_entropy``: ``heldout`` (``{"before": .., "after": ..}``, each
    ``stare_verl.jobs.demo.evaluate.reference_entropy``'s dict: the policy's entropy per model token on the same
    held-out episodes before and after RL, free of the batch-to-batch swing of the rollout entropy; optional
    ``"by_step"``: the same probe of each saved checkpoint, ``[{"step": n, **probe}, ...]``, step 0 the SFT's) with
    ``ratio`` = after / before and ``by_step`` as ``[{"step", "entropy", "nll", "episodes", "tokens", "ratio"}]``
    in increasing step; None when not measured. ``verdict``: ``held`` (last quarter within ``band`` of the
    target), ``below`` or ``above``;
    ``below_with_gate_on``: below it and the gate on in most of the last quarter's steps, the case where STARE
    reweighted but did not hold the entropy. ``message``: one plain sentence of that. Pure: reads nothing.
    """
    rows = _clean_rows(rows)
    key = shared_metric_key(rows, "batch_entropy") or "actor/entropy"
    ent_rows = [r for r in rows if key in r]
    ent = [float(r[key]) for r in ent_rows]
    tkey = shared_metric_key(rows, "target_entropy")
    target = next((float(r[tkey]) for r in rows if tkey in r), None) if tkey else None
    st = functools.partial(own_metric, "stare")  # STARE's own metrics: its gate, weights and token sets
    gate_rows = [r for r in rows if st("gate_on") in r]
    gated = [r for r in gate_rows if float(r[st("gate_on")]) > 0.5]
    quarter = max(1, len(ent) // 4)
    first, last = ent[:quarter], ent[len(ent) - quarter:]
    last_steps = {r["step"] for r in ent_rows[len(ent_rows) - quarter:]}
    last_gated = sum(1 for r in gated if r["step"] in last_steps)

    def weight(wkey: str, fkey: str) -> float | None:
        return _mean([float(r[wkey]) for r in gated if wkey in r and float(r.get(fkey, 0.0)) > 0])

    ws = [float(r[k]) for r in rows for k in (st("w"), st("m")) if k in r]
    report: dict[str, Any] = {
        "entropy_key": key,
        "target_entropy": target,
        "steps": len(ent),
        "quarter_steps": quarter if ent else 0,
        "entropy_first_quarter": _mean(first),
        "entropy_last_quarter": _mean(last),
        "last_quarter_over_target": _mean(last) / target if ent and target else None,
        "gate_on_steps": len(gated),
        "gate_steps": len(gate_rows),
        "gate_on_share": len(gated) / len(gate_rows) if gate_rows else None,
        "reweighting": any(abs(w - 1.0) > 1e-9 for w in ws),
        "l_plus_weight": weight(st("w"), st("frac_l_plus")),
        "l_plus_token_share": _mean([float(r.get(st("frac_l_plus"), 0.0)) for r in gated]),
        "l_minus_weight": weight(st("m"), st("frac_l_minus")),
        "l_minus_token_share": _mean([float(r.get(st("frac_l_minus"), 0.0)) for r in gated]),
        "mean_token_weight": _mean([float(r[st("mean_weight")]) for r in rows if st("mean_weight") in r]),
        # of the L+ / L- tokens (gated steps), the share whose surprisal exceeds their own state's entropy
        "l_plus_above_entropy": _mean([float(r[st("l_plus_above_entropy")]) for r in gated
                                       if float(r.get(st("l_plus_above_entropy"), -1.0)) >= 0]),  # fmt: skip
        "l_minus_above_entropy": _mean([float(r[st("l_minus_above_entropy")]) for r in gated
                                        if float(r.get(st("l_minus_above_entropy"), -1.0)) >= 0]),  # fmt: skip
        "acc_before": {"greedy": _accuracy(before, "T=0"), "T=1": _accuracy(before, "T=1")},
        "acc_after": {"greedy": _accuracy(after, "T=0"), "T=1": _accuracy(after, "T=1")},
        "heldout_entropy": _heldout_entropy(heldout),
    }
    ratio = report["last_quarter_over_target"]
    if ratio is None:
        report.update(verdict=None, below_with_gate_on=False, message="no entropy or target logged")
        return report
    verdict = "held" if abs(ratio - 1.0) <= band else ("below" if ratio < 1.0 else "above")
    report["verdict"] = verdict
    report["below_with_gate_on"] = verdict == "below" and last_gated * 2 > quarter
    where = (
        f"last-quarter entropy {report['entropy_last_quarter']:.4f} = {ratio:.2f} x the target {target:g} "
        f"(first quarter {report['entropy_first_quarter']:.4f}), gate on in {len(gated)} of {len(gate_rows)} steps"
    )
    if not report["reweighting"]:
        message = f"{where}; no reweighting (W = M = 1, the GRPO-ds twin): the gate only marks entropy < target"
    elif verdict == "held":
        message = f"entropy held (within {band:.0%} of the target): {where}"
    elif report["below_with_gate_on"]:
        message = (
            f"ENTROPY NOT HELD: {where}, {last_gated} of the last {quarter}. STARE reweighted (L+ weight "
            f"{report['l_plus_weight']:.2f}) but the entropy ended {1 - ratio:.0%} below the target: the "
            "reweighting is too weak for this model, or the target is above where the model can stay"
        )
    elif verdict == "below":
        message = f"entropy below the target, gate mostly off at the end: {where}"
    else:
        message = f"entropy above the target (the gate stays off there): {where}"
    report["message"] = message
    return report


def _set_weight(name: str, weight: float | None, share: float | None) -> str:
    """``L+ 3.00 (2.1% of model tokens)``, or ``L- untouched`` for a set that never held a token (O1's L-)."""
    if weight is None and not share:
        return f"{name} untouched"
    w = "-" if weight is None else format(weight, ".2f")
    return f"{name} {w} ({'-' if share is None else format(share, '.1%')} of model tokens)"


def format_entropy_report(report: dict[str, Any]) -> list[str]:
    """The console lines of an :func:`entropy_report`: the entropy against the target, the gate, L+ / L-, the
    held-out accuracies, then the report's message."""

    def f(x: float | None, spec: str = ".3f") -> str:
        return "-" if x is None else format(x, spec)

    r = report
    lines = [
        f"entropy ({r['entropy_key']}): first quarter {f(r['entropy_first_quarter'], '.4f')}, last quarter "
        f"{f(r['entropy_last_quarter'], '.4f')} vs target {f(r['target_entropy'], 'g')} "
        f"({f(r['last_quarter_over_target'], '.2f')} x); gate on in {r['gate_on_steps']} of {r['gate_steps']} steps",
        f"weights with the gate on: {_set_weight('L+', r['l_plus_weight'], r['l_plus_token_share'])}, "
        f"{_set_weight('L-', r['l_minus_weight'], r['l_minus_token_share'])}; mean token weight over all steps "
        f"{f(r['mean_token_weight'], '.4f')}",
    ]
    if r.get("l_plus_above_entropy") is not None:
        lines.append(
            f"L+ tokens whose surprisal exceeds their state's entropy (amplifying them surely raises it): "
            f"{f(r['l_plus_above_entropy'], '.0%')}"
            + ("" if r.get("l_minus_above_entropy") is None else
               f"; L- tokens above theirs: {f(r['l_minus_above_entropy'], '.0%')}")
        )
    b, a = r["acc_before"], r["acc_after"]
    if any(v is not None for v in (*b.values(), *a.values())):
        lines.append(
            f"held-out accuracy: greedy {f(b['greedy'])} -> {f(a['greedy'])}, T = 1 {f(b['T=1'])} -> {f(a['T=1'])}"
        )
    h = r.get("heldout_entropy")
    if h:
        lines.append(
            f"held-out entropy (teacher-forced on {h['before']['episodes']} held-out demonstrations, "
            f"{h['before']['tokens']} model tokens): {h['before']['entropy']:.4f} -> {h['after']['entropy']:.4f} "
            f"({f(h['ratio'], '.2f')} x); their NLL {h['before']['nll']:.4f} -> {h['after']['nll']:.4f}"
        )
        if len(h.get("by_step") or []) > 2:  # more than before and after: the curve, x the SFT's
            lines.append("held-out entropy by step (x the SFT's): " + ", ".join(
                f"{e['step']} {f(e['ratio'], '.2f')}" for e in h["by_step"]))
    lines.append(r["message"])
    return lines
