"""Per-step metrics of a run: verl's ``FileLogger`` lines read back (:func:`read_verl_jsonl`), the metrics worth
keeping (:func:`select_metrics`, written to ``metrics.jsonl`` by :func:`write_metrics_jsonl`), and the names the
entropy-control methods log their metrics under (:func:`shared_metric_key`, :func:`own_metric`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
