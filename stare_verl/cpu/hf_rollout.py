"""verl glue of the ``hf`` rollout: the in-worker adapter (``BaseRollout``) and the ``RolloutReplica``.

- :class:`HFReplica` launches one :class:`~stare_verl.cpu.hf_server.HFGenerationServer` Ray actor per
  replica, on the node of the replica's first trainer rank, named ``hf_server_<replica_rank>``. On an
  accelerator platform (verl's CUDA platform) the server shares the GPU of that rank, as verl's SGLang replica
  does: it asks Ray for no GPU, is started with Ray's "do not set CUDA_VISIBLE_DEVICES" variables and picks
  the ranks' GPU among those it sees (:func:`~stare_verl.cpu.hf_server.server_cuda_ordinal`);
  on the ``cpu`` platform nothing of this applies. With ``engine_kwargs.hf.resources`` set the server asks Ray
  for those resources instead and runs wherever Ray finds them (e.g. rollout nodes apart from the actor's):
  verl still sees a hybrid-engine replica, and the weight sync below crosses nodes through Ray.
- :class:`HFServerAdapter` lives in every FSDP worker (hybrid engine). On each weight sync every rank
  drains verl's weight iterator (it all-gathers FSDP2 shards, so a rank that stopped early would hang
  the others); the replica's first rank sends the tensors to its server in buckets of
  ``checkpoint_engine.update_weights_bucket_megabytes`` and then the new ``global_steps``.
"""

from __future__ import annotations

import asyncio
import logging
import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from stare_verl.cpu import verl_compat
from stare_verl.cpu.hf_server import HFGenerationServer, hf_options

logger = logging.getLogger(__name__)

_BaseRollout = verl_compat.base_rollout_cls()
_RolloutReplica = verl_compat.rollout_replica_cls()


def server_actor_name(replica_rank: int, name_suffix: str = "", role: str = "") -> str:
    """Ray actor name of replica ``replica_rank``'s generation server (``role``: "", "reward", "teacher")."""
    prefix = f"hf_server_{role}_" if role else "hf_server_"
    return f"{prefix}{replica_rank}{name_suffix}"


def _replica_world_size(config) -> int:
    return config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size


async def _iterate(weights):
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


class HFServerAdapter(_BaseRollout):
    """verl ``BaseRollout`` for the ``hf`` backend, one per trainer rank (hybrid engine).

    Memory calls (``resume``/``release``) are no-ops: the server keeps its weights resident (CPU or GPU).
    """

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = _replica_world_size(self.config)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_leader = rank % world == 0
        self._server = None

    def _server_handle(self):
        if self._server is None and self.is_leader:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        """Send the actor's full HF-named tensors to this replica's server.

        Args:
            weights: iterator of ``(name, tensor)`` (sync or async), drained completely on every rank.
            wire_format: only ``"named_tensors"``.
            kwargs: ``global_steps`` (weight version), ``peft_config`` (must be None: merge LoRA).

        Raises:
            NotImplementedError: delta wire format or LoRA adapters.
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"hf rollout supports wire_format='named_tensors' only, got {wire_format!r}"
            )
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError(
                "hf rollout cannot serve LoRA adapters; set actor_rollout_ref.model.lora.merge=True"
            )
        global_steps = kwargs.get("global_steps")
        server = self._server_handle()
        bucket_bytes = int(self.config.checkpoint_engine.update_weights_bucket_megabytes) << 20
        bucket, size = [], 0
        async for name, tensor in _iterate(weights):
            if server is None:
                continue  # drain: the iterator holds collectives every rank must join
            t = tensor.detach().to("cpu").contiguous()
            bucket.append((name, t))
            size += t.numel() * t.element_size()
            if size >= bucket_bytes:
                await server.load_weights.remote(bucket)
                bucket, size = [], 0
        if server is not None:
            if bucket:
                await server.load_weights.remote(bucket)
            await server.set_global_steps.remote(global_steps)


def server_actor_options(
    name: str,
    node_id: str,
    max_concurrency: int,
    platform_device: str,
    noset_envvars: list[str],
    resources: dict[str, float] | None = None,
) -> dict:
    """Ray ``.options(...)`` of a replica's server actor.

    Without ``resources`` (``engine_kwargs.hf.resources``): no CPU or GPU is requested (the trainer ranks hold
    the replica's resources); it is pinned to the node ``node_id`` of its first trainer rank. On an accelerator
    platform (``platform_device != "cpu"``) the actor's environment sets each of ``noset_envvars`` (e.g.
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) to "1" so that Ray leaves the GPUs visible to it.

    With ``resources``: the actor asks for them (``"CPU"``/``"GPU"`` as ``num_cpus``/``num_gpus``, 0 CPUs
    unless given) and is not pinned, so Ray places it on any node that has them; ``node_id`` and
    ``noset_envvars`` are unused (a GPU it asks for is its own, which Ray makes visible).
    """
    if resources:
        custom = {k: float(v) for k, v in resources.items() if k not in ("CPU", "GPU")}
        options = dict(name=name, num_cpus=resources.get("CPU", 0), max_concurrency=max_concurrency)
        if "GPU" in resources:
            options["num_gpus"] = resources["GPU"]
        if custom:
            options["resources"] = custom
        return options
    options = dict(
        name=name,
        num_cpus=0,
        max_concurrency=max_concurrency,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    )
    if platform_device != "cpu":
        options["runtime_env"] = {"env_vars": {var: "1" for var in noset_envvars}}
    return options


class HFReplica(_RolloutReplica):
    """verl ``RolloutReplica`` of the ``hf`` backend: one generation server per replica (CPU or its ranks' GPU)."""

    async def launch_servers(self):
        """Start this replica's server actor and load the model (hybrid mode: next to its trainer ranks, or
        where ``engine_kwargs.hf.resources`` are)."""
        mode = verl_compat.rollout_mode_enum()
        if self.rollout_mode != mode.HYBRID:
            raise NotImplementedError(
                f"hf rollout supports the hybrid engine only (sync / colocate_async trainers), got {self.rollout_mode}"
            )
        if len(self.workers) != self.world_size:
            raise RuntimeError(
                f"replica {self.replica_rank}: {len(self.workers)} workers for world size {self.world_size}"
            )
        platform_device, visible_var, noset_vars = verl_compat.platform_device_info()
        infos = await asyncio.gather(
            *[
                w.__ray_call__.remote(
                    lambda self, var=visible_var: (
                        ray.get_runtime_context().get_node_id(),
                        os.environ.get(var, ""),
                    )
                )
                for w in self.workers
            ]
        )
        node_id = infos[0][0]
        role = "reward" if self.is_reward_model else "teacher" if self.is_teacher_model else ""
        name = server_actor_name(self.replica_rank, self.name_suffix, role)
        server_cls = ray.remote(HFGenerationServer)
        hf = hf_options(self.config)
        options = server_actor_options(
            name, node_id, self.max_concurrency, platform_device, noset_vars, resources=hf.resources
        )
        server = server_cls.options(**options).remote(
            config=self.config,
            model_config=self.model_config,
            replica_rank=self.replica_rank,
            rollout_mode=self.rollout_mode,
            platform_device=platform_device,
            # a server placed by its own resources does not share the ranks' GPUs
            cuda_visible_devices=None if hf.resources else [info[1] for info in infos if info[0] == node_id],
        )
        await server.launch.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name


__all__ = ["HFServerAdapter", "HFReplica", "server_actor_name", "server_actor_options"]
