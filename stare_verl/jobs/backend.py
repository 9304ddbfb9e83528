"""Which machine a training run uses, and the lines that say so (rollout backend, platform, device, sandbox).

``make train-tooluse|shortcot|longcot`` never falls back to the CPU silently on a machine with a GPU:

- ``--cpu``, or no usable NVIDIA GPU: the CPU default (verl's ``cpu`` platform from ``stare_verl.cpu``, the ``hf``
  rollout on the CPU, the family's tiny model);
- a GPU and SGLang importable: the family's GPU recipe under ``recipes/`` with SGLang rollouts;
- a GPU without SGLang: the tiny recipe on verl's CUDA platform, the FSDP actor and the ``hf`` rollout on the GPU,
  with the family's tiny model or ``MODEL=...`` (any Hugging Face causal LM that fits).

:func:`probe_gpu` is the one probe; tests monkeypatch it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal

import torch

PathName = Literal["cpu", "gpu-sglang", "gpu-hf"]


@dataclass(frozen=True)
class GpuProbe:
    """What this machine offers a run.

    Attributes:
        gpu: an NVIDIA GPU is listed by ``nvidia-smi -L`` and torch was built with CUDA.
        name: the first GPU's name (e.g. ``"NVIDIA H200"``), None without one.
        sglang: SGLang is importable (the ``gpu`` extra).
        listed: the first GPU ``nvidia-smi -L`` lists, whether or not torch can use it.
        problem: why a GPU that seems to be there is not used (torch built without CUDA, CUDA not available to
            this torch, ``nvidia-smi`` failing or hanging); None when there is a usable GPU or plainly none.
    """

    gpu: bool
    name: str | None
    sglang: bool
    listed: str | None = None
    problem: str | None = None

    def idle_gpu_warning(self) -> str | None:
        """The console warning for a GPU this run cannot use (None when there is none such)."""
        if self.gpu or self.problem is None:
            return None
        what = f"nvidia-smi lists {self.listed}, but {self.problem}" if self.listed else self.problem
        return (
            f"warning: {what}, so the run trains on the CPU and leaves any GPU idle. For the GPU path install a "
            "CUDA build of torch that matches the driver (pip install -e '.[gpu]', or make install in a new venv "
            "on this machine) and check CUDA_VISIBLE_DEVICES; --cpu asks for the CPU and silences this."
        )


NVIDIA_SMI_TIMEOUT_S = 30
NVIDIA_SMI_NO_DEVICES = 6
"""``nvidia-smi``'s exit status for "No devices were found": a machine without a GPU, not a problem."""


def probe_gpu() -> GpuProbe:
    """Probe once: ``nvidia-smi -L`` (bounded by :data:`NVIDIA_SMI_TIMEOUT_S`), whether this torch can use the GPU
    it lists (built with CUDA and ``torch.cuda.is_available()``), and whether SGLang can be imported."""
    name = problem = None
    if shutil.which("nvidia-smi") is not None:
        try:
            out = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            out, problem = None, f"nvidia-smi -L did not answer within {NVIDIA_SMI_TIMEOUT_S} s"
        except OSError as err:
            out, problem = None, f"nvidia-smi could not run ({err})"
        if out is not None and out.returncode == 0:
            first = next((line for line in out.stdout.splitlines() if line.startswith("GPU ")), None)
            if first is not None:
                name = first.split(":", 1)[1].split("(UUID")[0].strip() or "NVIDIA GPU"
        elif out is not None and out.returncode != NVIDIA_SMI_NO_DEVICES:
            said = next((ln.strip() for ln in (out.stderr + out.stdout).splitlines() if ln.strip()), "")
            problem = f"nvidia-smi -L failed (exit {out.returncode}{': ' + said if said else ''})"
    gpu = False
    if name is not None:
        if not torch.backends.cuda.is_built():
            problem = f"this torch ({torch.__version__}) was built without CUDA"
        elif not torch.cuda.is_available():
            problem = (
                f"this torch ({torch.__version__}, CUDA {torch.version.cuda}) cannot use it (torch.cuda.is_available() "
                f"is False; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r})"
            )
        else:
            gpu = True
    return GpuProbe(
        gpu=gpu,
        name=name if gpu else None,
        sglang=importlib.util.find_spec("sglang") is not None,
        listed=name,
        problem=problem,
    )


