"""train.log's repeated-warning filter (``stare_verl.jobs.logfilter``) on a synthetic main_ppo stream: every distinct
line is kept, in order; a warning repeated with other timestamps, pids, Ray actor prefixes or colours is written once
and counted; lines that are not warnings are kept however often they repeat (issue 32 item 6)."""

import io

from stare_verl.jobs.logfilter import RepeatedWarningFilter, warning_key

THREADS = "target_num_threads 8 should not exceed total physical CPU cores 2. Setting to 2."


def _stream() -> tuple[list[bytes], list[bytes]]:
    """(every line of the stream, the lines the log must keep, in order)."""
    lines, kept = [], []

    def add(line: str, keep: bool) -> None:
        lines.append(line.encode() + b"\n")
        if keep:
            kept.append(line.encode() + b"\n")

    add("[train-tooluse] 2025-12-02 22:30:00 rollout backend hf, platform cpu", True)
    for i in range(300):  # Ray's actors, each with its pid, colour codes and timestamps
        actor = ("SimpleStorageUnit", "AgentLoopWorkerTQ", "WorkerDict")[i % 3]
        stamp = f"2025-12-02 22:{30 + i // 60:02d}:{i % 60:02d},{i:03d}"
        add(f"\x1b[36m({actor} pid={1000 + i})\x1b[0m {stamp} - WARNING - transfer_queue.utils.common - {THREADS}",
            i == 0)  # fmt: skip
        add(f"\x1b[36m({actor} pid={1000 + i}, ip=10.0.0.{i % 4})\x1b[0m WARNING:{stamp}:{THREADS}", i == 0)
        if i % 100 == 0:  # a step line (unique) and a config line that repeats: never filtered
            add(f"(TaskRunner pid=7) step:{i // 100 + 1} - actor/entropy:0.{i + 3}", True)
            add("(TaskRunner pid=7)     'enable': False,", True)
    add(
        "(pid=88) /venv/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not available",
        True,
    )
    add('(pid=88)   warnings.warn(f"torchtitan engine is not available: {e!r}", stacklevel=1)', True)
    add(
        "(pid=89) /venv/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not available",
        False,
    )
    add('(pid=89)   warnings.warn(f"torchtitan engine is not available: {e!r}", stacklevel=1)', False)
    add("(pid=89) WARNING: a different warning, said once", True)
    add("Traceback (most recent call last):", True)
    add("Traceback (most recent call last):", True)  # a repeated line that is no warning stays
    return lines, kept


def test_every_distinct_line_is_kept_and_repeated_warnings_are_counted():
    lines, kept = _stream()
    sink = io.BytesIO()
    log = RepeatedWarningFilter(sink)
    written = [log.write(line) for line in lines]
    assert sum(written) == len(kept) == 14
    assert sink.getvalue() == b"".join(kept)  # the kept lines, byte for byte and in order
    threads_a = f"- WARNING - transfer_queue.utils.common - {THREADS}"
    threads_b = f"WARNING::{THREADS}"
    assert log.repeats == {
        threads_a: 299,
        threads_b: 299,
        "/venv/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not available": 1,
        'warnings.warn(f"torchtitan engine is not available: {e!r}", stacklevel=1)': 1,
    }
    log.finish()
    tail = sink.getvalue()[len(b"".join(kept)) :].decode().splitlines()
    assert tail[0].startswith("[train.log] 600 repeats of 4 warning line(s) left out above")
    assert tail[1:3] == [f"[train.log]   (repeated 299 more times) {threads_a}",
                         f"[train.log]   (repeated 299 more times) {threads_b}"]  # fmt: skip
    assert tail[3].startswith("[train.log]   (repeated 1 more time) /venv/verl/workers/engine")
    assert len(tail) == 5
    assert log.write(lines[1]) is False and log.finish() is None  # finished: nothing more is written
    assert sink.getvalue().decode().count("[train.log]") == 5


def test_no_repeats_no_report_and_lines_without_a_newline():
    sink = io.BytesIO()
    log = RepeatedWarningFilter(sink)
    log.copy([b"WARNING: one\n", b"WARNING: two\n", b"last line without newline"])
    log.finish()
    assert sink.getvalue() == b"WARNING: one\nWARNING: two\nlast line without newline"
    assert log.repeats == {}


def test_warning_key_strips_only_the_volatile_parts():
    a = "\x1b[36m(AgentLoopWorkerTQ pid=123)\x1b[0m 2025-12-02 22:34:01,123 - WARNING - x - cores 2"
    b = "(WorkerDict pid=9, ip=10.1.2.3) 2026-01-01T00:00:00.5Z - WARNING - x - cores 2"
    assert warning_key(a) == warning_key(b) == "- WARNING - x - cores 2"
    assert (
        warning_key("(pid=5) W1202 22:34:01.123456 worker pid=77 WARNING lost") == "worker pid= WARNING lost"
    )
    # the numbers that carry meaning stay: other values are other warnings
    assert warning_key("WARNING: cores 2") != warning_key("WARNING: cores 4")
