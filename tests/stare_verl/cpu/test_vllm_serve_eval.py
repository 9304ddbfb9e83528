"""``make eval`` against ``vllm serve`` scores what the local engine scores (``make test-vllm``, in ``.venv-vllm``;
skipped where vLLM's CPU build is not installed).

A real SFT checkpoint of the tool-use family (a short cold-start SFT: it calls the tool, answers in
``\\boxed{}``, and is right on a few held-out problems) is served by ``vllm serve`` (vLLM's CPU build, float32,
eager, on a free loopback port) and evaluated greedily through the URL (``python -m stare_verl.jobs.evaluation
--url``, what ``make eval URL=...`` runs), and on this machine by the local engine (``--checkpoint``, what
``make eval`` runs without a URL), on the same held-out problems, budget and turn limit. Per problem the two
give the same text, answer, score, turns, tool calls and token counts, so the same accuracy; the server is
asked both ways it can take tools (``--tool-choice none``: the calls stay in the text; the default "auto" with
vLLM's hermes parser: the calls come back as ``tool_calls``). The server's whole process group is stopped
afterwards: no process, no ``/dev/shm`` segment left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stare_verl.cpu.vllm_engine import engine_env, serve_command
from stare_verl.jobs.procs import (
    RUN_TAG_ENV,
    _alive,
    cpu_env,
    kill_tagged,
    leftover_processes,
    remove_orphan_shm,
)
from tests.support.cpu import REPO
from tests.support.leftovers import _shm
from tests.support.vllm import VLLM_TESTS as pytestmark  # noqa: F401

SERVED = "tiny-sft"
START_TIMEOUT_S = 600  # 34-75 s beside two training runs on 2 cores; a cold first start compiles nothing (eager)
EVAL_TIMEOUT_S = 900
# a short SFT: 300 steps of the tool-use family's model (hidden 128, 4 heads: head dim 32, as vLLM's CPU attention
# needs); ~80 s of training on one loaded core. 16 held-out problems.
SFT = dict(n_train=1024, n_heldout=16, steps=300, batch_size=16, progress=False, eval_temperatures=(0.0,),
           num_threads=1, stop_accuracy=None)  # fmt: skip
EPISODE_ARGS = ["--k", "1", "--temperature", "0", "--max-tokens", "128", "--max-turns", "3", "--no-progress"]
SAME = ("response", "extracted_answer", "has_answer", "correct", "score", "truncated", "termination", "tokens",
        "response_tokens", "chars", "turns", "tool_calls", "tool_executed", "malformed_calls", "tool_errors",
        "tool_timeouts", "error")  # fmt: skip


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """``vllm serve`` in a process group of its own, tagged with ``STARE_VERL_RUN_TAG``; :meth:`stop` ends the
    group (SIGTERM, then SIGKILL), any tagged process that left it, and the ``/dev/shm`` segments it left."""

    def __init__(self, model: str, root: Path):
        self.tag = f"vllm-serve-{uuid.uuid4().hex}"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "vllm_serve.log"
        self.shm_before = set(_shm())
        self.started = time.time()
        env = cpu_env({RUN_TAG_ENV: self.tag, **engine_env(root / "cache", environ={})})
        cmd = serve_command(model, self.port, served_model_name=SERVED, vllm=Path(sys.executable).parent / "vllm")
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=root,
                                     start_new_session=True)  # fmt: skip
        self.stopped: dict | None = None

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until ``GET /health`` answers 200. Raises RuntimeError when the server exits or the time is up."""
        import httpx

        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return time.time() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vllm serve not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> dict:
        """Stop everything the server started (idempotent). Returns what was left: ``processes`` (tagged, alive
        after the kills), ``shm`` (new ``/dev/shm`` entries after the orphan clean-up), ``removed_shm``."""
        if self.stopped is not None:
            return self.stopped
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + wait_s
            while time.time() < deadline and (self.proc.poll() is None or _group_alive(self.proc.pid)):
                time.sleep(0.2)
            if not _group_alive(self.proc.pid):
                break
        self.proc.wait(timeout=10)
        self._log.close()
        kill_tagged(self.tag)
        removed = remove_orphan_shm(self.started)
        self.stopped = {"processes": leftover_processes(self.tag, grace_s=5), "removed_shm": removed,
                        "shm": sorted(set(_shm()) - self.shm_before), "returncode": self.proc.returncode}  # fmt: skip
        return self.stopped


