"""The SandboxFusion-compatible HTTP backend against a tiny real server on 127.0.0.1 (started and shut
down by the test; it runs the code with ``python -I`` in a subprocess, like a minimal SandboxFusion)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import ValidationError

from envs.sandbox import ExecLimits, RemoteSandbox, SandboxConfig, make_sandbox

pytestmark = pytest.mark.integration


class FakeSandboxFusion(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fail_next = 0  # answer that many requests with HTTP 503
        self.sandbox_error_next = 0  # ... or with status SandboxError
        self.delay_s = 0.0
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeSandboxFusion

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _reply(self, status: int, body: dict) -> None:
        # The request leaves the in-flight count before its answer is written: a client that has read the answer
        # may send its next request at once, and counting after the write would overlap the two (3 for a bound of
        # 2 in a CI run).
        self._leave()
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 (http.server's naming)
        srv = self.server
        self._left = False
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.requests.append(body)
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            fail, srv.fail_next = srv.fail_next > 0, max(0, srv.fail_next - 1)
            sberr = not fail and srv.sandbox_error_next > 0
            if sberr:
                srv.sandbox_error_next -= 1
        try:
            time.sleep(srv.delay_s)
            if self.path != "/run_code":
                return self._reply(404, {"detail": "not found"})
            if fail:
                return self._reply(503, {"detail": "busy"})
            if sberr:
                return self._reply(200, {"status": "SandboxError", "message": "pod died", "run_result": None})
            t0 = time.monotonic()
            try:
                proc = subprocess.run([sys.executable, "-I", "-c", body["code"]], capture_output=True,
                                      stdin=subprocess.DEVNULL, timeout=body["run_timeout"])
                run = {"status": "Finished", "return_code": proc.returncode,
                       "stdout": proc.stdout.decode(errors="replace"), "stderr": proc.stderr.decode(errors="replace")}
            except subprocess.TimeoutExpired:
                run = {"status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}
            run["execution_time"] = time.monotonic() - t0
            status = "Success" if run["status"] == "Finished" and run["return_code"] == 0 else "Failed"
            self._reply(200, {"status": status, "message": "", "compile_result": None, "run_result": run,
                              "executor_pod_name": None, "files": {}})
        finally:
            self._leave()

    def _leave(self) -> None:
        if not self._left:
            self._left = True
            with self.server.lock:
                self.server.in_flight -= 1


@pytest.fixture
def server():
    srv = FakeSandboxFusion()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def _remote(url: str, **remote) -> RemoteSandbox:
    cfg = {"backend": "remote", "limits": {"timeout_s": 3, "max_output_bytes": 1000},
           "remote": {"url": url, "backoff_s": 0.01, **remote}}
    sb = make_sandbox(cfg)
    assert isinstance(sb, RemoteSandbox)
    return sb


async def _run_and_close(sb: RemoteSandbox, *codes: str, limits: ExecLimits | None = None):
    try:
        return await asyncio.gather(*(sb.run(c, limits) for c in codes))
    finally:
        await sb.aclose()


def test_remote_runs_code_and_maps_the_result(server):
    ok, err, big = asyncio.run(_run_and_close(_remote(server.url), "print(6 * 7)", "1/0", "print('q' * 5000)"))
    assert (ok.stdout, ok.exit_code, ok.timed_out, ok.backend) == ("42\n", 0, False, "remote")
    assert err.exit_code == 1 and "ZeroDivisionError" in err.stderr
    assert big.truncated and "bytes truncated" in big.stdout and len(big.stdout) < 1100
    sent = server.requests[0]
    assert sent["language"] == "python" and sent["run_timeout"] == 3 and sent["memory_limit_MB"] == 1024


def test_remote_timeout_is_reported(server):
    (r,) = asyncio.run(_run_and_close(_remote(server.url), "import time; time.sleep(30)",
                                      limits=ExecLimits(timeout_s=1)))
    assert r.timed_out and r.exit_code is None and r.sandbox_error is None and r.duration_s < 5


def test_remote_retries_with_backoff_then_succeeds(server):
    server.fail_next, server.sandbox_error_next = 2, 1
    (r,) = asyncio.run(_run_and_close(_remote(server.url, max_retries=3), "print('third time lucky')"))
    assert r.stdout == "third time lucky\n" and len(server.requests) == 4


def test_remote_gives_a_result_not_an_exception_when_retries_run_out(server):
    server.fail_next = 10
    (r,) = asyncio.run(_run_and_close(_remote(server.url, max_retries=2), "print(1)"))
    assert r.exit_code is None and "after 3 attempts" in r.sandbox_error and "503" in r.sandbox_error
    assert len(server.requests) == 3


def test_remote_unreachable_service_fails_fast():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    (r,) = asyncio.run(_run_and_close(_remote(f"http://127.0.0.1:{port}", max_retries=1), "print(1)"))
    assert r.sandbox_error and "ConnectError" in r.sandbox_error and time.monotonic() - t0 < 5


def test_remote_request_timeout_applies(server):
    server.delay_s = 3.0  # the service hangs longer than timeout_s + margin
    sb = _remote(server.url, max_retries=0, request_timeout_margin_s=0.0)
    t0 = time.monotonic()
    (r,) = asyncio.run(_run_and_close(sb, "print(1)", limits=ExecLimits(timeout_s=0.5)))
    assert r.sandbox_error and "Timeout" in r.sandbox_error and time.monotonic() - t0 < 2.5


def test_remote_concurrency_is_bounded(server):
    """At most max_concurrency requests are open at once. The requests get a deadline no loaded machine reaches:
    a client that gives up on a slow request (its timeout) and retries leaves the abandoned one running on the
    server, which then counts one more in flight; that is the retry path (tested above), not the bound. The
    server must have seen each request exactly once, so no retry hid in the count."""
    server.delay_s = 0.2
    codes = [f"print({i})" for i in range(8)]
    results = asyncio.run(_run_and_close(_remote(server.url, max_concurrency=2), *codes,
                                         limits=ExecLimits(timeout_s=120)))  # fmt: skip
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    assert len(server.requests) == 8
    assert server.max_in_flight == 2


def test_remote_config_needs_a_url():
    with pytest.raises(ValidationError):
        SandboxConfig.model_validate({"backend": "remote"})
    with pytest.raises(ValidationError):
        SandboxConfig.model_validate({"backend": "remote", "remote": {"url": "not a url"}})


def test_remote_has_no_sessions(server):
    sb = _remote(server.url)
    assert sb.session_keys == []
    with pytest.raises(NotImplementedError):
        asyncio.run(sb.run_in_session("k", "print(1)"))
