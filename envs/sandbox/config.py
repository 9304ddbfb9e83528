"""Configuration and result types of the Python sandbox (pydantic models)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, model_validator

BackendName = Literal["auto", "bwrap", "unshare", "subprocess", "remote"]

UID_SLOTS = 1000
"""How many uid ranges there are (``SandboxConfig.uid_base + slot * UID_SLOT_SIZE``, slot < UID_SLOTS)."""
UID_SLOT_SIZE = 8192
"""uids per range: a range serves one ``LocalSandbox`` (``max_concurrency + max_sessions`` of them)."""
UID_BASE_MIN = 100000
"""The lowest ``uid_base``: below it the sandbox's ranges could cover ordinary users' and system uids (the clean-up
after a call kills every process of a slot's uid)."""
UID_BASE_MAX = 2**31 - 1 - UID_SLOTS * UID_SLOT_SIZE
"""The highest ``uid_base``: every range stays below 2**31 (uids above are not portable)."""


class ExecLimits(BaseModel):
    """Resource limits applied to every call.

    Units: seconds for times, MiB for sizes, bytes for ``max_output_bytes``. The wall-clock
    ``timeout_s`` is enforced by the host (the whole process tree is killed at the deadline); the others
    are rlimits set inside the sandbox before the model's code runs, soft = hard for every one (the code can
    never raise them again), in cold calls and sessions, on every local backend. CPU: a CPU-time timer ends the
    program with SIGPROF at ``cpu_s`` (a visible cause) and RLIMIT_CPU, one second above, is the kernel's kill.

    Sessions: ``cpu_s`` is per call; ``session_cpu_s`` is the session interpreter's RLIMIT_CPU over all its
    calls. The host also accounts the session's CPU from outside (every process of the sandbox): a call that
    used more than ``cpu_s`` + 1 s, CPU used between calls, or a thread still alive after its call ends the
    session (the next call starts a fresh interpreter and says so).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(10.0, gt=0, le=3600, description="wall-clock limit per call (s)")
    cpu_s: int = Field(10, ge=1, le=3600, description="CPU seconds per process and call")
    session_cpu_s: int | None = Field(
        None, ge=1, le=86400,
        description="CPU seconds of a session's interpreter over all its calls (None: 10 x cpu_s)",
    )
    memory_mb: int = Field(1024, ge=64, le=1 << 20, description="RLIMIT_AS address space (MiB)")
    file_size_mb: int = Field(32, ge=1, le=1 << 20, description="RLIMIT_FSIZE largest file written (MiB)")
    open_files: int = Field(64, ge=16, le=65536, description="RLIMIT_NOFILE")
    max_processes: int = Field(
        64, ge=4, le=65536, description="RLIMIT_NPROC, enforced only when the sandbox runs under its own uid"
    )
    tmp_size_mb: int = Field(64, ge=1, le=1 << 20, description="size of the private /tmp (bwrap)")
    max_output_bytes: int = Field(
        8192, ge=256, le=1 << 26, description="bytes kept per stream (head + tail); the rest is cut with a marker"
    )
    max_code_bytes: int = Field(1 << 20, ge=1, description="larger programs are refused without running")

    def rlimits(self, with_nproc: bool) -> dict[str, int]:
        """The rlimits (resource module names -> value) the driver applies inside the sandbox."""
        mib = 1 << 20
        out = {
            "RLIMIT_CPU": int(self.cpu_s),
            "RLIMIT_AS": int(self.memory_mb) * mib,
            "RLIMIT_FSIZE": int(self.file_size_mb) * mib,
            "RLIMIT_NOFILE": int(self.open_files),
            "RLIMIT_CORE": 0,
        }
        if with_nproc:
            out["RLIMIT_NPROC"] = int(self.max_processes)
        return out

    @property
    def session_cpu_budget(self) -> int:
        """CPU seconds of a session's interpreter over all its calls (``session_cpu_s``, default 10 x cpu_s;
        never below one call's ``cpu_s`` + 1)."""
        budget = self.session_cpu_s if self.session_cpu_s is not None else 10 * int(self.cpu_s)
        return max(int(budget), int(self.cpu_s) + 1)


class RemoteConfig(BaseModel):
    """A SandboxFusion-compatible HTTP service (``POST {url}/run_code``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: HttpUrl
    request_timeout_margin_s: float = Field(
        10.0, ge=0, description="added to the call's timeout_s for the HTTP request timeout"
    )
    connect_timeout_s: float = Field(5.0, gt=0)
    max_retries: int = Field(3, ge=0, le=20, description="retries on transport errors, 5xx and SandboxError")
    backoff_s: float = Field(0.5, ge=0, description="first retry delay; doubled each retry, with jitter")
    max_concurrency: int = Field(32, ge=1, le=4096, description="requests in flight at once")
    language: str = "python"


class SandboxConfig(BaseModel):
    """Which backend to use and how.

    ``backend='auto'`` probes bwrap, then unshare; the plain subprocess backend (no network or
    filesystem isolation) is only chosen, or accepted, with ``allow_unsafe=True``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: BackendName = "auto"
    allow_unsafe: bool = Field(False, description="allow the subprocess backend (not network-isolated)")
    limits: ExecLimits = Field(default_factory=ExecLimits)
    max_concurrency: int = Field(8, ge=1, le=1024, description="sandboxed calls running at once")
    max_sessions: int = Field(64, ge=1, le=4096, description="live persistent sessions; the idlest is evicted")
    session_idle_s: float = Field(
        900.0, gt=0, description="a session unused this long is closed (its trajectory is assumed finished)"
    )
    idle_tmp_mb: int = Field(
        1024, ge=1, le=1 << 20,
        description=(
            "the files idle sessions hold in their private /tmp and /dev/shm (tmpfs: host memory, outside each "
            "call's memory_mb) are counted after every call; beyond this total the least recently used idle "
            "sessions are closed (bwrap, unshare; the subprocess backend's files are on disk and not counted)"
        ),
    )
    python: str = Field(
        "auto",
        description=(
            "interpreter that runs the code (absolute host path), or 'auto': $STARE_SANDBOX_PYTHON, else the "
            "project's .venv-sandbox (make sandbox-python: numpy, sympy, scipy, mpmath, matplotlib), else "
            "/usr/bin/python3 (envs/sandbox/interpreter.py); a virtualenv's directory is bound read-only"
        ),
    )
    expected_modules: tuple[str, ...] = Field(
        ("numpy", "sympy", "scipy", "mpmath", "matplotlib"),
        description="modules the start-up probe checks for; missing ones are reported in a warning",
    )
    ro_binds: tuple[str, ...] = Field(
        ("/usr", "/etc/alternatives", "/etc/ssl/certs", "/etc/localtime", "/etc/fonts"),
        description="host paths visible read-only in the bwrap sandbox (missing ones are skipped)",
    )
    extra_ro_binds: tuple[str, ...] = Field((), description="more read-only paths, e.g. a venv with numpy")
    hide_paths: tuple[str, ...] = Field(
        ("/root", "/home", "/work", "/mnt", "/srv", "/opt", "/run", "/var", "/media"),
        description="unshare backend: host paths covered by an empty tmpfs (bwrap shows nothing unlisted)",
    )
    uid_base: int = Field(
        200000, ge=UID_BASE_MIN, le=UID_BASE_MAX,
        description=(
            "when run as root, each sandbox runs under its own uid, from a range of 8192 uids at uid_base + "
            "slot * 8192 that one LocalSandbox of the machine holds at a time (a lock file per block of 8192 uids "
            "of the machine's uid space, so pools with different uid_base never share a uid); at least 100000, so "
            "no range covers ordinary users' uids"
        ),
    )
    remote: RemoteConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> SandboxConfig:
        if self.backend == "remote" and self.remote is None:
            raise ValueError("backend 'remote' needs a 'remote' section with the service url")
        if self.python != "auto" and not self.python.startswith("/"):
            raise ValueError(f"python must be 'auto' or an absolute path, got {self.python!r}")
        return self


class ExecResult(BaseModel):
    """What one sandboxed call produced.

    ``exit_code`` is the program's status (None when it was killed at the deadline or never ran; for
    the local backends a status above 128 means the program died of signal ``status - 128``).
    ``stdout``/``stderr`` are decoded as UTF-8 with replacement characters and cut to
    ``max_output_bytes`` each (``truncated`` then True and a marker is inside the text).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    oom: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    backend: str = ""
    sandbox_error: str | None = Field(None, description="set when the sandbox itself failed (not the code)")
    session_restarted: bool = Field(
        False, description="an earlier session interpreter was lost (timeout, crash) and a fresh one started"
    )

    @property
    def ok(self) -> bool:
        """True when the program ran to completion with status 0."""
        return self.exit_code == 0 and not self.timed_out and self.sandbox_error is None
