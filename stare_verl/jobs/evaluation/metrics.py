"""avg@k and the unbiased pass@k estimator, per problem and over a set of problems.

Definitions (n samples drawn for a problem, c of them correct):

- ``avg@k``: the mean correctness of the k samples of each problem, averaged over problems (the reported
  "AIME avg@32" with k = n = 32). It equals the unbiased pass@1 estimate.
- ``pass@k``: the probability that at least one of k samples is correct, estimated without bias from
  n >= k samples as ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models
  Trained on Code", Sec. 2.1), computed as the product ``1 - prod_{i = n-c+1}^{n} (1 - k / i)``, which never
  forms the (huge) binomial coefficients.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ProblemStats",
    "aggregate_problems",
    "avg_at_k",
    "default_ks",
    "mean_pass_at_k",
    "pass_at_k",
    "record_key",
    "unique_records",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``n`` samples with ``c`` correct (Chen et al. 2021).

    Args:
        n: samples drawn (>= 1); c: correct among them (0 <= c <= n); k: budget (1 <= k <= n).
    Returns:
        float in [0, 1]: ``1 - C(n-c, k) / C(n, k)``; exactly 1.0 when ``n - c < k``, 0.0 when ``c == 0``.
    Raises:
        ValueError: arguments out of range (in particular ``k > n``: pass@k needs at least k samples).
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples, got n={n}")
    if n - c < k:
        return 1.0
    if c == 0:
        return 0.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(correct: Sequence[bool | int | float]) -> float:
    """Mean correctness of one problem's samples (its contribution to avg@k).

    Raises:
        ValueError: no samples.
    """
    if len(correct) == 0:
        raise ValueError("avg@k of no samples")
    return sum(float(bool(x)) for x in correct) / len(correct)


def default_ks(n: int) -> list[int]:
    """The k reported for n samples: powers of two below n, and n itself (n = 32 -> 1, 2, 4, 8, 16, 32)."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    if n >= 1:
        ks.append(int(n))
    return ks


@dataclass
class ProblemStats:
    """Aggregate of one problem's samples.

    Attributes:
        problem_id, data_source: of the problem.
        n: samples; c: correct samples; avg: c / n (avg@n of this problem).
        pass_at: {k: unbiased pass@k} for every requested k <= n.
    """

    problem_id: str
    data_source: str
    n: int
    c: int
    avg: float
    pass_at: dict[int, float] = field(default_factory=dict)


def record_key(record: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The sample a record answers: ``(str(problem_id), sample_index)``; None when it has no ``sample_index``
    (such a record is never a repeat)."""
    j = record.get("sample_index")
    return None if j is None else (str(record["problem_id"]), j)


def unique_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The de-duplication rule of every count of the evaluation (resume, record order, avg@k / pass@k and the
    summary's counts): one record per (problem_id, sample_index), the first in order (the file's: the one
    written first); records without a ``sample_index`` are all kept. Order is preserved."""
    seen: set[tuple[str, Any]] = set()
    out = []
    for r in records:
        key = record_key(r)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        out.append(r)
    return out


def aggregate_problems(records: Iterable[Mapping[str, Any]], ks: Sequence[int]) -> list[ProblemStats]:
    """Group per-sample records by ``problem_id`` and compute each problem's avg and pass@k.

    Args:
        records: dicts with ``problem_id`` (str), ``correct`` (bool) and optionally ``data_source``.
            A repeated (problem_id, sample_index) pair counts once (:func:`unique_records`: the first).
        ks: the k of pass@k; a k above a problem's n is left out of that problem's ``pass_at``.
    Returns:
        one ProblemStats per problem, in first-seen order.
    """
    groups: dict[str, list[bool]] = {}
    sources: dict[str, str] = {}
    for r in unique_records(records):
        pid = str(r["problem_id"])
        groups.setdefault(pid, []).append(bool(r["correct"]))
        sources.setdefault(pid, str(r.get("data_source", "")))
    out = []
    for pid, corr in groups.items():
        n, c = len(corr), sum(corr)
        out.append(
            ProblemStats(pid, sources[pid], n, c, c / n, {int(k): pass_at_k(n, c, k) for k in ks if 1 <= k <= n})
        )
    return out


def mean_pass_at_k(problems: Sequence[ProblemStats], k: int) -> tuple[float | None, int]:
    """Mean pass@k over the problems that have at least k samples.

    Returns:
        ``(mean, number of problems averaged)``; ``(None, 0)`` when no problem has k samples.
    """
    vals = [p.pass_at[k] for p in problems if k in p.pass_at]
    if not vals:
        return None, 0
    return sum(vals) / len(vals), len(vals)
