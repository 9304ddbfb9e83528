"""Sandbox throughput and latency: ``print(1+1)`` per local backend, cold call vs persistent session,
at concurrency 1 and 8; then, with bwrap, the cold-call cost of the sandbox interpreter (``python: auto``, the
project's .venv-sandbox with the math stack) against the system Python, and of importing numpy, sympy, scipy
and matplotlib in a cold call.

Targets: bwrap cold p50 <= 150 ms; >= 20 calls/s sustained (bwrap cold, concurrency 8);
session p50 <= 10 ms. Prints one line per configuration and whether each target is met; always exits 0
(the figures are the result). Usage: ``python bench/bench_sandbox.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.sandbox import ExecLimits, LocalSandbox, SandboxConfig, probe_backend  # noqa: E402
from envs.sandbox.interpreter import SYSTEM_PYTHON  # noqa: E402

IMPORTS = {
    "print(1+1)": "print(1+1)",
    "import numpy": "import numpy; print(2)",
    "import sympy": "import sympy; print(2)",
    "import scipy.optimize": "import scipy.optimize; print(2)",
    "matplotlib plot + savefig": "import matplotlib.pyplot as p; p.plot([1, 2]); p.savefig('f.png'); p.show(); print(2)",
}


async def _cold_p50(sb: LocalSandbox, code: str, calls: int) -> tuple[float, int]:
    """(p50 latency in ms of ``calls`` sequential cold calls of ``code``, calls that did not print 2)."""
    latencies, wrong = [], 0
    for _ in range(calls):
        t0 = time.perf_counter()
        r = await sb.run(code)
        latencies.append(time.perf_counter() - t0)
        wrong += r.stdout.strip() != "2"
    return 1000 * statistics.median(latencies), wrong


def bench_interpreters(scale: float) -> None:
    """bwrap cold calls: system Python vs the sandbox interpreter, and import costs with the latter."""
    if probe_backend("bwrap", SandboxConfig()) is not None:
        print("interpreter bench skipped: bwrap unavailable")
        return
    limits = ExecLimits(timeout_s=60, cpu_s=60, memory_mb=4096)
    system = LocalSandbox("bwrap", SandboxConfig(python=SYSTEM_PYTHON, limits=limits))
    auto = LocalSandbox("bwrap", SandboxConfig(python="auto", limits=limits))
    n = max(5, int(40 * scale))
    p_sys, _ = asyncio.run(_cold_p50(system, CODE, n))
    p_auto, wrong = asyncio.run(_cold_p50(auto, CODE, n))
    print(f"bwrap cold print(1+1): system {SYSTEM_PYTHON} p50 {p_sys:.1f} ms; sandbox interpreter {auto.python} "
          f"p50 {p_auto:.1f} ms ({n} calls each, {wrong} wrong)")
    print(f"target sandbox interpreter cold p50 <= 150 ms: {'met' if p_auto <= 150 else 'MISSED'} ({p_auto:.1f} ms)")
    if auto.venv is None:
        print("import costs skipped: no sandbox interpreter (make sandbox-python)")
        return
    m = max(3, int(10 * scale))
    for name, code in IMPORTS.items():
        p50, wrong = asyncio.run(_cold_p50(auto, code, m))
        print(f"bwrap cold {name:28s} p50 {p50:7.1f} ms  ({m} calls, {wrong} wrong)")

CODE = "print(1+1)"


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def _bench(sb: LocalSandbox, mode: str, concurrency: int, calls: int) -> dict:
    latencies: list[float] = []
    failures = 0
    per_worker = calls // concurrency

    async def worker(w: int) -> None:
        nonlocal failures
        key = f"bench-{w}"
        if mode == "session":
            await sb.run_in_session(key, "pass")  # start-up is not part of the per-call figure
        for _ in range(per_worker):
            t0 = time.perf_counter()
            r = await (sb.run_in_session(key, CODE) if mode == "session" else sb.run(CODE))
            latencies.append(time.perf_counter() - t0)
            failures += r.stdout != "2\n"

    await asyncio.gather(*(worker(w) for w in range(concurrency)))  # warm-up round for sessions included
    latencies.clear()
    failures = 0
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    await sb.aclose()
    return {
        "calls": len(latencies), "calls_per_s": len(latencies) / wall, "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * _pct(latencies, 0.99), "failures": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    print(f"sandbox bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, euid {os.geteuid()}")
    results = {}
    for kind in ("bwrap", "unshare", "subprocess"):
        reason = probe_backend(kind, SandboxConfig(allow_unsafe=True))
        if reason is not None:
            print(f"{kind:10s} unavailable: {reason}")
            continue
        for mode, counts in (("cold", {1: 60, 8: 200}), ("session", {1: 400, 8: 800})):
            for conc, calls in counts.items():
                cfg = SandboxConfig(limits=ExecLimits(timeout_s=10), max_concurrency=8, allow_unsafe=True)
                sb = LocalSandbox(kind, cfg)
                res = asyncio.run(_bench(sb, mode, conc, max(conc, int(calls * scale))))
                results[(kind, mode, conc)] = res
                print(f"{kind:10s} {mode:7s} concurrency {conc}: {res['calls_per_s']:7.1f} calls/s  "
                      f"p50 {res['p50_ms']:7.1f} ms  p99 {res['p99_ms']:7.1f} ms  "
                      f"({res['calls']} calls, {res['failures']} wrong)")
    if ("bwrap", "cold", 1) in results:
        cold1, cold8 = results[("bwrap", "cold", 1)], results[("bwrap", "cold", 8)]
        sess = results[("bwrap", "session", 1)]
        checks = [
            ("bwrap cold p50 <= 150 ms", cold1["p50_ms"] <= 150, f"{cold1['p50_ms']:.1f} ms"),
            (">= 20 calls/s sustained (bwrap cold, concurrency 8)", cold8["calls_per_s"] >= 20,
             f"{cold8['calls_per_s']:.1f} calls/s"),
            ("session p50 <= 10 ms (bwrap)", sess["p50_ms"] <= 10, f"{sess['p50_ms']:.2f} ms"),
        ]
        for name, ok, value in checks:
            print(f"target {name}: {'met' if ok else 'MISSED'} ({value})")
    bench_interpreters(scale)


if __name__ == "__main__":
    main()
