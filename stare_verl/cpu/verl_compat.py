"""Every touch point of the CPU backend on verl internals, in one place.

verl 0.9.1 has no CPU path for its V1 trainer. The CPU backend needs:

1. a platform registered under ``cpu`` (``verl.plugin.platform.PlatformRegistry``, a supported hook);
2. the ``hf`` rollout in verl's two rollout registries: the private dict
   ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` (in-worker adapter) and the public
   ``RolloutReplicaRegistry`` (server replica), on any platform; its replica reads verl's platform
   (``get_platform()``: device name, visible-devices and Ray "noset" variables) to share a GPU;
3. four patches of verl internals that assume an accelerator:
   - ``verl.utils.distributed.initialize_global_process_group_ray`` (Ray workers) and
     ``initialize_global_process_group`` (torchrun: ``verl.trainer.sft_trainer``) build the backend string
     ``"cpu:gloo,cpu:gloo"`` (invalid) when the device is ``cpu``: plain ``"gloo"`` is used instead;
   - the FSDP engines are registered only for the ``cuda``/``npu`` device keys of
     ``verl.workers.engine.EngineRegistry``: they are registered for ``cpu`` as well;
   - ``verl.trainer.ppo.v1.replay_buffer.ReplayBuffer`` polls every 2 s (hard-coded default), which
     dominates a tiny CPU step: the default becomes ``STARE_VERL_CPU_POLL_INTERVAL`` (0.05 s);
   - ``verl.utils.torch_functional.logprobs_from_logits_v2`` (the log-prob path without flash-attn, i.e. every
     CPU run) computes one ``logsumexp`` per token in a Python loop (a GPU memory saving), forward and
     backward: on the CPU it works on blocks of rows instead (:func:`blockwise_logprobs`, same values);
4. two patches that give every request of the ``hf`` rollout a seed that does not depend on which replica serves
   it (``stare_verl.cpu.rollout_seeds``), on any platform and only when ``rollout.name`` is ``hf``:
   - ``verl.trainer.ppo.v1.agent_loop_tq.AgentLoopManagerTQ.generate_sequences`` (trainer process: the V1
     trainer's only way to hand a batch to the agent-loop workers) adds a per-row seed column to a shallow copy
     of the batch before it is split across the workers;
   - ``verl.experimental.agent_loop.agent_loop.AgentLoopWorker._run_agent_loop`` (agent-loop worker actors) takes
     that column out of the row's fields and puts each session's seed into its ``sampling_params``.

These move between verl releases, so this module checks the installed verl version at import (the one gate
of ``stare_verl.verl_compat``) and raises :class:`VerlVersionError` on anything but
:data:`PINNED_VERL_VERSION`.

Patches 2, 3 and 4 are applied lazily, when verl imports the module they touch (an import hook), so that
the plugin stays cheap while ``verl/__init__`` is still importing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable

from stare_verl.verl_compat import PINNED_VERL_VERSION, VerlVersionError, check_verl_version  # noqa: F401

logger = logging.getLogger(__name__)

check_verl_version()

# Environment variable names (verl's and ours).
PLATFORM_ENV = "VERL_PLATFORM"
POLL_INTERVAL_ENV = "STARE_VERL_CPU_POLL_INTERVAL"
DEFAULT_POLL_INTERVAL_S = 0.05

# Module paths and attribute names of verl touched here.
_DISTRIBUTED_MODULE = "verl.utils.distributed"
_ROLLOUT_BASE_MODULE = "verl.workers.rollout.base"
_ROLLOUT_REPLICA_MODULE = "verl.workers.rollout.replica"
_FSDP_ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
_REPLAY_BUFFER_MODULE = "verl.trainer.ppo.v1.replay_buffer"
_TORCH_FUNCTIONAL_MODULE = "verl.utils.torch_functional"
_AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
_AGENT_LOOP_TQ_MODULE = "verl.trainer.ppo.v1.agent_loop_tq"


def platform_is_cpu() -> bool:
    """True when verl's platform is selected as ``cpu`` through ``VERL_PLATFORM``."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == "cpu"


# --------------------------------------------------------------------------------------------------
# Post-import hooks: run a patch right after verl imports a module (or at once if already imported).
# --------------------------------------------------------------------------------------------------

_hooks: dict[str, list[Callable]] = {}
_hooks_lock = threading.RLock()


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, wrapped: importlib.abc.Loader, name: str):
        self._wrapped = wrapped
        self._name = name

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module):
        self._wrapped.exec_module(module)
        _run_hooks(self._name, module)

    def __getattr__(self, item):  # get_code, get_source, is_package, ... of the wrapped loader
        return getattr(self._wrapped, item)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None


