"""``train.log`` without the flood of repeated warnings: each warning line is written once, its repeats counted.

A CPU run's ``main_ppo`` prints thousands of copies of a handful of warnings (``transfer_queue``'s
"target_num_threads 8 should not exceed total physical CPU cores 2", once per Ray actor and step), which made
``train.log`` about 1.4 MB of which a few kilobytes were news. :class:`RepeatedWarningFilter` sits between the
process's output and the log file: a line that reads as a warning (:data:`WARNING_LINE`) is written the first
time its text is seen and only counted afterwards; every other line (progress, metrics, tracebacks, the config
dump) is written as it comes, repeated or not. Two lines are the same warning when they are equal after the
volatile parts are taken out (:func:`warning_key`): terminal colour codes, Ray's ``(ActorName pid=123, ip=...)``
prefix, timestamps and process ids. When the stream ends, :meth:`RepeatedWarningFilter.finish` appends one line
per repeated warning with its count. The console is not affected: callers that echo the output echo it whole.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import BinaryIO

__all__ = ["WARNING_LINE", "RepeatedWarningFilter", "warning_key"]

WARNING_LINE = re.compile(r"\bWARN(?:ING)?\b|\w*Warning\b|\bwarning:|warnings\.warn\(")
"""What makes a line a warning: a logging level (``WARNING``/``WARN``), a Python warning class (``UserWarning``,
``Warning``), a ``warning:`` tag, or the source line Python prints under a warning (``warnings.warn(``)."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's prefix of a worker's output: "(TaskRunner pid=123)", "(pid=123)", "(WorkerDict pid=9, ip=10.0.0.2)",
# possibly after a "[repeated 3x across cluster]"-style tag
_RAY_PREFIX = re.compile(r"^\s*\((?:[\w.:-]+ )?pid=\d+(?:, ip=[\w.:-]+)?\)\s*")
_TIMESTAMP = re.compile(
    r"\[?\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?"  # 2025-12-02 22:34:01,123
    r"|\b[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\b"  # glog: W1202 22:34:01.123456
    r"|\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\b"  # a bare time of day
)
_PID = re.compile(r"\b(pid|tid)([=: ]+)\d+", re.IGNORECASE)


def warning_key(line: str) -> str:
    """The text that identifies a warning line across its repeats: ``line`` without colour codes, Ray's
    ``(Name pid=N)`` prefix, timestamps (ISO dates with times, glog stamps, times of day) and ``pid=N``-style
    process ids, with runs of white space made one space. Lines with the same key are the same warning."""
    text = _ANSI.sub("", line)
    text = _RAY_PREFIX.sub("", text)
    text = _TIMESTAMP.sub("", text)
    text = _PID.sub(r"\1\2", text)
    return " ".join(text.split())


class RepeatedWarningFilter:
    """Writes lines to ``sink`` (a binary file), each warning line only the first time its
    :func:`warning_key` is seen; the repeats are counted and reported by :meth:`finish`.

    Thread-safe: a reader thread may :meth:`write` while the caller :meth:`finish`es (after a join that timed out).

    Attributes:
        repeats: per warning key, how many of its lines were left out (the first occurrence not counted).
    """

    def __init__(self, sink: BinaryIO) -> None:
        self.sink = sink
        self.repeats: dict[str, int] = {}
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._finished = False

    def write(self, line: bytes) -> bool:
        """Write one line (bytes, with or without its newline) unless it repeats a warning seen before.

        Returns:
            whether the line was written.
        """
        text = line.decode("utf-8", errors="replace")
        with self._lock:
            if self._finished:
                return False
            if WARNING_LINE.search(_ANSI.sub("", text)):
                key = warning_key(text)
                if key in self._seen:
                    self.repeats[key] = self.repeats.get(key, 0) + 1
                    return False
                self._seen.add(key)
            self.sink.write(line)
            self.sink.flush()
            return True

    def copy(self, lines: Iterable[bytes]) -> None:
        """:meth:`write` every line of ``lines`` (e.g. a process's stdout pipe) until it ends."""
        for line in lines:
            self.write(line)

    def report(self) -> list[str]:
        """The lines :meth:`finish` appends: a header, then ``(repeated N times) <warning>`` per repeated warning,
        most repeated first; empty when nothing repeated."""
        if not self.repeats:
            return []
        total = sum(self.repeats.values())
        out = [f"[train.log] {total} repeats of {len(self.repeats)} warning line(s) left out above (each kept once, "
               "its first occurrence; timestamps, pids and Ray's actor prefix ignored):"]  # fmt: skip
        for key, n in sorted(self.repeats.items(), key=lambda kv: -kv[1]):
            out.append(f"[train.log]   (repeated {n} more time{'s' if n != 1 else ''}) {key}")
        return out

    def finish(self) -> None:
        """Append :meth:`report` to the sink (nothing when no warning repeated); later writes are dropped."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            lines = self.report()
            if lines:
                self.sink.write(("\n".join(lines) + "\n").encode())
                self.sink.flush()
