"""One RL step of the real pretrained model (``--model smollm2-135m``, short CoT) through the whole pipeline, against
a minimal GRPO step written in plain torch on the same model and the same batch shape: the floor on this machine.

The pipeline's step is verl's (``python -m stare_verl.jobs.train --family shortcot --model M --steps S``): generation,
old log-prob and update from its ``timing_s/*`` metrics (the median over steps 2..S; step 1 warms up). The floor: HF
``generate`` of the same prompts x samples (T = 1, the recipe's response length), the reward, GRPO advantages, and
one AdamW update with the recipe's micro-batches, where the update's forward gives the log-probs (no separate
old-log-prob pass: one update per batch is on-policy), the responses sorted by length and each micro-batch cut after
its longest response (no compute on padding). Prints both, the ratio pipeline / floor (goal <= 1.5x) and the
floor's peak RSS. Both run in this one session, one after the other; the 1-minute load average at the end of each
is printed beside it (a busy machine slows either, so compare only runs at similar load).

Usage: ``python bench/bench_real_step.py [--model smollm2-135m] [--steps 3]``; skipped (exit 0, one line) when the
model is not prepared (``make model``). Takes ~10 minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def recipe_shape() -> dict:
    """Prompts per step, samples per prompt, response length, micro-batch and lr of ``recipes/cpu/shortcot_real``."""
    sys.path.insert(0, str(REPO))
    from stare_verl.jobs.recipes import compose_recipe

    cfg = compose_recipe("cpu/shortcot_real_grpo", ["actor_rollout_ref.model.path=x", "data.train_files=x",
                                                    "data.val_files=x", "trainer.default_local_dir=x"])  # fmt: skip
    return {"prompts": int(cfg.data.train_batch_size), "n": int(cfg.actor_rollout_ref.rollout.n),
            "response": int(cfg.data.max_response_length),
            "micro": int(cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu),
            "lr": float(cfg.actor_rollout_ref.actor.optim.lr)}  # fmt: skip


def floor_step(model_dir: Path, shape: dict, seed: int = 0) -> dict:
    """A minimal GRPO step in plain torch: ``{"gen_s", "update_s", "step_s", "peak_rss_gb", "tokens"}``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envs.reward import compute_score
    from stare_verl.jobs.families import job_family
    from stare_verl.jobs.families.problems import sample_problems

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    opt = torch.optim.AdamW(model.parameters(), lr=shape["lr"], weight_decay=0.0)
    fam = job_family("shortcot").for_pretrained()
    problems = sample_problems(shape["prompts"], seed=12345, family=fam)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=False,
                                       add_generation_prompt=True) for p in problems for _ in range(shape["n"])]  # fmt: skip
    enc = tok(prompts, return_tensors="pt", padding=True)
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=shape["response"], do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    t1 = time.perf_counter()
    resp = out[:, enc.input_ids.shape[1]:]
    texts = tok.batch_decode(resp, skip_special_tokens=True)
    gts = [p.answer for p in problems for _ in range(shape["n"])]
    rewards = torch.tensor([compute_score(solution_str=t, ground_truth=g,
                                          extra_info={"reward_options": {"last_number": True}})["score"]
                            for t, g in zip(texts, gts, strict=True)])  # fmt: skip
    r = rewards.view(shape["prompts"], shape["n"])
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
    mask = (resp != tok.pad_token_id).float()  # the end-of-turn token is a model token; padding (a token of its own) is not
    t2 = time.perf_counter()
    model.train()
    opt.zero_grad(set_to_none=True)
    attn = torch.cat([enc.attention_mask, torch.ones_like(resp)], dim=1)
    n_tok = mask.sum()
    p_len = enc.input_ids.shape[1]
    # the floor wastes no compute on padding: responses sorted by length, each micro-batch cut after its longest
    order = torch.argsort(mask.sum(1), descending=True)
    for i in range(0, out.shape[0], shape["micro"]):
        idx = order[i : i + shape["micro"]]
        r_len = max(int(mask[idx].sum(1).max()), 1)
        logits = model(input_ids=out[idx, : p_len + r_len], attention_mask=attn[idx, : p_len + r_len]).logits
        logp = torch.log_softmax(logits[:, p_len - 1 : -1].float(), -1).gather(-1, resp[idx, :r_len, None]).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        loss = -(ratio * adv[idx, None] * mask[idx, :r_len]).sum() / n_tok
        loss.backward()
    opt.step()
    t3 = time.perf_counter()
    return {"gen_s": t1 - t0, "reward_s": t2 - t1, "update_s": t3 - t2, "step_s": t3 - t0,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "tokens": int(n_tok)}  # fmt: skip


def pipeline_steps(model: str, steps: int, run_dir: Path) -> dict:
    """verl's median step parts over steps 2..``steps`` of a ``--model`` short-CoT run in ``run_dir``."""
    cmd = [sys.executable, "-m", "stare_verl.jobs.train", "--cpu", "--family", "shortcot", "--model", model,
           "--method", "grpo", "--steps", str(steps), "--n-eval", "2", "--eval-samples", "1",
           "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the pipeline run failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = rows[1:] or rows
    out = {}
    for key in ("gen", "old_log_prob", "adv", "update_actor", "update_weights", "step"):
        vals = [r[f"timing_s/{key}"] for r in rows if f"timing_s/{key}" in r]
        if vals:
            out[key] = statistics.median(vals)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from stare_verl.models import ModelError, resolve_model

    try:
        model_dir = resolve_model(args.model).path
    except ModelError as err:
        print(f"bench_real_step: skipped ({err})")
        return 0
    shape = recipe_shape()
    print(f"bench_real_step: {args.model}, {shape['prompts']} prompts x {shape['n']} samples, up to "
          f"{shape['response']} response tokens, micro-batch {shape['micro']}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        pipe = pipeline_steps(args.model, args.steps, Path(tmp) / "run")
    load_pipe = os.getloadavg()[0]
    floor = floor_step(model_dir, shape)
    load_floor = os.getloadavg()[0]
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in pipe.items())
    print(f"  pipeline (verl, median of steps 2-{args.steps}; 1-minute load at its end {load_pipe:.1f}): {parts}")
    print(f"  floor (plain torch GRPO step; load at its end {load_floor:.1f}): generation {floor['gen_s']:.1f} s, "
          f"reward {floor['reward_s']:.1f} s, update {floor['update_s']:.1f} s, step {floor['step_s']:.1f} s "
          f"({floor['tokens']} response tokens), peak RSS {floor['peak_rss_gb']:.1f} GB")
    ratio = pipe["step"] / floor["step_s"]
    print(f"  step ratio pipeline / floor: {ratio:.2f}x (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