def _group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid and _alive(int(entry)):
                    return True
            except OSError:
                continue
    return False


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from stare_verl.jobs.demo import sft as S
    from stare_verl.jobs.evaluation.local import heldout_data_for_sft

    root = tmp_path_factory.mktemp("vllm_serve_eval")
    t0 = time.time()
    path = S.ensure_sft_checkpoint(S.SFTConfig(cache_dir=str(root / "sft"), **SFT))
    data = heldout_data_for_sft(path, root / "data")
    print(f"SFT checkpoint {path} in {time.time() - t0:.0f} s")
    return {"root": root, "path": path, "data": data}


@pytest.fixture(scope="module")
def server(checkpoint):
    srv = VllmServer(str(checkpoint["path"]), checkpoint["root"])
    try:
        print(f"vllm serve healthy after {srv.wait_healthy(START_TIMEOUT_S):.0f} s at {srv.url}")
        yield srv
    finally:
        srv.stop()


def _evaluate(out: Path, *source: str) -> tuple[dict[str, dict], dict]:
    """Run ``python -m stare_verl.jobs.evaluation`` (``make eval``) on the held-out problems; the records by
    problem id, and the summary."""
    cmd = [sys.executable, "-m", "stare_verl.jobs.evaluation", *source, *EPISODE_ARGS, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=EVAL_TIMEOUT_S, cwd=REPO, env=cpu_env())
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    records = {r["problem_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    summary = json.loads(out.with_name(out.name.removesuffix(".jsonl") + ".summary.json").read_text())
    return records, summary


@pytest.fixture(scope="module")
def local_eval(checkpoint):
    return _evaluate(checkpoint["root"] / "local.jsonl", "--checkpoint", str(checkpoint["path"]), "--data",
                     str(checkpoint["data"]))  # fmt: skip


def _accuracy(records: dict[str, dict]) -> float:
    return sum(r["correct"] for r in records.values()) / len(records)


@pytest.mark.parametrize("tool_choice", ["none", "omit"])
def test_eval_through_vllm_serve_scores_as_the_local_engine(checkpoint, server, local_eval, tool_choice):
    """Per problem, the episode through the server is the local engine's: same text, answer, score, turns, calls,
    tokens (``omit``: vLLM's default "auto" with its hermes parser, which names a turn that stopped on a call
    ``tool_calls`` where the local engine says ``stop``)."""
    local, local_summary = local_eval
    api, api_summary = _evaluate(checkpoint["root"] / f"api_{tool_choice}.jsonl", "--url", server.url, "--model",
                                 SERVED, "--data", str(checkpoint["data"]), "--tool-choice", tool_choice)  # fmt: skip
    assert sorted(api) == sorted(local) and len(local) == SFT["n_heldout"]
    for pid, want in local.items():
        got = api[pid]
        assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}, pid
        reason = "stop" if got["finish_reason"] == "tool_calls" and tool_choice == "omit" else got["finish_reason"]
        assert reason == want["finish_reason"], pid
    # a real checkpoint: it calls the tool, and tool output went back through the server in later turns
    assert sum(r["tool_executed"] for r in local.values()) >= len(local) // 2
    assert sum(r["turns"] >= 2 for r in local.values()) >= len(local) // 2
    assert sum(r["has_answer"] for r in local.values()) >= 1
    assert _accuracy(api) == _accuracy(local)
    # the summary (avg@k, pass@k, token and tool statistics per data source and overall) is the same but for the
    # tool calls' wall time
    def stats(summary):
        return {g: {k: v for k, v in row.items() if "time" not in k} for g, row in summary["groups"].items()}

    assert stats(api_summary) == stats(local_summary)
    assert api_summary["groups"]["all"]["avg@k"] == _accuracy(local)
    print(f"tool_choice {tool_choice}: accuracy {_accuracy(api):.4f} through vllm serve, {_accuracy(local):.4f} local "
          f"({len(local)} problems, {sum(r['tool_executed'] for r in local.values())} tool calls run)")


def test_the_server_leaves_nothing_behind(server):
    left = server.stop()
    assert left["processes"] == [], left
    assert left["shm"] == [], left
    assert server.proc.returncode is not None
