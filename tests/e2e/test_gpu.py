"""GPU checks (``pytest -m gpu``, ``make test-gpu``): verl's V1 trainer with ``stare_sync``, the FSDP actor and the
rollout on CUDA, and the estimator on CUDA tensors. Every test here is marked ``gpu`` and skipped without CUDA
(``tests/conftest.py``); the whole set is sized for under 5 minutes on one GPU.

- ``hf``: the tiny Qwen2 on the toy "letter a" task (``recipes/cpu/tiny_grpo.yaml``) on verl's CUDA platform
  (no ``VERL_PLATFORM``), ``trainer.device=cuda``, STARE with the gate forced on, 3 steps; the ``hf`` server
  must say it loaded its model on the GPU, and rollout and actor log-probs must agree (weights synced);
- ``sglang`` (only where SGLang is importable): the same run with verl's SGLang rollout;
- the estimator on CUDA tensors equals the CPU result bit for bit, ties at the threshold included.
"""

from __future__ import annotations

import importlib.util
import os
import re
import uuid

import numpy as np
import pytest
import torch

from tests.support.cpu import (
    RUN_TAG_ENV,
    build_tiny_model,
    build_toy_dataset,
    cpu_env,
    launch_main_ppo,
    main_ppo_cmd,
    read_metrics,
)

pytestmark = pytest.mark.gpu

RUN_TIMEOUT_S = 200
STEPS = 3
STARE = [
    "algorithm.adv_estimator=stare",
    "trainer.v1.trainer_mode=stare_sync",
    "+algorithm.stare.target_entropy=50.0",  # above any entropy of the tiny model: the gate is on every step
    f"trainer.total_training_steps={STEPS}",
    "trainer.device=cuda",
]
RUNS = {
    "hf": STARE,
    "sglang": [
        *STARE,
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.2",
        "actor_rollout_ref.rollout.enforce_eager=true",  # no CUDA-graph capture: a faster start
        "++actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton",
    ],
}


def gpu_env(extra: dict[str, str]) -> dict[str, str]:
    """:func:`cpu_env` without ``VERL_PLATFORM``: verl detects its CUDA platform itself."""
    env = cpu_env(extra)
    env.pop("VERL_PLATFORM", None)
    return env


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_e2e")
    # head dim 64 (hidden 256, 4 heads): what SGLang's attention kernels support; the hf server takes any
    models = {
        "hf": build_tiny_model(root / "model"),
        "sglang": build_tiny_model(root / "model256", hidden=256),
    }
    train, val = build_toy_dataset(root / "data")
    return root, models, train, val


_results: dict[str, dict] = {}


def run_main_ppo(name: str, assets) -> dict:
    """Run main_ppo once per name (cached for the module): metrics by step, the log text, leftovers."""
    if name not in _results:
        _results[name] = _run(name, assets)
    res = _results[name]
    if res["error"]:
        pytest.fail(res["error"])
    return res


def _run(name: str, assets) -> dict:
    root, models, train, val = assets
    metrics_path = root / f"{name}.jsonl"
    tag = f"gpu-{name}-{uuid.uuid4().hex}"
    cmd = main_ppo_cmd(
        "tiny_grpo",
        [
            f"actor_rollout_ref.model.path={models[name]}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            "trainer.logger=[console,file]",
            f"trainer.experiment_name=gpu_{name}",
            f"trainer.default_local_dir={root / 'ckpt' / name}",
            *RUNS[name],
        ],
    )
    env = gpu_env(
        {"VERL_FILE_LOGGER_PATH": str(metrics_path), RUN_TAG_ENV: tag}
    )
    run = launch_main_ppo(cmd, env, root, root / f"{name}.log", RUN_TIMEOUT_S, ran=metrics_path.exists)
    error = run.failure(name)
    by_step = {} if error else {rec["step"]: rec["data"] for rec in read_metrics(metrics_path)}
    return {"metrics": by_step, "log": run.log(), "leaked": run.leaked, "still_alive": run.still_alive,
            "wall": run.wall, "error": error}  # fmt: skip


def _check_stare_steps(m: dict, max_probs_diff: float) -> None:
    assert set(range(1, STEPS + 1)) <= set(m), f"steps logged: {sorted(m)}"
    for step in range(1, STEPS + 1):
        s = m[step]
        assert s["training/global_step"] == step
        assert 0.0 < s["actor/entropy"] < 20.0
        assert s["critic/score/max"] > s["critic/score/min"]  # rewards vary within groups
        assert s["stare/gate_on"] == 1.0
        assert s["entropy_control/model_tokens"] > 0 and s["stare/nonfinite_tokens"] == 0
        assert abs(s["entropy_control/batch_entropy"] - s["actor/entropy"]) < 1e-3
        assert 0.0 < s["stare/frac_l_plus"] <= 0.11  # top 10 % of the positive-advantage tokens
        assert s["stare/surprisal_threshold_plus"] > 0
        assert s["training/rollout_probs_diff_mean"] < max_probs_diff, (
            step,
            s["training/rollout_probs_diff_mean"],
        )
        for key in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor"):
            assert s[key] > 0, key
    assert len({round(m[s]["actor/entropy"], 6) for s in range(1, STEPS + 1)}) > 1  # the policy changed


