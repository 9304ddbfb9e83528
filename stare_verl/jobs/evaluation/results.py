"""The results file of an evaluation (:class:`ResultsFile`: one JSON line per sample and its settings) and resuming
from it (:func:`resume_split`).

One JSON line per sample (``episode.RECORD_KEYS``) is appended as soon as the sample is scored; a
``<out>.meta.json`` next to it records the settings (``EvalSettings.fingerprint``: the model, the data
file's path and the SHA-256 of its bytes, the sampling and episode settings). Run again with the same output
and settings to resume: answered (problem_id, sample_index) pairs are not asked again, a torn last line is
dropped, a line that is no valid record (bad JSON, a missing key, a field of the wrong type) is skipped, counted
and warned about (its sample runs again), and of two records of one pair the first in the file counts
(``metrics.unique_records``, the one rule of every count). A sample the answer checker gave no verdict
(``verdict: "unverified"``: a timeout or a failed checker) is scored again from its stored response
(:func:`rescore_unverified`) and its line rewritten, until it has been scored ``episode.MAX_SCORE_ATTEMPTS`` times;
a record of an earlier version without a ``verdict`` is read as correct when ``correct``, else as unverified (scored
again). Other settings, data whose content changed, or samples without their settings file raise
:class:`ResumeMismatch` naming what differs and how to start afresh (a larger ``k`` is allowed: only the new samples
run).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stare_verl.jobs.evaluation.episode import (
    MAX_SCORE_ATTEMPTS,
    RECORD_KEYS,
    UNVERIFIED,
    EvalProblem,
    EvalRecord,
    Sample,
    rescore_record,
)
from stare_verl.jobs.evaluation.metrics import unique_records
from stare_verl.jobs.evaluation.settings import EvalSettings, sample_seed
from stare_verl.validation import error_text

__all__ = [
    "ResultsBusy",
    "ResultsFile",
    "ResumeMismatch",
    "pending_samples",
    "record_order",
    "rescore_unverified",
    "resume_split",
]

logger = logging.getLogger(__name__)


class ResumeMismatch(ValueError):
    """A results file exists with samples drawn under other settings."""


class ResultsBusy(ResumeMismatch):
    """Another process holds the results file (its ``.lock``)."""


def _legacy_verdict(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict of a record written before records kept one: ``correct`` when it was correct, else
    ``unverified`` (a checker that gave no verdict was then stored as wrong: it is scored again)."""
    return {"verdict": "correct" if rec.get("correct") is True else UNVERIFIED, "verify_method": "not_recorded"}


