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
        listed: the first GPU ``nvidia-smi -L`` lists, whether or not torch can use it (a CPU-only torch build
            on a GPU machine: ``gpu`` is False and ``listed`` names the GPU the run leaves idle).
    """

    gpu: bool
    name: str | None
    sglang: bool
    listed: str | None = None

    def idle_gpu_warning(self) -> str | None:
        """The console warning for a GPU that this torch cannot use (None when there is none such)."""
        if self.gpu or self.listed is None:
            return None
        return (
            f"warning: nvidia-smi lists {self.listed}, but this torch ({torch.__version__}) was built without "
            "CUDA, so the run trains on the CPU and leaves the GPU idle. Install a CUDA build "
            "(pip install -e '.[gpu]', or make install on this machine in a new venv) to train on it."
        )


def probe_gpu() -> GpuProbe:
    """Probe once: ``nvidia-smi -L`` (no CUDA context is created here) and whether SGLang can be imported."""
    name = None
    if shutil.which("nvidia-smi") is not None:
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0:
            first = next((line for line in out.stdout.splitlines() if line.startswith("GPU ")), None)
            if first is not None:
                name = first.split(":", 1)[1].split("(UUID")[0].strip() or "NVIDIA GPU"
    gpu = name is not None and torch.backends.cuda.is_built()
    return GpuProbe(
        gpu=gpu, name=name if gpu else None, sglang=importlib.util.find_spec("sglang") is not None, listed=name
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
        text.close()
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
