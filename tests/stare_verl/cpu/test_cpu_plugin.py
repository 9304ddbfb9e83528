"""Registration of the CPU backend through verl's plugin entry point, and the verl version guard."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

import stare_verl.cpu.verl_compat as verl_compat
from tests.support.cpu import cpu_env

pytestmark = pytest.mark.integration

PROBE = r"""
import json, verl
from verl.plugin.platform import get_platform
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, get_rollout_class
from verl.workers.rollout.replica import get_rollout_replica_class
from verl.workers.engine import EngineRegistry
import verl.utils.distributed as dist
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
import verl.utils.torch_functional as tf
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
import inspect
p = get_platform()
print(json.dumps({
    "device": p.device_name,
    "backend": p.communication_backend_name(),
    "device_id": str(verl.utils.device.get_device_id()),
    "adapter": get_rollout_class("hf").__name__,
    "replica": get_rollout_replica_class("hf").__name__,
    "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
    "pg_patched": bool(getattr(dist.initialize_global_process_group_ray, "_stare_cpu_patched", False)),
    "rb_patched": bool(getattr(ReplayBuffer.__init__, "_stare_cpu_patched", False)),
    "logprobs_patched": bool(getattr(tf.logprobs_from_logits_v2, "_stare_cpu_patched", False)),
    "seeds_patched": [bool(getattr(f, "_stare_seeds_patched", False))
                      for f in (AgentLoopManagerTQ.generate_sequences, AgentLoopWorker._run_agent_loop)],
}))
"""


def _probe(env_extra):
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=cpu_env(env_extra), capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_plain_import_verl_registers_cpu_backend():
    info = _probe({"VERL_PLATFORM": "cpu"})
    assert info == {
        "device": "cpu",
        "backend": "gloo",
        "device_id": "cpu",
        "adapter": "HFServerAdapter",
        "replica": "HFReplica",
        "engine": "FSDPEngineWithLMHead",
        "pg_patched": True,
        "rb_patched": True,
        "logprobs_patched": True,
        "seeds_patched": [True, True],
    }


SEEDS_PROBE = r"""
import json, verl
from verl.workers.rollout.base import get_rollout_class
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
print(json.dumps({
    "adapter": get_rollout_class("hf").__name__,
    "seeds_patched": [bool(getattr(f, "_stare_seeds_patched", False))
                      for f in (AgentLoopManagerTQ.generate_sequences, AgentLoopWorker._run_agent_loop)],
}))
"""


def test_rollout_seed_patches_come_with_the_hf_rollout_on_any_platform():
    """A fresh process importing verl (as a Ray actor does) gets the seed patches without VERL_PLATFORM=cpu too."""
    env = cpu_env({"VERL_PLATFORM": ""})
    out = subprocess.run(
        [sys.executable, "-c", SEEDS_PROBE], env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {"adapter": "HFServerAdapter", "seeds_patched": [True, True]}


def test_other_versions_of_verl_are_refused(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.9.2" if name == "verl" else "0")
    spec = importlib.util.spec_from_file_location("verl_compat_copy", verl_compat.__file__)
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(RuntimeError, match=r"verl==0\.9\.1 only; found verl==0\.9\.2") as err:
        spec.loader.exec_module(module)
    assert type(err.value).__name__ == "VerlVersionError"


def test_poll_interval_setting(monkeypatch):
    monkeypatch.delenv(verl_compat.POLL_INTERVAL_ENV, raising=False)
    assert verl_compat.poll_interval_s() == verl_compat.DEFAULT_POLL_INTERVAL_S
    monkeypatch.setenv(verl_compat.POLL_INTERVAL_ENV, "0.5")
    assert verl_compat.poll_interval_s() == 0.5
    for bad in ("abc", "0", "-1"):
        monkeypatch.setenv(verl_compat.POLL_INTERVAL_ENV, bad)
        with pytest.raises(ValueError, match=verl_compat.POLL_INTERVAL_ENV):
            verl_compat.poll_interval_s()


def test_register_is_a_no_op_without_cpu_platform(monkeypatch):
    from verl.plugin.platform import PlatformRegistry

    import stare_verl.cpu as cpu

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    if cpu._registered:  # pragma: no cover - only when the test process itself runs with VERL_PLATFORM=cpu
        pytest.skip("this process registered the CPU backend already")
    assert cpu.register() is False
    assert PlatformRegistry.get("cpu") is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(300, 50), (3, 40, 50), (1, 50)])
def test_blockwise_logprobs_equal_verl_v2(monkeypatch, dtype, shape):
    """The CPU patch of ``logprobs_from_logits_v2`` gives verl's values and gradients (here bit for bit), also
    when the rows are split into several blocks."""
    from verl.utils import torch_functional as tf

    original = tf.logprobs_from_logits_v2
    if getattr(original, "_stare_cpu_patched", False):  # pragma: no cover - a process with the CPU platform
        pytest.skip("verl's function is patched in this process")
    monkeypatch.setattr(verl_compat, "LOGPROB_BLOCK_ELEMENTS", 7 * shape[-1])  # blocks of 7 rows
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g) * 4).to(dtype).requires_grad_(True)
    y = torch.randint(0, shape[-1], shape[:-1], generator=g)
    want, got = original(x, y), verl_compat.blockwise_logprobs(x, y)
    assert got.shape == want.shape == y.shape and got.dtype == want.dtype
    assert torch.equal(got, want)
    (gw,) = torch.autograd.grad(want.sum(), x)
    (gg,) = torch.autograd.grad(got.sum(), x)
    assert torch.equal(gg, gw)
    assert torch.all(got <= 0) and float(got.float().exp().sum()) > 0


def test_blockwise_logprobs_of_one_distribution():
    """One ``[V]`` row and a scalar label (verl's v2 iterates over the vocabulary there): log_softmax's value."""
    x, y = torch.randn(50, dtype=torch.float64), torch.tensor(7)
    got = verl_compat.blockwise_logprobs(x, y)
    assert got.shape == () and torch.allclose(got, torch.log_softmax(x, -1)[7], rtol=0, atol=1e-12)
