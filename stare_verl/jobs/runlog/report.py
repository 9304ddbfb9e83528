"""The end-of-run entropy report (:func:`entropy_report`, printed by :func:`format_entropy_report`): what a run did
to its entropy against the target, the gate, the reweighted token sets, the held-out accuracies and the held-out
entropy probe (:func:`heldout_curve` reads its curve over the saved checkpoints).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from stare_verl.jobs.runlog.metrics import own_metric, shared_metric_key


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


# The entropy report's band: a last quarter within this share of the target counts as held (the
# criterion the tool-use calibration judged a hold by).
ENTROPY_BAND = 0.25
# Below this many steps a quarter is one or two steps: the report says the run is too short to read a trend from.
SHORT_RUN_STEPS = 8


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
        f"(first quarter {report['entropy_first_quarter']:.4f})"
    ) + (f", gate on in {len(gated)} of {len(gate_rows)} steps" if gate_rows else "")
    if not gate_rows:  # another method than STARE and its twin: it logs no STARE gate
        message = f"{where}; no STARE gate logged (another entropy control: its own metrics are under its prefix)"
    elif not report["reweighting"]:
        message = f"{where}; no reweighting (W = M = 1, the GRPO-ds twin): the gate only marks entropy < target"
    elif verdict == "held" and not gated:  # near the target, but STARE never acted: nothing it held
        message = f"entropy within {band:.0%} of the target with the gate never on (nothing reweighted): {where}"
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
    if len(ent) < SHORT_RUN_STEPS:
        message += f" ({len(ent)} steps: too few to read a trend from)"
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
        f"({f(r['last_quarter_over_target'], '.2f')} x)"
        + (f"; gate on in {r['gate_on_steps']} of {r['gate_steps']} steps" if r["gate_steps"] else ""),
    ]
    if r["gate_steps"]:  # STARE or its twin: the gate's weights (another method logs none)
        lines.append(
            f"weights with the gate on: {_set_weight('L+', r['l_plus_weight'], r['l_plus_token_share'])}, "
            f"{_set_weight('L-', r['l_minus_weight'], r['l_minus_token_share'])}; mean token weight over all steps "
            f"{f(r['mean_token_weight'], '.4f')}"
        )
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
