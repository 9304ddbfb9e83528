"""Summary of an evaluation: avg@k, pass@k, lengths, reflection tokens, tool statistics; table and JSON.

``summarize(records, ks)`` groups the per-sample records (``runner.RECORD_KEYS``) by ``data_source`` and
over all rows ("all"), each (problem_id, sample_index) once (``metrics.unique_records``: the first). Per group:

    problems, samples           counts; ``k`` is the most samples any problem has
    avg@k                       mean over problems of the share of correct samples (metrics.avg_at_k)
    pass@k                      {k: mean unbiased pass@k over problems with >= k samples} (metrics.pass_at_k),
                                rates only; when some problems have fewer than k samples (failed or resumed
                                requests) the mean covers only the others (see pass@k_problems)
    pass@k_problems             {k: problems with >= k samples}, for every k asked for (0: no problem has k
                                samples, so pass@k has no value for that k)
    mean_tokens                 model-generated tokens per sample (usage.completion_tokens; None if unknown)
    mean_chars                  characters of the scored response per sample
    truncated_rate, answer_rate share of samples cut by the length limit / with an extracted answer
    unverified                  samples the answer checker gave no verdict (``verdict: "unverified"``: its time
                                ran out or it failed); they count as wrong in avg@k and pass@k, as in training,
                                and are scored again when the evaluation resumes
    unverified_why              {verify_method: samples} of those (timeout, error)
    reflections                 {word: mean count per sample} of envs.scoring.reflection (+ "total")
    tools                       {mean_calls, mean_executed, error_rate (errors per call), malformed_rate,
                                 timeouts, samples_with_calls (share), mean_turns, accuracy_with_calls,
                                 accuracy_without_calls}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from stare_verl.jobs.evaluation.metrics import aggregate_problems, default_ks, mean_pass_at_k, unique_records

__all__ = ["format_table", "partial_pass_at", "summarize", "unverified_notes", "write_summary"]


def _group(records: Sequence[Mapping[str, Any]], ks: Sequence[int] | None) -> dict[str, Any]:
    k_max = max((p.n for p in aggregate_problems(records, [])), default=0)
    ks = list(ks) if ks else default_ks(k_max)
    problems = aggregate_problems(records, ks)
    pass_at, pass_at_problems = {}, {}
    for k in ks:
        val, n_prob = mean_pass_at_k(problems, k)
        pass_at_problems[str(k)] = n_prob  # 0 when no problem has k samples (no value, and a warning)
        if val is not None:
            pass_at[str(k)] = val
    toks = [r.get("tokens") for r in records]
    refl_keys = sorted({k for r in records for k in (r.get("reflections") or {})})
    calls = sum(int(r.get("tool_calls") or 0) for r in records)
    with_calls = [r for r in records if int(r.get("tool_calls") or 0) > 0]
    without = [r for r in records if int(r.get("tool_calls") or 0) == 0]
    unverified = [r for r in records if r.get("verdict") == "unverified"]
    why: dict[str, int] = {}
    for r in unverified:
        key = str(r.get("verify_method") or "unknown")
        why[key] = why.get(key, 0) + 1
    return {
        "problems": len(problems),
        "samples": len(records),
        "k": k_max,
        "min_samples_per_problem": min((p.n for p in problems), default=0),
        "avg@k": fmean(p.avg for p in problems) if problems else None,
        "pass@k": pass_at,
        "pass@k_problems": pass_at_problems,
        "mean_tokens": fmean(toks) if toks and all(t is not None for t in toks) else None,
        "mean_chars": fmean(int(r.get("chars") or 0) for r in records) if records else None,
        "truncated_rate": fmean(bool(r.get("truncated")) for r in records) if records else None,
        "answer_rate": fmean(bool(r.get("has_answer")) for r in records) if records else None,
        "unverified": len(unverified),
        "unverified_why": dict(sorted(why.items())),
        "reflections": {k: fmean(int((r.get("reflections") or {}).get(k, 0)) for r in records) for k in refl_keys},
        "tools": {
            "mean_calls": calls / len(records) if records else 0.0,
            "mean_executed": fmean(int(r.get("tool_executed") or 0) for r in records) if records else 0.0,
            "error_rate": sum(int(r.get("tool_errors") or 0) for r in records) / calls if calls else 0.0,
            "malformed_rate": sum(int(r.get("malformed_calls") or 0) for r in records) / calls if calls else 0.0,
            "timeouts": sum(int(r.get("tool_timeouts") or 0) for r in records),
            "samples_with_calls": len(with_calls) / len(records) if records else 0.0,
            "mean_turns": fmean(int(r.get("turns") or 0) for r in records) if records else 0.0,
            "accuracy_with_calls": fmean(bool(r["correct"]) for r in with_calls) if with_calls else None,
            "accuracy_without_calls": fmean(bool(r["correct"]) for r in without) if without else None,
        },
    }


def summarize(
    records: Sequence[Mapping[str, Any]], ks: Sequence[int] | None = None, meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Summary dict (module docstring) per data source and for "all".

    Args:
        records: per-sample records (at least ``problem_id``, ``sample_index``, ``correct``); a repeated
            (problem_id, sample_index) counts once everywhere (``metrics.unique_records``: the first).
        ks: the k of pass@k (default: powers of two up to the samples per problem, and that number).
        meta: copied under "settings" (model, data, sampling).
    Returns:
        ``{"settings": ..., "groups": {source: stats, ..., "all": stats}}``.
    """
    records = unique_records(records)
    sources = sorted({str(r.get("data_source", "")) for r in records})
    groups = {s: _group([r for r in records if str(r.get("data_source", "")) == s], ks) for s in sources}
    if len(sources) != 1:
        groups["all"] = _group(list(records), ks)
    else:
        groups["all"] = groups[sources[0]]
    return {"settings": dict(meta or {}), "groups": groups}