@dataclass(frozen=True)
class RunBackend:
    """Where a run's parts execute (the first lines of ``train.log`` and ``summary.json["backend"]``).

    Attributes:
        path: ``cpu`` (the CPU default), ``gpu-sglang`` (the GPU recipe) or ``gpu-hf`` (tiny recipe on the GPU).
        rollout: verl's ``actor_rollout_ref.rollout.name`` (``hf`` or ``sglang``).
        platform: verl's platform (``cpu`` for ``stare_verl.cpu``'s, ``cuda`` for NVIDIA).
        device: where the actor and the rollout run (``cpu`` or ``cuda (<GPU name>)``).
        sandbox: the Python tool's sandbox backend (``bwrap``, ``unshare``, ...), ``none`` without a tool.
    """

    path: PathName
    rollout: str
    platform: str
    device: str
    sandbox: str = "none"

    def line(self) -> str:
        """One line for the console and the log."""
        return (
            f"rollout backend {self.rollout}, platform {self.platform}, device {self.device}, "
            f"sandbox {self.sandbox}"
        )

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def choose_backend(probe: GpuProbe, force_cpu: bool = False) -> RunBackend:
    """The run path for this machine (see the module docstring); the sandbox is filled in by the caller."""
    if force_cpu or not probe.gpu:
        return RunBackend("cpu", rollout="hf", platform="cpu", device="cpu")
    device = f"cuda ({probe.name})"
    if probe.sglang:
        return RunBackend("gpu-sglang", rollout="sglang", platform="cuda", device=device)
    return RunBackend("gpu-hf", rollout="hf", platform="cuda", device=device)


def sandbox_backend(tool_config_path: str | Path | None) -> str:
    """The sandbox backend the Python tool of ``tool_config_path`` (verl's ``multi_turn.tool_config_path``) gets
    on this machine: ``bwrap``, or its fallback ``unshare`` (or ``subprocess`` where the config allows it), as
    ``envs.sandbox.make_sandbox`` probes them; ``none`` without a tool config or a sandboxed tool.

    Returns ``unavailable (<reason>)`` when no allowed backend works (the run's tool calls will then fail).
    """
    if not tool_config_path:
        return "none"
    import yaml

    from envs.sandbox import SandboxUnavailable, make_sandbox

    tools = (yaml.safe_load(Path(tool_config_path).read_text()) or {}).get("tools") or []
    configs = [(t.get("config") or {}).get("sandbox") for t in tools if "sandbox" in (t.get("config") or {})]
    if not configs:
        return "none"
    try:
        return make_sandbox(configs[0]).name
    except SandboxUnavailable as err:
        return f"unavailable ({err})"


@contextlib.contextmanager
def stderr_to(sink: IO[bytes]):
    """Send everything written to stderr while the block runs to ``sink`` (a binary file): file descriptor 2
    (logging handlers, C extensions) and ``sys.stderr`` (Python warnings; it may be another object than fd 2).

    Used around the driver's first import of verl: its optional-engine and accelerator-probe warnings
    (torchtitan, veomni, megatron, "No supported accelerator detected") belong in ``train.log``, not on the console.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    text = open(os.dup(sink.fileno()), "w", buffering=1, errors="replace")  # noqa: SIM115 - closed below
    try:
        os.dup2(sink.fileno(), 2)
        with contextlib.redirect_stderr(text):
            yield sink
    finally:
        text.flush()
        _repoint_log_handlers(text, sys.stderr)  # redirect_stderr has restored sys.stderr by now
        text.close()
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _repoint_log_handlers(old: IO[str], new: IO[str]) -> None:
    """Logging handlers made while ``old`` was ``sys.stderr`` (verl's import adds a root ``StreamHandler``) write to
    ``new`` instead: ``old`` is about to be closed, and a warning logged through them later would fail with
    "I/O operation on closed file" (a logging traceback on the console instead of the warning)."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]  # fmt: skip
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                handler.setStream(new)
            # transformers' handler also binds the stream's flush at creation (handler.flush = sys.stderr.flush)
            bound = handler.__dict__.get("flush")
            if getattr(bound, "__self__", None) is old:
                handler.flush = new.flush


def in_hf_cache(model: str) -> bool:
    """Whether the Hugging Face hub id ``model`` has its ``config.json`` in the local cache (loads offline);
    False for anything that is not a valid repo id. Never downloads, never raises."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model, "config.json"), str)
    except Exception:  # noqa: BLE001 - not a valid repo id either
        return False