_finder = _PostImportFinder()


def _run_hooks(name: str, module) -> None:
    with _hooks_lock:
        hooks = _hooks.pop(name, [])
    for hook in hooks:
        hook(module)


def when_imported(module_name: str, hook: Callable) -> None:
    """Call ``hook(module)`` once ``module_name`` is imported (immediately if it already is)."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        hook(module)
        return
    with _hooks_lock:
        _hooks.setdefault(module_name, []).append(hook)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


# --------------------------------------------------------------------------------------------------
# Registries
# --------------------------------------------------------------------------------------------------


def register_platform(name: str, platform_cls: type) -> None:
    """Register a ``verl.plugin.platform.PlatformBase`` subclass under ``name`` (verl's public hook)."""
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get(name) is not platform_cls:
        PlatformRegistry.register(platform=name)(platform_cls)


def register_rollout(name: str, adapter_fqdn: str, replica_loader: Callable[[], type]) -> None:
    """Register a rollout backend in verl's two rollout registries, when verl imports them.

    Args:
        name: value of ``actor_rollout_ref.rollout.name``.
        adapter_fqdn: ``"module.Class"`` of the in-worker ``BaseRollout`` adapter.
        replica_loader: zero-argument callable returning the ``RolloutReplica`` subclass.
    """

    def _adapter(module):
        module._ROLLOUT_REGISTRY[(name, "async")] = adapter_fqdn

    def _replica(module):
        module.RolloutReplicaRegistry.register(name, replica_loader)

    when_imported(_ROLLOUT_BASE_MODULE, _adapter)
    when_imported(_ROLLOUT_REPLICA_MODULE, _replica)


# --------------------------------------------------------------------------------------------------
# Patches needed by the cpu platform
# --------------------------------------------------------------------------------------------------


def _patch_process_group(module) -> None:
    original = module.initialize_global_process_group_ray
    if getattr(original, "_stare_cpu_patched", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        # verl composes f"cpu:gloo,{device}:{backend}", i.e. "cpu:gloo,cpu:gloo" on CPU, which
        # torch.distributed rejects (duplicate device key); gloo alone covers CPU tensors.
        if backend is None or backend.replace(" ", "") in ("cpu:gloo,cpu:gloo", "cpu:gloo"):
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray._stare_cpu_patched = True
    module.initialize_global_process_group_ray = initialize_global_process_group_ray
    # Modules that imported the function by name before this patch.
    for mod_name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        mod = sys.modules.get(mod_name)
        if mod is not None and getattr(mod, "initialize_global_process_group_ray", None) is original:
            mod.initialize_global_process_group_ray = initialize_global_process_group_ray
    _patch_torchrun_process_group(module)


def _patch_torchrun_process_group(module) -> None:
    """The torchrun initialiser (``verl.trainer.sft_trainer.run_sft``) builds the same invalid backend string
    and then calls ``set_device(local_rank)`` on the platform's device module (a no-op on ``cpu``)."""
    original = module.initialize_global_process_group
    if getattr(original, "_stare_cpu_patched", False):
        return

    def initialize_global_process_group(timeout_second=36000):
        import datetime

        import torch.distributed

        torch.distributed.init_process_group(
            backend="gloo",
            timeout=datetime.timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    initialize_global_process_group._stare_cpu_patched = True
    module.initialize_global_process_group = initialize_global_process_group


def _patch_engine_registry(module) -> None:
    from verl.workers.engine.base import EngineRegistry

    for backends in EngineRegistry._engines.values():
        for backend in ("fsdp", "fsdp2"):
            keys = backends.get(backend)
            if keys is not None and "cuda" in keys and "cpu" not in keys:
                keys["cpu"] = keys["cuda"]


def _patch_replay_buffer(module) -> None:
    cls = module.ReplayBuffer
    original_init = cls.__init__
    if getattr(original_init, "_stare_cpu_patched", False):
        return

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("poll_interval", poll_interval_s())
        original_init(self, *args, **kwargs)

    __init__._stare_cpu_patched = True
    cls.__init__ = __init__


LOGPROB_BLOCK_ELEMENTS = 1 << 24
"""Logit entries per block of :func:`blockwise_logprobs` (64 MiB of float32 temporaries at most)."""


def blockwise_logprobs(logits, labels):
    """Log-probabilities of ``labels`` under ``logits``: verl's ``logprobs_from_logits_v2`` on blocks of rows.

    Args:
        logits: ``[..., V]`` float tensor (float32/float64: ``x_y - logsumexp(x)``; bf16/fp16: ``log_softmax``
            then gather, as verl does for them).
        labels: ``[...]`` int64 token ids.

    Returns:
        ``[...]`` tensor of the logits' dtype (nats). verl loops over the first dimension, which for its
        padding-free batches (``[tokens, V]``) is one ``logsumexp`` per token; blocks of
        :data:`LOGPROB_BLOCK_ELEMENTS` logits bound the temporaries as well, with a few calls per batch.
    """
    import torch
    import torch.nn.functional as F

    if logits.dim() == 1:
        logits, labels, squeeze = logits.unsqueeze(0), labels.unsqueeze(0), True
    else:
        squeeze = False
    rows = max(1, LOGPROB_BLOCK_ELEMENTS // max(1, logits[0].numel()))
    out = []
    for x, y in zip(logits.split(rows), labels.split(rows), strict=True):
        if x.dtype in (torch.float32, torch.float64):
            out.append(x.gather(-1, y.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1))
        else:
            out.append(F.log_softmax(x, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1))
    result = torch.cat(out)
    return result.squeeze(0) if squeeze else result


def _patch_logprobs(module) -> None:
    if getattr(module.logprobs_from_logits_v2, "_stare_cpu_patched", False):
        return
    patched = blockwise_logprobs
    patched._stare_cpu_patched = True
    module.logprobs_from_logits_v2 = patched  # logprobs_from_logits looks it up in the module at each call


def poll_interval_s() -> float:
    """Replay-buffer poll interval on CPU, from ``STARE_VERL_CPU_POLL_INTERVAL`` (seconds, > 0)."""
    raw = os.environ.get(POLL_INTERVAL_ENV, "")
    if not raw:
        return DEFAULT_POLL_INTERVAL_S
    try:
        value = float(raw)
    except ValueError as e:
        raise ValueError(f"{POLL_INTERVAL_ENV} must be a number of seconds, got {raw!r}") from e
    if not value > 0:
        raise ValueError(f"{POLL_INTERVAL_ENV} must be > 0, got {value}")
    return value


def install_cpu_patches() -> None:
    """Apply the patches the ``cpu`` platform needs (lazily, as verl imports the patched modules)."""
    when_imported(_DISTRIBUTED_MODULE, _patch_process_group)
    when_imported(_FSDP_ENGINE_MODULE, _patch_engine_registry)
    when_imported(_REPLAY_BUFFER_MODULE, _patch_replay_buffer)
    when_imported(_TORCH_FUNCTIONAL_MODULE, _patch_logprobs)


# --------------------------------------------------------------------------------------------------
# Routing-independent seeds of the hf rollout (any platform)
# --------------------------------------------------------------------------------------------------


def add_row_seeds(manager, prompts, rollout_name: str):
    """The batch ``prompts`` (a TensorDict of ``B`` rows, as verl's V1 trainer hands it to
    ``AgentLoopManagerTQ.generate_sequences``) with the int64 column
    :data:`~stare_verl.cpu.rollout_seeds.SEED_KEY` of :func:`~stare_verl.cpu.rollout_seeds.row_seeds` added,
    in a shallow copy (the caller's batch is left as it is).

    The seeds depend on ``rollout.seed``, the batch's ``global_steps`` and ``validate`` entries, how many batches
    of that step and kind ``manager`` was handed before (counted on ``manager``) and each row's position; they are
    added only when ``manager.config.actor_rollout_ref.rollout.name == rollout_name`` and the batch has a
    ``global_steps`` entry; otherwise ``prompts`` is returned unchanged.
    """
    import torch
    from verl.utils import tensordict_utils as tu

    from stare_verl.cpu.rollout_seeds import SEED_KEY, row_seeds

    rollout = manager.config.actor_rollout_ref.rollout
    steps = tu.get_non_tensor_data(prompts, "global_steps", None)
    if rollout.get("name") != rollout_name or steps is None:
        return prompts
    validate = bool(tu.get_non_tensor_data(prompts, "validate", False))
    counts = manager.__dict__.setdefault("_stare_seed_submissions", {})
    submission = counts.get((int(steps), validate), 0)
    counts[(int(steps), validate)] = submission + 1
    seeds = row_seeds(int(rollout.get("seed", 0) or 0), int(steps), validate, submission, len(prompts))
    out = prompts.copy()
    out[SEED_KEY] = torch.tensor(seeds, dtype=torch.int64)
    return out


def seeded_sampling_params(sampling_params: dict, trajectory: dict, kwargs: dict) -> dict:
    """The sampling parameters of one agent-loop session: when its row's fields ``kwargs`` hold a
    :data:`~stare_verl.cpu.rollout_seeds.SEED_KEY` entry (removed from ``kwargs`` here, in place), a copy of
    ``sampling_params`` with ``seed`` = :func:`~stare_verl.cpu.rollout_seeds.session_seed` of it and the session
    (``kwargs["session_id"]``, else ``trajectory["rollout_n"]``); otherwise ``sampling_params`` itself."""
    from stare_verl.cpu.rollout_seeds import SEED_KEY, session_seed

    row_seed = kwargs.pop(SEED_KEY, None)
    if row_seed is None:
        return sampling_params
    session = kwargs.get("session_id", trajectory.get("rollout_n", 0))
    return {**sampling_params, "seed": session_seed(int(row_seed), int(session))}


def _patch_agent_loop_manager(rollout_name: str) -> Callable:
    def patch(module) -> None:
        cls = module.AgentLoopManagerTQ
        original = cls.generate_sequences
        if getattr(original, "_stare_seeds_patched", False):
            return

        def generate_sequences(self, prompts):
            return original(self, add_row_seeds(self, prompts, rollout_name))

        generate_sequences._stare_seeds_patched = True
        generate_sequences.__wrapped__ = original
        generate_sequences.__doc__ = original.__doc__
        cls.generate_sequences = generate_sequences

    return patch


def _patch_agent_loop_worker(module) -> None:
    cls = module.AgentLoopWorker
    original = cls._run_agent_loop
    if getattr(original, "_stare_seeds_patched", False):
        return

    async def _run_agent_loop(self, sampling_params, trajectory, **kwargs):
        sampling_params = seeded_sampling_params(sampling_params, trajectory, kwargs)
        return await original(self, sampling_params, trajectory, **kwargs)

    _run_agent_loop._stare_seeds_patched = True
    _run_agent_loop.__wrapped__ = original
    cls._run_agent_loop = _run_agent_loop


def install_rollout_seeds(rollout_name: str) -> None:
    """Give the requests of rollout ``rollout_name`` routing-independent seeds (lazily, as verl imports the agent
    loop modules): :func:`add_row_seeds` in the trainer process, :func:`seeded_sampling_params` in the agent-loop
    workers. Must run in every process that imports verl (the plugin does)."""
    when_imported(_AGENT_LOOP_TQ_MODULE, _patch_agent_loop_manager(rollout_name))
    when_imported(_AGENT_LOOP_MODULE, _patch_agent_loop_worker)


# --------------------------------------------------------------------------------------------------
# verl types used by the backend (imported on use: they pull in ray and verl's worker stack)
# --------------------------------------------------------------------------------------------------


def base_rollout_cls():
    """``verl.workers.rollout.base.BaseRollout``."""
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


def rollout_replica_cls():
    """``verl.workers.rollout.replica.RolloutReplica``."""
    from verl.workers.rollout.replica import RolloutReplica

    return RolloutReplica


def token_output_cls():
    """``verl.workers.rollout.replica.TokenOutput`` (what the agent loop expects from ``generate``)."""
    from verl.workers.rollout.replica import TokenOutput

    return TokenOutput


def rollout_mode_enum():
    """``verl.workers.rollout.replica.RolloutMode``."""
    from verl.workers.rollout.replica import RolloutMode

    return RolloutMode


def to_dataclass(config, dataclass_type=None):
    """``verl.utils.config.omega_conf_to_dataclass`` (DictConfig -> verl config dataclass)."""
    from verl.utils.config import omega_conf_to_dataclass

    if dataclass_type is None:
        return omega_conf_to_dataclass(config)
    return omega_conf_to_dataclass(config, dataclass_type=dataclass_type)


def hf_model_config_cls():
    """``verl.workers.config.HFModelConfig``."""
    from verl.workers.config import HFModelConfig

    return HFModelConfig


def platform_device_info() -> tuple[str, str, list[str]]:
    """verl's current platform as a rollout replica needs it: ``(device_name, visible-devices env var,
    Ray's "do not set the visible devices" env vars)``, e.g. ``("cuda", "CUDA_VISIBLE_DEVICES",
    ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"])``; the ``cpu`` platform answers ``"cpu"`` first."""
    from verl.plugin.platform import get_platform

    platform = get_platform()
    return platform.device_name, platform.visible_devices_envvar(), list(platform.ray_noset_envvars())


def cuda_platform_cls():
    """``verl.plugin.platform.platform_cuda.PlatformCUDA`` (the CPU platform's base class)."""
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    return PlatformCUDA