def _fmt(v: Any, pct: bool = True) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{100 * v:.1f}" if pct else f"{v:.1f}"
    return str(v)


def _partial(g: Mapping[str, Any], k: int) -> int | None:
    """Problems that pass@k of group ``g`` covers, when that is fewer than all of them; else None."""
    n = g.get("pass@k_problems", {}).get(str(k))
    return int(n) if n is not None and int(n) < int(g["problems"]) else None


def partial_pass_at(summary: Mapping[str, Any]) -> list[str]:
    """One warning per (group, k) whose pass@k covers only some problems (the others have fewer than k
    samples), with the counts, e.g. ``"pass@8 of aime24 covers 1 of 2 problems (1 has fewer than 8
    samples)"``, and one per k asked for that no problem of the group reaches (no value). Empty when every
    pass@k covers every problem of its group."""
    out = []
    for name, g in summary["groups"].items():
        if name == "all" and len(summary["groups"]) == 2:
            continue  # "all" is the single source itself
        for k in sorted(int(k) for k in g.get("pass@k_problems", {})):
            n = _partial(g, k)
            if n == 0:
                out.append(f"pass@{k} of {name} has no value: no problem of its {g['problems']} has {k} samples")
            elif n is not None:
                short = int(g["problems"]) - n
                out.append(f"pass@{k} of {name} covers {n} of {g['problems']} problems ({short} "
                           f"{'has' if short == 1 else 'have'} fewer than {k} samples)")
    return out


def unverified_notes(summary: Mapping[str, Any]) -> list[str]:
    """One line per group (data source, and "all" when there are several) with unverified samples, e.g.
    ``"aime24: 3 of 64 samples unverified (timeout 2, error 1): the answer checker gave no verdict; counted as
    wrong in avg@k and pass@k, scored again when the same command runs again"``. Empty when there are none."""
    out = []
    groups = summary["groups"]
    names = [n for n in groups if n != "all"]
    for name in names + (["all"] if len(names) > 1 else []):
        g = groups[name]
        n = int(g.get("unverified") or 0)
        if n:
            why = ", ".join(f"{k} {v}" for k, v in (g.get("unverified_why") or {}).items())
            out.append(f"{name}: {n} of {g['samples']} samples unverified ({why}): the answer checker gave no "
                       "verdict; counted as wrong in avg@k and pass@k, scored again when the same command runs again")
    return out


def format_table(summary: Mapping[str, Any]) -> str:
    """A fixed-width terminal table: one row per data source (and "all"); accuracies in percent, their columns
    headed ``avg@k%`` and ``pass@K%`` (the summary's JSON and the training logs hold fractions).

    A pass@k that covers only some problems of its row (the others have fewer than k samples) is marked with
    ``*`` and explained under the table with the counts (``partial_pass_at``), never shown as if it covered
    every problem. The ``unverif`` column counts the samples the answer checker gave no verdict, explained under
    the table when there are any (:func:`unverified_notes`).
    """
    groups = summary["groups"]
    ks = sorted({int(k) for g in groups.values() for k in g["pass@k"] if k.isdigit()})
    # the accuracies' columns say they are percent (the summary JSON and the training logs hold fractions)
    head = ["data_source", "problems", "k", "avg@k%", *[f"pass@{k}%" for k in ks], "unverif", "tokens", "trunc%",
            "reflect", "tool calls", "tool err%"]
    rows = []
    names = [n for n in groups if n != "all"]
    for name in names + (["all"] if len(names) > 1 else []):
        g = groups[name]
        rows.append([
            name, str(g["problems"]), str(g["k"]), _fmt(g["avg@k"]),
            *[_fmt(g["pass@k"].get(str(k))) + ("*" if _partial(g, k) is not None else "") for k in ks],
            str(int(g.get("unverified") or 0)), _fmt(g["mean_tokens"], pct=False), _fmt(g["truncated_rate"]),
            _fmt(g["reflections"].get("total"), pct=False),
            f"{g['tools']['mean_calls']:.2f}", _fmt(g["tools"]["error_rate"]),
        ])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True)))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    out += [f"* {note}" for note in partial_pass_at(summary)]
    out += [f"! {note}" for note in unverified_notes(summary)]
    return "\n".join(out)


def write_summary(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Write the summary as indented JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return path