def test_stare_sync_fsdp_and_hf_rollout_on_cuda(assets):
    res = run_main_ppo("hf", assets)
    # the hf server loaded its model on the GPU, in the dtype the recipe asks for (engine_kwargs.hf.dtype)
    assert re.search(r"hf rollout replica 0: model on cuda:\d+ in float32", res["log"]), res["log"][-3000:]
    # fp32 on both sides with synced weights; unsynced weights give ~1e-3 and growing
    _check_stare_steps(res["metrics"], max_probs_diff=5e-4)
    assert not res["still_alive"], f"processes left by the run: {res['still_alive']}"


def test_stare_sync_fsdp_and_sglang_rollout_on_cuda(assets):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed (pip install -e '.[gpu]')")
    res = run_main_ppo("sglang", assets)
    _check_stare_steps(res["metrics"], max_probs_diff=5e-2)  # bf16 rollout vs fp32 actor
    assert not res["still_alive"], f"processes left by the run: {res['still_alive']}"


def _estimator_inputs(device: str, seed: int = 0, b: int = 64, t: int = 256):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 3, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(b, t)
    rewards[torch.arange(b), lengths - 1] = torch.randint(0, 2, (b,), generator=g).float()
    # log-probs on a coarse grid: many ties at every threshold, so the tie rule decides the sets
    logp = -(torch.randint(0, 6, (b, t), generator=g).float() * 0.5)
    ent = torch.rand(b, t, generator=g) * 0.2
    uid = np.array([f"q{i // 8}" for i in range(b)], dtype=object)
    return rewards.to(device), mask.to(device), uid, logp.to(device), ent.to(device)


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("scope", ["batch", "chunk"])
def test_estimator_on_cuda_equals_cpu(variant, scope):
    from omegaconf import OmegaConf

    from stare_verl.methods.stare import compute_stare_advantage

    stare = {"variant": variant, "target_entropy": 50.0, "scope": scope}
    if scope == "chunk":
        stare["chunk_size"] = 16
    algo = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "stare": stare})
    out = {}
    for device in ("cpu", "cuda"):
        rewards, mask, uid, logp, ent = _estimator_inputs(device)
        metrics: dict = {}
        adv, _ = compute_stare_advantage(
            rewards, mask, uid, algo, old_log_probs=logp, entropys=ent, metrics=metrics
        )
        assert adv.device.type == device
        out[device] = (adv.cpu(), metrics)
    cpu_adv, cpu_metrics = out["cpu"]
    cuda_adv, cuda_metrics = out["cuda"]
    assert cpu_metrics["stare/gate_on"] == 1.0 and cpu_metrics["stare/frac_l_plus"] > 0
    assert torch.equal(cpu_adv, cuda_adv)  # the same tokens selected, the same weights, bit for bit
    assert cuda_metrics == pytest.approx(cpu_metrics, rel=1e-5, abs=1e-6)  # float64 sums on the device


def test_cuda_is_what_these_tests_ran_on():
    assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
    assert os.environ.get("VERL_PLATFORM", "") != "cpu"


def test_hf_server_on_cuda_matches_cpu(assets):
    """The hf server alone (no Ray) on the GPU in float32: greedy tokens as on the CPU, log-probs within 1e-4,
    weights loaded from CPU tensors, sampling seeded on the device."""
    import asyncio

    from verl.workers.config import HFModelConfig, RolloutConfig

    from stare_verl.cpu.hf_server import HFGenerationServer

    _, models, _, _ = assets
    prompts = [[5 + i, 40 + 7 * i, 20 + i, 100 + i] * (1 + i % 3) for i in range(6)]
    greedy = {"temperature": 0, "logprobs": True, "max_tokens": 12, "ignore_eos": True}

    async def run(device):
        config = RolloutConfig(name="hf", tensor_model_parallel_size=1, prompt_length=32, response_length=16,
                               engine_kwargs={"hf": {"device": device, "dtype": "float32"}})  # fmt: skip
        server = HFGenerationServer(config, HFModelConfig(path=models["hf"]), platform_device="cuda")
        await server.launch()
        outs = await asyncio.gather(*[server.generate(p, greedy, f"r{i}") for i, p in enumerate(prompts)])
        name, weight = next(iter(server.engine.model.state_dict().items()))
        await server.load_weights([(name, torch.zeros_like(weight, device="cpu"))])
        assert float(server.engine.model.state_dict()[name].abs().sum()) == 0.0
        # uniform over the vocabulary (embeddings zeroed): ignore_eos, or an early EOS would end it before 8
        sampled_params = {"temperature": 1.0, "max_tokens": 8, "seed": 3, "ignore_eos": True}
        sampled = await server.generate(prompts[0], sampled_params, "s")
        stats = await server.get_stats()
        await server.shutdown()
        return outs, stats, sampled

    cpu_outs, cpu_stats, _ = asyncio.run(run("cpu"))
    cuda_outs, cuda_stats, sampled = asyncio.run(run("cuda"))
    assert cpu_stats["device"] == "cpu" and cuda_stats["device"].startswith("cuda:")
    assert len(sampled.token_ids) == 8
    for c, g in zip(cpu_outs, cuda_outs, strict=True):
        assert c.token_ids == g.token_ids
        assert np.allclose(c.log_probs, g.log_probs, atol=1e-4)
