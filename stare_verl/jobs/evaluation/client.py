"""Async client of an OpenAI-compatible chat-completions server (SGLang, vLLM, ...), built on httpx.

- bounded concurrency: at most ``max_concurrency`` requests in flight (an ``asyncio.Semaphore``);
- timeouts: ``connect_timeout_s`` to connect, ``request_timeout_s`` for reading/writing/pool waits;
- retries with exponential backoff (``backoff_s * 2**attempt``, capped at ``backoff_max_s``, with jitter) on
  timeouts, connection errors, HTTP 5xx and 429; any other 4xx fails at once with the server's message;
- ``check_model`` asks ``GET /v1/models`` once: a server that cannot be reached raises
  :class:`ServerUnreachable`, a model it does not serve raises :class:`ModelNotServed` naming what it serves.

Errors: every failure is an :class:`EvalClientError` subclass with a message meant for the user.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ChatClient",
    "ChatResult",
    "ClientConfig",
    "EvalClientError",
    "ModelNotServed",
    "RequestFailed",
    "ServerUnreachable",
    "api_base",
]

logger = logging.getLogger(__name__)

_RETRY_STATUS = {429, 500, 502, 503, 504}


class EvalClientError(RuntimeError):
    """A chat-completions request could not be completed (base class; the message is for the user)."""


class ServerUnreachable(EvalClientError):
    """No server answers at the URL (connection refused, DNS failure, or every attempt timed out)."""


class ModelNotServed(EvalClientError):
    """The server answers but does not serve the requested model name."""


class RequestFailed(EvalClientError):
    """The server rejected a request (4xx) or kept failing (5xx / timeouts) after all retries."""


def api_base(url: str) -> str:
    """The ``.../v1`` base of a server URL: ``http://h:30000``, ``http://h:30000/`` and ``http://h:30000/v1``
    all give ``http://h:30000/v1``.

    Raises:
        ValueError: not an http(s) URL, whitespace inside it, no host, or a port outside 1..65535.
    """
    u = (url or "").strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
    if any(c.isspace() for c in u):  # httpx takes "http://local host:1" and fails only when it connects
        raise ValueError(f"server URL {url!r} is not a valid URL: it holds whitespace")
    try:
        parsed = httpx.URL(u)
    except (httpx.InvalidURL, ValueError) as err:
        raise ValueError(f"server URL {url!r} is not a valid URL: {err}") from None
    if not parsed.host:
        raise ValueError(f"server URL {url!r} names no host")
    if parsed.port is not None and not 0 < parsed.port < 65536:  # httpx accepts 99999 and fails on connect
        raise ValueError(f"server URL {url!r}: port {parsed.port} is not in 1..65535")
    for suffix in ("/chat/completions", "/completions"):
        if u.endswith(suffix):
            u = u[: -len(suffix)]
    return u if u.endswith("/v1") else u + "/v1"


class ClientConfig(BaseModel):
    """Connection settings (validated).

    Attributes:
        url: server URL (``/v1`` is appended when missing).
        model: model name as the server serves it (``None``: the server's only model, see ``check_model``).
        api_key: sent as ``Authorization: Bearer``; default ``$OPENAI_API_KEY`` (vLLM/SGLang need none).
        max_concurrency: requests in flight at once.
        request_timeout_s: limit of one request (reading the answer included), seconds.
        connect_timeout_s: limit of establishing a connection, seconds.
        max_retries: retries after the first attempt (timeouts, connection errors, 5xx, 429).
        probe_timeout_s: seconds the first contact (``GET /v1/models``) waits for an answer (at most
            ``request_timeout_s``): a server that accepts connections but never answers is reported in about
            twice this, not after ``max_retries`` full request timeouts.
        backoff_s, backoff_max_s: first retry delay and its cap (doubled each retry; +-25% jitter).
    """

    model_config = ConfigDict(extra="forbid")

    url: str
    model: str | None = None
    api_key: str | None = Field(default_factory=lambda: os.environ.get("OPENAI_API_KEY") or None)
    max_concurrency: int = Field(64, ge=1, le=100_000)
    request_timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    max_retries: int = Field(5, ge=0, le=100)
    probe_timeout_s: float = Field(30.0, gt=0)
    backoff_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return api_base(v)


@dataclass
class ChatResult:
    """One chat-completions answer (the first choice).

    Attributes:
        content: ``message.content`` ("" when null).
        reasoning: ``message.reasoning_content`` / ``message.reasoning`` (servers with a reasoning parser);
            "" when absent.
        tool_calls: ``message.tool_calls`` as returned (servers with a tool-call parser); [] when absent.
        finish_reason: "stop", "length", "tool_calls", ... ("" when absent).
        prompt_tokens, completion_tokens: from ``usage`` (None when the server gives none).
        raw: the whole JSON answer.
    """

    content: str
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def _parse_chat(body: Any) -> ChatResult:
    try:
        choice = body["choices"][0]
        msg = choice.get("message") or {}
    except (KeyError, IndexError, TypeError) as err:
        raise RequestFailed(f"the server's answer is not a chat completion (no choices[0]): {str(body)[:300]}") from err
    usage = body.get("usage") or {}
    return ChatResult(
        content=msg.get("content") or "",
        reasoning=msg.get("reasoning_content") or msg.get("reasoning") or "",
        tool_calls=list(msg.get("tool_calls") or []),
        finish_reason=str(choice.get("finish_reason") or ""),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        raw=body,
    )


def _error_text(resp: httpx.Response) -> str:
    """The error a server answered, on one line (an HTML page's whitespace folded), cut at 300 characters."""
    try:
        body = resp.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        msg = str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        msg = resp.text
    msg = " ".join(msg.split())
    return msg if len(msg) <= 300 else msg[:300] + " ..."


class ChatClient:
    """Async chat-completions client; use as ``async with ChatClient(cfg) as client: ...``.

    Counters (for logs and tests): ``requests`` (HTTP attempts made), ``retries`` (attempts that were
    retried), ``completed`` (chat calls that returned).
    """

    def __init__(self, config: ClientConfig, transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        self._sem = asyncio.Semaphore(config.max_concurrency)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        timeout = httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s)
        limits = httpx.Limits(max_connections=config.max_concurrency, max_keepalive_connections=config.max_concurrency)
        self._http = httpx.AsyncClient(
            base_url=config.url, timeout=timeout, limits=limits, headers=headers, transport=transport
        )
        self.model: str | None = config.model
        self.requests = 0
        self.retries = 0
        self.completed = 0

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    def _delay(self, attempt: int) -> float:
        base = min(self.config.backoff_max_s, self.config.backoff_s * (2**attempt))
        return base * random.uniform(0.75, 1.25)

    async def _request(self, method: str, path: str, json: dict | None = None, probe: bool = False) -> Any:
        """One API call with retries; returns the decoded JSON body.

        ``probe``: the first contact with the server. It waits ``probe_timeout_s`` (at most the request timeout)
        for an answer, and a refused connection, a DNS failure or no answer in time is retried once only, after
        ``backoff_s``, instead of ``max_retries`` times: nothing (or nothing that answers) listens there, and the
        user should hear so in seconds, not after the whole backoff schedule. 5xx still retry.

        Raises:
            ServerUnreachable: connection errors on every attempt, or (``probe``) no answer in time.
            RequestFailed: a non-retryable 4xx, or retryable failures on every attempt.
        """
        url = self.config.url + path
        last = ""
        unreachable = True  # every attempt so far: a connection error, or (probe) no answer in time
        tries = self.config.max_retries + 1
        timeout = httpx.USE_CLIENT_DEFAULT
        if probe:
            wait = min(self.config.probe_timeout_s, self.config.request_timeout_s)
            timeout = httpx.Timeout(wait, connect=self.config.connect_timeout_s)
        for attempt in range(self.config.max_retries + 1):
            if attempt and probe and unreachable and attempt >= 2:
                tries = attempt
                break
            if attempt:
                self.retries += 1
                await asyncio.sleep(self._delay(attempt - 1))
            self.requests += 1
            try:
                async with self._sem:
                    resp = await self._http.request(method, path, json=json, timeout=timeout)
            except httpx.TimeoutException as err:
                unreachable = unreachable and (probe or isinstance(err, httpx.ConnectTimeout))
                limit = (f"no answer in {timeout.read:g} s on first contact (probe_timeout_s)" if probe else
                         f"request_timeout_s={self.config.request_timeout_s:g}")  # fmt: skip
                last = f"timed out ({type(err).__name__}; {limit})"
                logger.warning("%s %s: %s (attempt %d)", method, url, last, attempt + 1)
                continue
            except httpx.TransportError as err:
                unreachable = unreachable and isinstance(err, httpx.ConnectError)
                last = f"{type(err).__name__}: {err}"
                logger.warning("%s %s: %s (attempt %d)", method, url, last, attempt + 1)
                continue
            unreachable = False
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {_error_text(resp)}"
                logger.warning("%s %s: %s (attempt %d)", method, url, last, attempt + 1)
                continue
            if resp.status_code >= 400:
                raise RequestFailed(f"{method} {url} was rejected: HTTP {resp.status_code}: {_error_text(resp)}")
            try:
                return resp.json()
            except ValueError as err:
                raise RequestFailed(f"{method} {url}: the answer is not JSON: {resp.text[:300]!r}") from err
        if unreachable:
            # a first contact refused or unanswered stops after 2 attempts whatever max_retries (--retries) allows
            cut = ", a first contact refused or unanswered is tried twice only"
            cut = cut if tries < self.config.max_retries + 1 else ""
            raise ServerUnreachable(
                f"cannot reach the server at {self.config.url} ({last}; {tries} attempt(s){cut}). Is it running, and "
                "listening on that host and port (SGLang: --host/--port; vLLM: --host/--port)?"
            )
        raise RequestFailed(f"{method} {url} failed after {tries} attempt(s): {last}")

    async def served_models(self, probe: bool = False) -> list[str]:
        """The model ids of ``GET /v1/models`` (``probe``: see :meth:`_request`).

        Raises:
            ServerUnreachable, RequestFailed: see :meth:`_request`.
        """
        body = await self._request("GET", "/models", probe=probe)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise RequestFailed(f"GET {self.config.url}/models: unexpected answer {str(body)[:300]}")
        return [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]

    async def check_model(self) -> str:
        """Make sure the server serves ``config.model`` (or pick its only model when none was given).

        Returns:
            the model name requests will use.
        Raises:
            ServerUnreachable: nothing answers at the URL.
            ModelNotServed: the name is not among the served models, or none was given and the server
                serves several (or none).
        """
        try:
            served = await self.served_models(probe=True)
        except RequestFailed as err:
            if self.model and "HTTP 404" in str(err):  # a server without /v1/models: trust the name
                logger.warning("%s has no /v1/models; using model %r unchecked", self.config.url, self.model)
                return self.model
            raise
        if self.model is None:
            if len(served) != 1:
                raise ModelNotServed(
                    f"the server at {self.config.url} serves {served or 'no model'}; choose one with --model"
                )
            self.model = served[0]
        elif self.model not in served:
            raise ModelNotServed(
                f"the server at {self.config.url} does not serve model {self.model!r}; it serves {served}. "
                "Pass one of these with --model (SGLang: --served-model-name; vLLM: --served-model-name)."
            )
        return self.model

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> ChatResult:
        """``POST /v1/chat/completions`` for ``messages``; ``params`` go into the request body as given
        (``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``tools``, ``tool_choice``, ...; None values are
        dropped).

        Raises:
            ServerUnreachable, RequestFailed: see :meth:`_request`.
        """
        if self.model is None:
            raise EvalClientError("no model name: call check_model() first or give ClientConfig.model")
        body = {"model": self.model, "messages": messages, **{k: v for k, v in params.items() if v is not None}}
        result = _parse_chat(await self._request("POST", "/chat/completions", json=body))
        self.completed += 1
        return result
