"""Benchmark of the ``hf`` rollout backend (stare_verl.cpu) on a tiny local model.

1. Throughput: tokens/s of the hf generation server answering 16 concurrent requests, against plain
   batched ``model.generate`` (left-padded, KV cache) on the same prompts in the same run.
   Target: ratio >= 0.8.
2. Step-time breakdown of a 2-step ``python -m verl.trainer.main_ppo`` run on CPU (recipes/cpu/tiny_grpo.yaml):
   gen, old_log_prob, adv, update_actor, update_weights, step (seconds, from verl's timing_s/*).

Usage: ``python bench/bench_hf_rollout.py [--skip-train] [--requests 16] [--max-tokens 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMING_KEYS = ("gen", "old_log_prob", "adv", "update_actor", "update_weights", "step")


def make_prompts(n: int, vocab: int) -> list[list[int]]:
    """Deterministic prompts of 8..23 tokens (varied lengths exercise left padding)."""
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, vocab, (8 + (i * 5) % 16,), generator=g).tolist() for i in range(n)]


def bench_generate(model, prompts, max_tokens: int, pad_id: int) -> tuple[float, int]:
    """Batched model.generate (greedy, fixed length): (seconds, generated tokens)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )
    dt = time.perf_counter() - t0
    return dt, int((out.shape[1] - width) * out.shape[0])


async def bench_server(server, prompts, max_tokens: int) -> tuple[float, int]:
    """All prompts sent concurrently to the hf server: (seconds, generated tokens)."""
    params = {
        "temperature": 0,
        "top_k": -1,
        "top_p": 1.0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "logprobs": True,
    }
    t0 = time.perf_counter()
    outs = await asyncio.gather(*[server.generate(p, dict(params), f"r{i}") for i, p in enumerate(prompts)])
    dt = time.perf_counter() - t0
    return dt, sum(len(o.token_ids) for o in outs)


def throughput(model_path: str, n_requests: int, max_tokens: int, repeats: int = 3) -> dict:
    from verl.workers.config import HFModelConfig, RolloutConfig

    from stare_verl.cpu.hf_server import HFGenerationServer

    config = RolloutConfig(
        name="hf", tensor_model_parallel_size=1, prompt_length=64, response_length=max_tokens, max_num_seqs=64
    )

    async def run() -> dict:
        server = HFGenerationServer(config, HFModelConfig(path=model_path))
        await server.launch()
        model = server.engine.model
        prompts = make_prompts(n_requests, server.engine.vocab_size)
        await bench_server(server, prompts, 4)  # warm-up
        bench_generate(model, prompts, 4, server.engine.pad_token_id)
        srv, gen = [], []
        for _ in range(repeats):  # interleaved, best of N: robust to noise from other processes
            srv.append(await bench_server(server, prompts, max_tokens))
            gen.append(bench_generate(model, prompts, max_tokens, server.engine.pad_token_id))
        await server.shutdown()
        s_dt, s_tok = min(srv)
        g_dt, g_tok = min(gen)
        return {
            "requests": n_requests,
            "max_tokens": max_tokens,
            "server_tokens_per_s": s_tok / s_dt,
            "generate_tokens_per_s": g_tok / g_dt,
            "ratio": (s_tok / s_dt) / (g_tok / g_dt),
        }

    return asyncio.run(run())


def throughput_ray(model_path: str, n_requests: int, max_tokens: int, repeats: int = 3) -> float:
    """Tokens/s of the server as a Ray actor (what the agent loop calls), best of ``repeats``."""
    import ray
    from verl.workers.config import HFModelConfig, RolloutConfig

    from stare_verl.cpu.hf_server import HFGenerationServer

    config = RolloutConfig(
        name="hf", tensor_model_parallel_size=1, prompt_length=64, response_length=max_tokens, max_num_seqs=64
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        server = (
            ray.remote(HFGenerationServer)
            .options(max_concurrency=1000)
            .remote(config, HFModelConfig(path=model_path))
        )
        ray.get(server.launch.remote())
        prompts = make_prompts(n_requests, 300)
        params = {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": True}
        best = 0.0
        for _ in range(repeats + 1):  # first round warms up
            t0 = time.perf_counter()
            outs = ray.get([server.generate.remote(p, dict(params), f"r{i}") for i, p in enumerate(prompts)])
            dt = time.perf_counter() - t0
            best = max(best, sum(len(o.token_ids) for o in outs) / dt)
        ray.get(server.shutdown.remote())
        return best
    finally:
        ray.shutdown()


def train_breakdown(model_path: str, workdir: Path) -> dict:
    """Run main_ppo for 2 steps on the CPU backend; return timing_s/* per step and the wall time."""
    from tests.support.tiny import build_toy_dataset

    train, val = build_toy_dataset(workdir / "data")
    metrics = workdir / "metrics.jsonl"
    env = dict(os.environ)
    env.update(
        VERL_PLATFORM="cpu",
        VERL_FILE_LOGGER_PATH=str(metrics),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={REPO / 'recipes' / 'cpu'}",
        "--config-name=tiny_grpo",
        f"actor_rollout_ref.model.path={model_path}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "trainer.total_training_steps=2",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={workdir / 'ckpt'}",
    ]
    t0 = time.perf_counter()
    with open(workdir / "train.log", "w") as log:
        rc = subprocess.run(
            cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900
        ).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"main_ppo failed (rc={rc}); see {workdir / 'train.log'}")
    steps = {}
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        data = rec["data"]
        if "timing_s/step" in data:
            steps[rec["step"]] = {k: data.get(f"timing_s/{k}", float("nan")) for k in TIMING_KEYS}
    return {"wall_s": wall, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--skip-train", action="store_true", help="only the throughput part")
    args = parser.parse_args()

    from tests.support.tiny import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench_hf_") as tmp:
        tmp = Path(tmp)
        model_path = build_tiny_model(tmp / "model")
        tp = throughput(model_path, args.requests, args.max_tokens)
        print(
            f"hf server, {tp['requests']} concurrent requests x {tp['max_tokens']} tokens (greedy): "
            f"{tp['server_tokens_per_s']:.0f} tok/s; batched model.generate: {tp['generate_tokens_per_s']:.0f} tok/s; "
            f"ratio {tp['ratio']:.2f} (target >= 0.8) {'OK' if tp['ratio'] >= 0.8 else 'BELOW TARGET'}"
        )
        ray_tps = throughput_ray(model_path, args.requests, args.max_tokens)
        print(
            f"same through Ray (server as a Ray actor, as the agent loop calls it): {ray_tps:.0f} tok/s; "
            f"ratio to model.generate {ray_tps / tp['generate_tokens_per_s']:.2f}"
        )
        if args.skip_train:
            return
        bd = train_breakdown(model_path, tmp)
        print(
            f"main_ppo on CPU, 2 steps (tiny Qwen2, 4 prompts x 4 samples, 16 tokens), wall {bd['wall_s']:.1f} s"
        )
        print("step  " + "  ".join(f"{k:>14}" for k in TIMING_KEYS))
        for step, t in sorted(bd["steps"].items()):
            print(f"{step:>4}  " + "  ".join(f"{t[k]:>14.3f}" for k in TIMING_KEYS))


if __name__ == "__main__":
    main()
