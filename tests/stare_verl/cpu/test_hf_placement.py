"""Where the ``hf`` rollout runs: device and dtype choice, GPU sharing with the trainer ranks, registration on
any platform. The CUDA probe is faked, so all of this runs on a CPU-only machine (the real GPU run is in
``tests/e2e/test_gpu.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from stare_verl.cpu.hf_rollout import server_actor_options
from stare_verl.cpu.hf_server import (
    HFGenerationServer,
    HFServerOptions,
    choose_device,
    choose_dtype,
    hf_options,
    server_cuda_ordinal,
)
from tests.support.cpu import build_tiny_model, cpu_env

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("requested", "cuda", "platform", "expected"),
    [
        ("auto", True, "cuda", "cuda"),
        ("auto", False, "cuda", "cpu"),  # no GPU in the server: the CPU
        ("auto", True, "cpu", "cpu"),  # VERL_PLATFORM=cpu keeps the CPU path even with a GPU
        ("auto", False, "cpu", "cpu"),
        ("cpu", True, "cuda", "cpu"),
        ("cuda", True, "cuda", "cuda"),
        ("cuda", True, "cpu", "cuda"),  # explicit beats the platform
    ],
)
def test_choose_device(requested, cuda, platform, expected):
    assert choose_device(requested, cuda, platform) == expected


def test_choose_device_errors():
    with pytest.raises(RuntimeError, match="hf.device=cuda, but CUDA is not available"):
        choose_device("cuda", False, "cuda")
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        choose_device("tpu", True, "cuda")


@pytest.mark.parametrize(
    ("hf_dtype", "rollout_dtype", "device", "expected"),
    [
        (None, "bfloat16", "cpu", "float32"),  # the CPU path: unchanged
        (None, "bfloat16", "cuda", "bfloat16"),  # verl's rollout.dtype on the GPU
        (None, "bf16", "cuda", "bfloat16"),
        (None, "fp16", "cuda", "float16"),
        (None, "torch.float32", "cuda", "float32"),
        (None, None, "cuda", "bfloat16"),
        (None, "auto", "cuda", "bfloat16"),
        ("float32", "bfloat16", "cuda", "float32"),  # engine_kwargs.hf.dtype wins
        ("bfloat16", "float32", "cpu", "bfloat16"),
    ],
)
def test_choose_dtype(hf_dtype, rollout_dtype, device, expected):
    assert choose_dtype(hf_dtype, rollout_dtype, device) == expected


def test_choose_dtype_rejects_unknown():
    with pytest.raises(ValueError, match="rollout.dtype='int8'"):
        choose_dtype(None, "int8", "cuda")


def test_options_validate_device():
    assert HFServerOptions().device == "auto" and HFServerOptions().dtype is None
    with pytest.raises(ValueError):
        HFServerOptions(device="gpu")


def test_server_cuda_ordinal():
    # the server sees every GPU (CUDA_VISIBLE_DEVICES unset): the ranks' lowest physical id
    assert server_cuda_ordinal(["3", "1,3"], None) == 1
    assert server_cuda_ordinal(["5"], "") == 5
    # the node's own list (Ray started under CUDA_VISIBLE_DEVICES=4,5,6): the position in it
    assert server_cuda_ordinal(["5"], "4,5,6") == 1
    assert server_cuda_ordinal(["10", "9"], "8,9,10") == 1  # numeric order, not text order
    with pytest.raises(ValueError, match="not visible to the hf server"):
        server_cuda_ordinal(["7"], "4,5")
    with pytest.raises(ValueError, match="report no CUDA_VISIBLE_DEVICES"):
        server_cuda_ordinal(["", " "], None)


def test_server_actor_options():
    noset = ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]
    cpu = server_actor_options("hf_server_0", "ab" * 28, 1016, "cpu", noset)
    assert cpu["num_cpus"] == 0 and cpu["name"] == "hf_server_0" and cpu["max_concurrency"] == 1016
    assert "runtime_env" not in cpu and "num_gpus" not in cpu  # the CPU path as before
    gpu = server_actor_options("hf_server_0", "ab" * 28, 1016, "cuda", noset)
    assert gpu["runtime_env"] == {"env_vars": {noset[0]: "1"}}
    assert "num_gpus" not in gpu  # shares the trainer ranks' GPU, as verl's SGLang replica does
    assert gpu["scheduling_strategy"].node_id == "ab" * 28 and gpu["scheduling_strategy"].soft is False


def test_server_actor_options_with_resources_place_it_by_them():
    """engine_kwargs.hf.resources: the server asks Ray for them and is not pinned beside the trainer rank."""
    noset = ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]
    for platform in ("cpu", "cuda"):
        opts = server_actor_options("hf_server_1", "ab" * 28, 1016, platform, noset, resources={"stare_node_1": 0.5})
        assert opts == {"name": "hf_server_1", "num_cpus": 0, "max_concurrency": 1016,
                        "resources": {"stare_node_1": 0.5}}  # fmt: skip
    gpu = server_actor_options("s", "ab" * 28, 8, "cuda", noset, resources={"GPU": 1, "CPU": 2, "rollout": 1})
    assert gpu == {"name": "s", "num_cpus": 2, "num_gpus": 1, "max_concurrency": 8, "resources": {"rollout": 1.0}}
    assert "resources" not in server_actor_options("s", "ab" * 28, 8, "cuda", noset, resources={"GPU": 1})


def test_hf_options_from_a_rollout_config_and_bad_resources():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"engine_kwargs": {"hf": {"dtype": "float32", "resources": {"rollout": 1}}}})
    opts = hf_options(cfg)
    assert opts.resources == {"rollout": 1.0} and opts.dtype == "float32"
    assert hf_options(OmegaConf.create({"engine_kwargs": {}})).resources == {}
    with pytest.raises(ValueError, match="amounts must be > 0"):
        HFServerOptions(resources={"rollout": 0})
    with pytest.raises(ValueError):
        HFServerOptions(resource={"rollout": 1})  # an unknown key


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_placement"))


def _server(model_path, monkeypatch, platform_device, visible, hf=None, rollout_dtype="bfloat16"):
    from verl.workers.config import HFModelConfig, RolloutConfig

    config = RolloutConfig(
        name="hf", tensor_model_parallel_size=1, prompt_length=16, response_length=8,
        dtype=rollout_dtype, engine_kwargs={"hf": hf or {}},
    )  # fmt: skip
    return HFGenerationServer(
        config, HFModelConfig(path=model_path), platform_device=platform_device, cuda_visible_devices=visible
    )


def test_server_placement_with_faked_cuda(model_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    server = _server(model_path, monkeypatch, "cuda", ["2"])
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # left as it is
    assert server.resolve_placement(cuda_available=True) == ("cuda:2", "bfloat16")
    assert server.resolve_placement(cuda_available=False) == ("cpu", "float32")
    pinned = _server(model_path, monkeypatch, "cuda", ["2"], hf={"dtype": "float32"})
    assert pinned.resolve_placement(cuda_available=True) == ("cuda:2", "float32")


def test_server_on_cpu_platform_ignores_visible_devices(model_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    server = _server(model_path, monkeypatch, "cpu", ["1"], hf={"dtype": "float32"})
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert server.resolve_placement(cuda_available=True) == ("cpu", "float32")


def test_server_launches_on_cpu_without_cuda(model_path, monkeypatch):
    """The real CUDA probe on this machine: the model is loaded on the CPU in float32, and says so."""
    import asyncio

    if torch.cuda.is_available():  # pragma: no cover - GPU machines run tests/e2e/test_gpu.py
        pytest.skip("CUDA is available")
    server = _server(model_path, monkeypatch, "cuda", None)

    async def main():
        await server.launch()
        stats = await server.get_stats()
        await server.sleep()  # a no-op on the CPU
        await server.shutdown()
        return stats

    stats = asyncio.run(main())
    assert (stats["device"], stats["dtype"]) == ("cpu", "float32")
    assert server.engine.device == torch.device("cpu")


PROBE = r"""
import json, verl
from verl.plugin.platform import PlatformRegistry, get_platform
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import get_rollout_replica_class
import verl.utils.distributed as dist
print(json.dumps({
    "device": get_platform().device_name,
    "cpu_platform": PlatformRegistry.get("cpu") is not None,
    "adapter": get_rollout_class("hf").__name__,
    "replica": get_rollout_replica_class("hf").__name__,
    "pg_patched": bool(getattr(dist.initialize_global_process_group_ray, "_stare_cpu_patched", False)),
}))
"""


def test_hf_rollout_registered_without_cpu_platform():
    """verl's own platform (CUDA, its fallback here) with the hf rollout registered and no CPU patch applied."""
    env = cpu_env()
    env.pop("VERL_PLATFORM")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {
        "device": "cuda",
        "cpu_platform": False,
        "adapter": "HFServerAdapter",
        "replica": "HFReplica",
        "pg_patched": False,
    }
