"""Run folders and what a run leaves in them, one module each; every name below is importable from here.

- :mod:`~stare_verl.jobs.runlog.folder`: :class:`RunFolder` (the paths of ``runs/<run>/``) and the one meaning of
  "latest checkpoint" (verl's own: :func:`latest_checkpoint_step`, :func:`latest_hf_checkpoint`).
- :mod:`~stare_verl.jobs.runlog.metrics`: per-step metrics from verl's file logger (:func:`read_verl_jsonl`), the
  ones kept in ``metrics.jsonl`` (:func:`select_metrics`), the methods' metric names (:func:`shared_metric_key`).
- :mod:`~stare_verl.jobs.runlog.report`: the end-of-run entropy report (:func:`entropy_report`).
- :mod:`~stare_verl.jobs.runlog.plots`: the PNG plots of a run (:func:`plot_run`).
"""

from __future__ import annotations

from stare_verl.jobs.runlog.folder import (
    CHECKPOINT_TRACKER,
    RL_HF_SUBDIR,
    SFT_HF_SUBDIR,
    RunFolder,
    has_hf_weights,
    hf_checkpoints,
    latest_checkpoint_step,
    latest_hf_checkpoint,
)
from stare_verl.jobs.runlog.metrics import (
    KEPT_PREFIXES,
    KEPT_SUBSTRINGS,
    kept_prefixes,
    own_metric,
    read_verl_jsonl,
    select_metrics,
    shared_metric_key,
    write_metrics_jsonl,
)
from stare_verl.jobs.runlog.plots import (
    HELDOUT_CURVE_LABEL,
    QUADRANT_LABELS,
    plot_entropy_dynamics,
    plot_run,
    step_axis,
)
from stare_verl.jobs.runlog.report import (
    ENTROPY_BAND,
    entropy_report,
    format_entropy_report,
    heldout_curve,
    is_probe_result,
)

__all__ = [
    "CHECKPOINT_TRACKER",
    "ENTROPY_BAND",
    "HELDOUT_CURVE_LABEL",
    "KEPT_PREFIXES",
    "KEPT_SUBSTRINGS",
    "QUADRANT_LABELS",
    "RL_HF_SUBDIR",
    "SFT_HF_SUBDIR",
    "RunFolder",
    "entropy_report",
    "format_entropy_report",
    "has_hf_weights",
    "heldout_curve",
    "hf_checkpoints",
    "is_probe_result",
    "kept_prefixes",
    "latest_checkpoint_step",
    "latest_hf_checkpoint",
    "own_metric",
    "plot_entropy_dynamics",
    "plot_run",
    "read_verl_jsonl",
    "select_metrics",
    "shared_metric_key",
    "step_axis",
    "write_metrics_jsonl",
]
