"""A verl platform for machines without an accelerator (``VERL_PLATFORM=cpu``).

verl 0.9.1 ships platforms for NVIDIA, Huawei and AMD and falls back to NVIDIA (NCCL) when none is
found. This platform keeps the CUDA platform's Ray integration (each FSDP rank asks for one
*logical* GPU, so start Ray with ``+ray_kwargs.ray_init.num_gpus=<ranks>``) but places tensors on
``cpu`` and communicates with gloo.
"""

from __future__ import annotations

import types
from contextlib import nullcontext
from typing import Any

import torch

from stare_verl.cpu import verl_compat

_PlatformCUDA = verl_compat.cuda_platform_cls()


def _noop(*args, **kwargs) -> None:
    return None


def _zero(*args, **kwargs) -> int:
    return 0


def _mem_get_info(*args, **kwargs) -> tuple[int, int]:
    """(free, total) host memory in bytes, from /proc/meminfo when readable."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if ":" in line}
        return info.get("MemAvailable", 0), info.get("MemTotal", 0)
    except OSError:
        return 0, 0


def _make_device_module() -> types.SimpleNamespace:
    """Stand-in for ``torch.cuda`` with the calls verl makes, as no-ops or host equivalents.

    ``is_available()`` is False: verl uses it to decide whether device memory needs managing.
    """
    return types.SimpleNamespace(
        is_available=lambda: False,
        is_initialized=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: "cpu",
        get_device_name=lambda *a, **k: "cpu",
        set_device=_noop,
        synchronize=_noop,
        empty_cache=_noop,
        ipc_collect=_noop,
        set_per_process_memory_fraction=_noop,
        reset_peak_memory_stats=_noop,
        reset_accumulated_memory_stats=_noop,
        memory_allocated=_zero,
        memory_reserved=_zero,
        max_memory_allocated=_zero,
        max_memory_reserved=_zero,
        mem_get_info=_mem_get_info,
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        get_rng_state=lambda *a, **k: torch.get_rng_state(),
        set_rng_state=lambda state, *a, **k: torch.set_rng_state(state),
        current_stream=torch.cpu.current_stream,
        stream=torch.cpu.stream,
        Stream=torch.cpu.Stream,
        Event=torch.cpu.Event,
        amp=torch.cpu.amp,
    )


class CPUPlatform(_PlatformCUDA):
    """verl platform ``cpu``: tensors on the host, gloo collectives, one logical Ray GPU per rank.

    Selected with ``VERL_PLATFORM=cpu`` only (never auto-detected, so machines with a GPU and
    CPU-only unit tests keep verl's default behaviour).
    """

    _device_module = _make_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return False

    def current_device(self) -> str:
        # verl passes this to ``tensor.to()`` / ``module.to()``; an int would mean an accelerator ordinal.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {}

    def get_collective_module(self) -> Any:
        return None

    def nvtx_range(self, msg: str):
        return nullcontext()

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def cudart(self) -> Any:
        return None
