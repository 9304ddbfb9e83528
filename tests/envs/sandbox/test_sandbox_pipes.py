"""``envs.sandbox._io.FdReader`` / ``FdWriter``: the sandbox's pipe ends, read and written through the event loop's
``add_reader`` / ``add_writer`` and closed once by their owner, on asyncio's loop and on uvloop (Ray's, where
``connect_read_pipe`` closes a descriptor twice: ``tests/envs/sandbox/test_sandbox_spawn.py``)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from envs.sandbox._io import FdReader, FdWriter, spawn

LOOPS = ["asyncio"]
try:
    import uvloop

    LOOPS.append("uvloop")
except ImportError:  # pragma: no cover - uvloop is in the dev install
    uvloop = None


def run(loop_kind: str, coro):
    if loop_kind == "uvloop":
        return uvloop.run(coro)
    return asyncio.run(coro)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_reader_reads_a_large_stream_intact_with_flow_control(loop_kind):
    data = os.urandom(3 << 20)  # 3 MiB through a 64 KiB pipe, 16 KiB reader limit: pauses and resumes

    async def main():
        r, w = os.pipe()
        ends = FdReader(r, limit=1 << 14)
        pauses = []
        pause = ends.pause_reading

        def counted_pause():
            pauses.append(1)
            pause()

        ends.pause_reading = counted_pause
        writer = threading.Thread(target=lambda: (_write_all(w, data), os.close(w)))
        writer.start()
        got = bytearray()
        while chunk := await ends.reader.read(1 << 12):
            got += chunk
            await asyncio.sleep(0)  # a slow consumer: the buffer fills
        writer.join()
        return bytes(got), len(pauses), r, ends

    got, pauses, r, ends = run(loop_kind, main())
    assert got == data
    assert pauses > 0  # the reader stopped reading while its buffer was full
    assert ends.is_closing() and _closed(r)  # closed at EOF


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_writer_drains_a_write_larger_than_the_pipe(loop_kind):
    data = os.urandom(1 << 20)

    async def main():
        r, w = os.pipe()
        got = bytearray()

        def reader():
            while chunk := os.read(r, 1 << 15):
                got.extend(chunk)
            os.close(r)

        t = threading.Thread(target=reader)
        t.start()
        ends = FdWriter(w)
        ends.write(data)
        await ends.drain()
        ends.close()
        await asyncio.to_thread(t.join)
        return bytes(got), w

    got, w = run(loop_kind, main())
    assert got == data
    assert _closed(w)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_writer_reports_a_broken_pipe_from_drain(loop_kind):
    async def main():
        r, w = os.pipe()
        os.close(r)  # the process closed its stdin / died
        ends = FdWriter(w)
        ends.write(b"x" * 10)
        with pytest.raises(BrokenPipeError):
            await ends.drain()
        ends.close()
        return w

    assert _closed(run(loop_kind, main()))


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_close_twice_never_closes_a_reused_descriptor_number(loop_kind):
    async def main():
        r, w = os.pipe()
        reader, writer = FdReader(r), FdWriter(w)
        reader.close()
        writer.close()
        assert _closed(r) and _closed(w)
        r2, w2 = os.pipe()  # the lowest free numbers: the ones just closed
        assert {r2, w2} == {r, w}
        reader.close()  # idempotent: must not close r2 / w2
        writer.close()
        writer.abort()
        alive = not _closed(r2) and not _closed(w2)
        os.close(r2)
        os.close(w2)
        assert await reader.reader.read() == b""  # a read after close sees EOF
        return alive

    assert run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_spawn_round_trip_and_close_pipes(loop_kind):
    async def main():
        p = await spawn(["/bin/sh", "-c", "cat; echo err >&2"])
        payload = b"line\n" * 50_000  # 250 KB: more than a pipe holds, echoed back while it is written
        p.stdin.write(payload)
        out, err, _ = await asyncio.gather(p.stdout.read(), p.stderr.read(), _drain_close(p.stdin))
        status = await p.wait()
        p.close_pipes()
        p.close_pipes()  # idempotent
        return out == payload, err, status

    same, err, status = run(loop_kind, main())
    assert same and err == b"err\n" and status == 0


async def _drain_close(stdin) -> None:
    await stdin.drain()
    stdin.close()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_spawn_of_a_missing_program_leaks_no_descriptor(loop_kind):
    async def main():
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            with pytest.raises(FileNotFoundError):
                await spawn(["/nonexistent/program"])
        return before, len(os.listdir("/proc/self/fd"))

    before, after = run(loop_kind, main())
    assert after == before
