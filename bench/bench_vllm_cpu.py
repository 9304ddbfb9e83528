"""Generation on the CPU: transformers (what the ``hf`` rollout runs) against vLLM's CPU build, same weights.

Greedy, fp32, 64 prompts x 64 new tokens in one batch (left-padded ``generate`` for transformers, one
``LLM.generate`` call for vLLM), on the CPU default families' tiny model (hidden 128, 2 layers, 0.44 M-parameter
shape with a 384-token vocabulary), a ~25 M-parameter one (hidden 512, 8 layers, 8 heads) and, where ``make model``
has prepared it, the real pretrained SmolLM2-135M-Instruct (``--model smollm2-135m``; its own tokenizer). Prints tokens/s of
each, the engine's start-up time (model load, and for vLLM its KV cache and workers) and the peak resident memory
of the engine's process and of its largest child process (vLLM's engine core runs in a process of its own, stopped
after the generation so that its peak is counted); also whether the greedy tokens agree. Each engine runs in a process of its own (vLLM in
``.venv-vllm``, from ``make vllm-cpu``; skipped with a note where it is not built). Numbers depend on the load: the
run prints the load average before and after.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
N_PROMPTS, NEW_TOKENS = 64, 64
SHAPES = {
    "tiny (hidden 128, 2 layers)": dict(hidden=128, layers=2, heads=4, kv=2, ffn=384),
    "~25 M (hidden 512, 8 layers)": dict(hidden=512, layers=8, heads=8, kv=4, ffn=1536),
}


def _build(out: Path, shape: dict) -> tuple[str, int]:
    from envs.tiny_hf import TinyModelConfig, build_model, build_tokenizer, save_model

    corpus = [f"{a} + {b} = {a + b}. the letter a, then b and c." for a in range(60) for b in range(8)]
    tok = build_tokenizer(corpus, vocab_size=384)
    cfg = TinyModelConfig(hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                          num_attention_heads=shape["heads"], num_key_value_heads=shape["kv"],
                          intermediate_size=shape["ffn"], max_position_embeddings=512)  # fmt: skip
    model = build_model(tok, cfg, seed=0)
    save_model(model, tok, out)
    return str(out), sum(p.numel() for p in model.parameters())


ENGINE = r"""
import json, resource, sys, time
engine, path = sys.argv[1], sys.argv[2]
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(path)
texts = [f"{i} + {i % 7} = " + "the letter a " * (i % 5) for i in range(__N__)]
prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
if __name__ == "__main__":
    t0 = time.perf_counter()
    if engine == "hf":
        import torch
        from transformers import AutoModelForCausalLM
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None  # exactly __K__ tokens, none suppressed (vLLM: ignore_eos)
        start = time.perf_counter() - t0
        width = max(map(len, prompts))
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
        t1 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=__K__,
                                 do_sample=False, pad_token_id=pad)
        gen = time.perf_counter() - t1
        tokens = [row[width:].tolist() for row in out]
    else:
        from vllm import LLM, SamplingParams
        llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=512, seed=0)
        start = time.perf_counter() - t0
        sp = SamplingParams(temperature=0.0, max_tokens=__K__, ignore_eos=True)
        t1 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        gen = time.perf_counter() - t1
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        try:  # stop the engine core process, so that its peak RSS is counted below (RUSAGE_CHILDREN: reaped children)
            llm.llm_engine.engine_core.shutdown()
        except Exception as err:  # another vLLM layout: the engine's memory is not counted
            print(f"engine core shutdown: {err!r}", file=sys.stderr)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print("RESULT " + json.dumps({"start_s": start, "gen_s": gen, "tokens": tokens, "rss_mb": rss,
                                  "child_rss_mb": child}))
""".replace("__N__", str(N_PROMPTS)).replace("__K__", str(NEW_TOKENS))


def _run(python: str, engine: str, model: str, script: Path, cache: Path) -> dict | None:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(cache), "VLLM_TARGET_DEVICE": "cpu",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    out = subprocess.run([python, str(script), engine, model], capture_output=True, text=True, timeout=900, env=env)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        print(f"  {engine}: failed (rc {out.returncode}): {out.stderr[-800:]}")
        return None
    return json.loads(line[len("RESULT "):])


def _real_model() -> tuple[str, int] | None:
    """The prepared real model's folder and parameter count, or None (with a note) where it is not prepared."""
    sys.path.insert(0, str(REPO))
    from stare_verl.models import ModelError, resolve_model

    try:
        path = resolve_model("smollm2-135m").path
    except ModelError as err:
        print(f"SmolLM2-135M-Instruct: skipped ({err})")
        return None
    from safetensors import safe_open

    n = 0
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            n += sum(_numel(st.get_slice(k).get_shape()) for k in st.keys())
    return str(path), n


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def main() -> int:
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    have_vllm = VLLM_PYTHON.exists()
    if not have_vllm:
        print(f"vLLM: skipped ({VLLM_PYTHON} not built: make vllm-cpu)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = root / "engine.py"
        script.write_text(ENGINE)
        models = [(name, *_build(root / name.split()[0].replace("~", ""), shape)) for name, shape in SHAPES.items()]
        real = _real_model()
        if real is not None:
            models.append(("SmolLM2-135M-Instruct (prepared by make model)", *real))
        for name, model, n_params in models:
            print(f"== {name}, {n_params / 1e6:.2f} M parameters: {N_PROMPTS} prompts x {NEW_TOKENS} new tokens, greedy, fp32")
            res = {"hf": _run(sys.executable, "hf", model, script, root / "cache")}
            if have_vllm:
                res["vllm"] = _run(str(VLLM_PYTHON), "vllm", model, script, root / "cache")
            for engine, r in res.items():
                if r:
                    tps = N_PROMPTS * NEW_TOKENS / r["gen_s"]
                    print(f"  {engine:5s} {tps:9.0f} tokens/s  generation {r['gen_s']:.2f} s  start-up {r['start_s']:.1f} s"
                          f"  peak RSS {r['rss_mb']:.0f} MB (largest child process: {r['child_rss_mb']:.0f} MB)")  # fmt: skip
            if res.get("hf") and res.get("vllm"):
                same = sum(a == b for a, b in zip(res["hf"]["tokens"], res["vllm"]["tokens"], strict=True))
                print(f"  greedy tokens identical in {same}/{N_PROMPTS} prompts")
    print(f"load average after: {os.getloadavg()[0]:.2f}; this process's peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