class ResultsFile:
    """The per-sample JSONL file and its ``.meta.json`` (settings fingerprint).

    Args:
        path: the JSONL file (its folder is created).
        fingerprint: ``EvalSettings.fingerprint(...)`` of this run.
        overwrite: discard an existing file (and its settings) instead of resuming.
    Raises:
        ResumeMismatch: the existing file was written with another fingerprint (other model, settings or data
            content), its settings file is missing or unreadable while it holds samples (nothing says how they
            were drawn), and not ``overwrite``. The message names what differs and how to start afresh.
        ResultsBusy: another process has the file open (an exclusive ``flock`` on ``<path>.lock``, held until
            :meth:`close`, which removes that file).

    Attributes:
        skipped: lines of the last :meth:`load` that were no valid record (their samples run again).
        duplicates: records of the last :meth:`load` dropped as repeats of an earlier (problem_id, sample_index).
    """

    def __init__(self, path: str | Path, fingerprint: Mapping[str, Any], overwrite: bool = False):
        self.path = Path(path)
        self.meta_path = self.path.with_name(self.path.name + ".meta.json")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fp = json.loads(json.dumps(dict(fingerprint), default=str))
        self._f = None
        self.skipped = 0
        self.duplicates = 0
        lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock_path = lock_path
        self._lock = _acquire(lock_path, self.path)
        if overwrite:
            self.path.unlink(missing_ok=True)
        elif self.path.exists() and self.path.stat().st_size > 0:
            try:
                self._check_settings(fp)
            except ResumeMismatch:
                self.close()  # refused: the lock file goes too
                raise
        tmp = self.meta_path.with_name(self.meta_path.name + ".tmp")
        tmp.write_text(json.dumps(fp, indent=1, sort_keys=True))
        os.replace(tmp, self.meta_path)  # never a torn settings file

    def _afresh(self) -> str:
        n = self.path.read_bytes().count(b"\n")
        return (f"To start afresh, run again with --overwrite (overwrite=True in Python), which discards the {n} "
                f"line(s) of {self.path}, or write to another --out.")

    def _check_settings(self, fp: Mapping[str, Any]) -> None:
        """Raise ResumeMismatch unless the settings file next to the (non-empty) results matches ``fp``."""
        if not self.meta_path.exists():
            raise ResumeMismatch(
                f"{self.path} holds samples but their settings file {self.meta_path} is missing, so nothing says "
                "which model, data and sampling settings drew them; they are not reused. " + self._afresh()
            )
        try:
            old = json.loads(self.meta_path.read_text())
        except ValueError as err:
            old = err
        if not isinstance(old, dict):
            raise ResumeMismatch(
                f"{self.meta_path} (the settings of the samples in {self.path}) is not a JSON object. " + self._afresh()
            )
        if old != fp:
            diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
            why = ("; the data file's content changed since those samples were drawn (their ground truths may be "
                   "stale)" if "data_sha256" in diff else "")
            raise ResumeMismatch(
                f"{self.path} holds samples drawn with other settings ({', '.join(diff)} differ: "
                f"{ {k: old.get(k) for k in diff} } vs { {k: fp.get(k) for k in diff} }){why}. " + self._afresh()
            )

    def load(self) -> list[dict[str, Any]]:
        """The records already in the file, in file order, one per (problem_id, sample_index) (the first;
        ``metrics.unique_records``). A line that is no valid :class:`EvalRecord` (bad JSON, a missing key, a
        field of the wrong type such as ``sample_index: "abc"`` or ``problem_id: [1]``, a negative index) is
        skipped and counted (``skipped``), with one warning naming the first such lines; its sample runs again.
        A torn (unterminated) last line is cut off."""
        self.skipped = self.duplicates = 0
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1]
        out: list[dict[str, Any]] = []
        bad: list[str] = []
        for n, line in enumerate(keep.splitlines(), 1):
            why = None
            try:
                rec = json.loads(line)
            except ValueError:
                rec, why = None, "not JSON"
            if why is None and not isinstance(rec, dict):
                why = f"a JSON {type(rec).__name__}, not an object"
            if why is None and "verdict" not in rec:  # an earlier version's record: no verdict kept
                rec = {**rec, **_legacy_verdict(rec)}
            if why is None:
                missing = [k for k in RECORD_KEYS if k not in rec]
                if missing:
                    why = f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
            if why is None:
                try:
                    row = EvalRecord.model_validate({k: rec[k] for k in RECORD_KEYS}, strict=True).model_dump()
                except ValidationError as err:
                    e = err.errors()[0]
                    why = f"{'.'.join(map(str, e['loc']))}: {error_text(e)}"
                else:
                    if row["sample_index"] < 0 or row["problem_index"] < 0:
                        why = "negative sample_index or problem_index"
            if why is None:
                out.append(row)
            else:
                bad.append(f"line {n}: {why}")
        self.skipped = len(bad)
        if bad:
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            logger.warning("%s: skipped %d line(s) that are no valid record (%s%s); their samples run again",
                           self.path, len(bad), "; ".join(bad[:3]), more)
        unique = unique_records(out)
        self.duplicates = len(out) - len(unique)
        if self.duplicates:
            logger.warning("%s: %d repeated record(s) of a (problem_id, sample_index) ignored (the first in the file "
                           "counts)", self.path, self.duplicates)
        if len(keep) != len(data):
            logger.warning("%s: dropped an unfinished last line (interrupted run)", self.path)
            with self.path.open("r+b") as f:
                f.truncate(len(keep))
        return unique

    def replace(self, records: Mapping[tuple[str, int], Mapping[str, Any]]) -> int:
        """Rewrite the line of each ``(problem_id, sample_index)`` of ``records`` (its first valid record in the
        file, the one :meth:`load` reads) with the new record; every other line stays as it is. Atomic (a
        temporary file renamed over the results). Returns the number of lines replaced."""
        if self._f is not None:
            self._f.close()
            self._f = None
        if not records or not self.path.exists():
            return 0
        data = self.path.read_bytes()
        lines = data[: data.rfind(b"\n") + 1].splitlines()
        todo = {(str(k[0]), int(k[1])): v for k, v in records.items()}
        out, n = [], 0
        for line in lines:
            try:
                rec = json.loads(line)
                key = (str(rec["problem_id"]), int(rec["sample_index"])) if isinstance(rec, dict) else None
            except (ValueError, KeyError, TypeError):
                key = None
            if key is not None and key in todo:
                line = json.dumps(todo.pop(key), ensure_ascii=False, default=str).encode()
                n += 1
            out.append(line + b"\n")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(b"".join(out))
        os.replace(tmp, self.path)
        return n

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as a line and flush it (a crash afterwards keeps it)."""
        if self._f is None:
            self._f = self.path.open("a")
        self._f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file and release the lock, removing the ``.lock`` file (while still holding it: a process that
        opened it meanwhile finds, once it holds it, that the path no longer names it, and takes the path's new
        file instead; see :func:`_acquire`)."""
        if self._f is not None:
            self._f.close()
            self._f = None
        if not self._lock.closed:
            try:
                if os.path.samestat(os.fstat(self._lock.fileno()), os.stat(self._lock_path)):
                    self._lock_path.unlink()
            except OSError:  # already gone, or the folder went: nothing of ours to remove
                pass
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def _acquire(lock_path: Path, results: Path, tries: int = 5):
    """An exclusive, non-blocking ``flock`` on ``lock_path`` (created if missing): the open file.

    A holder removes the file when it closes (:meth:`ResultsFile.close`), so a lock taken on a file that was opened
    just before its holder removed it would lock nothing anyone else sees: after locking, the path must still name
    the locked file, else the path's current file is tried (up to ``tries`` times).

    Raises:
        ResultsBusy: another process holds the lock.
    """
    for _ in range(tries):
        f = lock_path.open("w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            f.close()
            raise ResultsBusy(f"another evaluation is writing {results}; wait for it or use another --out") from err
        try:
            if os.path.samestat(os.fstat(f.fileno()), os.stat(lock_path)):
                return f
        except FileNotFoundError:
            pass
        f.close()  # removed (or replaced) by its last holder between our open and our lock: try the path again
    raise ResultsBusy(f"the lock file {lock_path} of {results} keeps changing; another evaluation is starting or ending")


def pending_samples(problems: Sequence[EvalProblem], k: int, done: Sequence[Mapping[str, Any]]) -> list[tuple]:
    """(problem, sample_index) pairs not yet in ``done``, problem-major."""
    have = {(str(r["problem_id"]), int(r["sample_index"])) for r in done}
    return [(p, j) for p in problems for j in range(k) if (p.problem_id, j) not in have]


def rescore_unverified(
    problems: Sequence[EvalProblem], settings: EvalSettings, results: ResultsFile, done: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``done`` with every ``unverified`` record (the answer checker gave no verdict) scored again from its stored
    response (``episode.rescore_record``, ``settings.reward_kwargs``); the records whose scoring changed are
    rewritten in ``results`` (:meth:`ResultsFile.replace`). A sample still unverified stays so: scored again on
    the next resume while its ``score_attempts`` is below :data:`MAX_SCORE_ATTEMPTS`, then never again (its
    "unverified" is final: a checker that fails every time on it would be run on every resume). Logs how many were
    scored again, how many are left unverified and how many of those for good.

    Raises:
        ValueError: invalid reward options.
    """
    by_id = {p.problem_id: p for p in problems}
    out, changed, n_again = [], {}, 0
    for r in done:
        problem = by_id.get(str(r["problem_id"]))
        again = int(r.get("score_attempts") or 1) < MAX_SCORE_ATTEMPTS
        if r.get("verdict") == UNVERIFIED and problem is not None and again:
            n_again += 1
            row = EvalRecord.model_validate(rescore_record(problem, r, settings.reward_kwargs)).model_dump()
            if row != r:
                changed[(str(r["problem_id"]), int(r["sample_index"]))] = row
            r = row
        out.append(r)
    if changed:
        results.replace(changed)
    if n_again:
        left = [r for r in out if r["verdict"] == UNVERIFIED]
        final = sum(int(r.get("score_attempts") or 1) >= MAX_SCORE_ATTEMPTS for r in left)
        logger.warning("%s: scored %d unverified sample(s) again from their stored responses; %d still unverified "
                       "(%d of them scored %d times: unverified for good)", results.path, n_again, len(left), final,
                       MAX_SCORE_ATTEMPTS)
    return out


def resume_split(
    problems: Sequence[EvalProblem], settings: EvalSettings, results: ResultsFile
) -> tuple[list[dict[str, Any]], list[Sample]]:
    """What ``results`` already holds for ``problems`` (records with sample_index < k; unverified ones scored
    again, :func:`rescore_unverified`) and the samples still to run (problem-major; sample j of problem i asked
    with ``sample_seed(settings.seed, i, j)``)."""
    wanted = {p.problem_id for p in problems}
    done = [r for r in results.load() if r["problem_id"] in wanted and int(r["sample_index"]) < settings.k]
    done = rescore_unverified(problems, settings, results, done)
    todo = [Sample(p, j, sample_seed(settings.seed, p.index, j)) for p, j in pending_samples(problems, settings.k, done)]
    return done, todo


def record_order(
    problems: Sequence[EvalProblem], k: int, records: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """``records`` of ``problems`` (sample_index < k), one per (problem_id, sample_index) (the first:
    ``metrics.unique_records``), in problem/sample order (file order of the problems); others are left out."""
    order = {(p.problem_id, j): (p.index, j) for p in problems for j in range(k)}
    recs = {}
    for r in unique_records(records):
        key = (str(r["problem_id"]), r["sample_index"])
        if key in order:
            recs[key] = r
    return [recs[key] for key in sorted(recs, key=lambda key: order[key])]
