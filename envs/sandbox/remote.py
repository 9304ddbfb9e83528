"""Remote backend: a SandboxFusion-compatible HTTP service (``POST {url}/run_code``).

Request body: ``{"code", "language", "run_timeout", "memory_limit_MB", "stdin": ""}``. Response:
``{"status": "Success" | "Failed" | "SandboxError", "message", "run_result": {"status": "Finished" |
"TimeLimitExceeded" | "Error", "execution_time", "return_code", "stdout", "stderr"}}``.
Transport errors, HTTP 5xx/429 and ``SandboxError`` are retried with exponential backoff and jitter;
the number of requests in flight is bounded by ``RemoteConfig.max_concurrency``.
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from ._io import OutputCapture, looks_like_oom
from .config import ExecLimits, ExecResult, SandboxConfig


class RemoteSandbox:
    """Async client of a SandboxFusion-compatible service. ``run`` never raises for service failures:
    after the retries it returns an :class:`ExecResult` with ``sandbox_error`` set."""

    name = "remote"
    network_isolated = True  # as far as we can tell: the service is responsible for it

    def __init__(self, config: SandboxConfig):
        if config.remote is None:
            raise ValueError("RemoteSandbox needs SandboxConfig.remote")
        self.config = config
        self.remote = config.remote
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ensure(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            limits = httpx.Limits(max_connections=self.remote.max_concurrency)
            self._client = httpx.AsyncClient(base_url=str(self.remote.url), limits=limits)
            self._sem = asyncio.Semaphore(self.remote.max_concurrency)
            self._loop = loop
        return self._client, self._sem

    async def run(self, code: str, limits: ExecLimits | None = None) -> ExecResult:
        """Send ``code`` to the service and map its answer to an :class:`ExecResult`."""
        limits = limits or self.config.limits
        client, sem = self._ensure()
        payload = {
            "code": code, "language": self.remote.language, "run_timeout": limits.timeout_s,
            "memory_limit_MB": limits.memory_mb, "stdin": "",
        }
        timeout = httpx.Timeout(limits.timeout_s + self.remote.request_timeout_margin_s,
                                connect=self.remote.connect_timeout_s)
        t0 = time.monotonic()
        last_error = "no attempt made"
        for attempt in range(self.remote.max_retries + 1):
            if attempt:
                delay = self.remote.backoff_s * (2 ** (attempt - 1))
                await asyncio.sleep(delay * (0.5 + random.random()))
            try:
                async with sem:
                    response = await client.post("run_code", json=payload, timeout=timeout)
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500 or response.status_code == 429:
                last_error = f"HTTP {response.status_code}"
                continue
            try:
                response.raise_for_status()
                body = response.json()
            except (httpx.HTTPError, ValueError) as exc:
                return ExecResult(backend=self.name, duration_s=time.monotonic() - t0,
                                  sandbox_error=f"bad response: {exc}")
            if body.get("status") == "SandboxError":
                last_error = f"SandboxError: {body.get('message', '')}"
                continue
            return self._to_result(body, limits, time.monotonic() - t0)
        return ExecResult(backend=self.name, duration_s=time.monotonic() - t0,
                          sandbox_error=f"remote sandbox failed after {self.remote.max_retries + 1} attempts: "
                          f"{last_error}")

    def _to_result(self, body: dict, limits: ExecLimits, duration: float) -> ExecResult:
        run = body.get("run_result") or {}
        out, err = OutputCapture(limits.max_output_bytes), OutputCapture(limits.max_output_bytes)
        out.feed(str(run.get("stdout") or "").encode("utf-8", "replace"))
        err.feed(str(run.get("stderr") or "").encode("utf-8", "replace"))
        compile_result = body.get("compile_result") or {}
        if compile_result.get("stderr"):
            err.feed(str(compile_result["stderr"]).encode("utf-8", "replace"))
        timed_out = run.get("status") == "TimeLimitExceeded"
        status = run.get("return_code")
        stderr = err.text()
        return ExecResult(
            stdout=out.text(), stderr=stderr, exit_code=None if timed_out else status, timed_out=timed_out,
            oom=bool(status) and looks_like_oom(stderr), truncated=out.truncated or err.truncated,
            duration_s=duration, backend=self.name,
        )

    async def run_in_session(self, key: str, code: str, limits: ExecLimits | None = None) -> ExecResult:
        """Not available: SandboxFusion runs every request in a fresh process. Raises NotImplementedError."""
        raise NotImplementedError("persistent sessions need a local backend (bwrap, unshare, subprocess)")

    async def close_session(self, key: str) -> None:
        """No-op (no sessions on the remote backend)."""

    @property
    def session_keys(self) -> list[str]:
        return []

    async def aclose(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
