"""`make train-shortcot` / `make train-longcot` CPU defaults end to end: a short SFT, 1-2 RL steps through verl's
main_ppo (single_turn_agent, our reward), the run folder; and `compare --family` routing."""

import json
import os

import pytest

from stare_verl.jobs.procs import RUN_TAG_ENV, leftover_processes
from stare_verl.jobs.train import main

pytestmark = pytest.mark.e2e

TARGET = {"shortcot": 0.11, "longcot": 0.08}
STEPS = {"shortcot": 2, "longcot": 1}  # long responses of an undertrained model cost more: one step there


@pytest.mark.parametrize("family", ["shortcot", "longcot"])
def test_cot_cpu_default_run_writes_run_folder(tmp_path, monkeypatch, family):
    # not "pytest-<pid>-...": the tool-use test matches that prefix, and this process's own long-lived helpers
    # (the math-verify worker pool its evaluation starts) inherit the tag set here
    tag = f"pytest-cot-{family}-{os.getpid()}"
    monkeypatch.setenv(RUN_TAG_ENV, tag)
    run = tmp_path / "run"
    (tmp_path / "cache").mkdir()  # --sft-cache must name an existing folder
    argv = [
        "--family", family, "--cpu", "--run-dir", str(run), "--sft-steps", "30",
        "--sft-cache", str(tmp_path / "cache"), "--min-sft-accuracy", "0", "--n-eval", "8", "--n-train", "32",
        "--sft-threads", "1", "--steps", str(STEPS[family]),
    ]  # fmt: skip
    steps = STEPS[family]
    assert main(argv) == 0

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for r in rows:
        assert r["entropy_control/target_entropy"] == TARGET[family]
        assert r["entropy_control/model_tokens"] > 0 and r["stare/nonfinite_tokens"] == 0
        assert 0 <= r["critic/score/mean"] <= 1 and r["actor/entropy"] > 0
        assert r["reward/acc/mean"] == pytest.approx(r["critic/score/mean"])
        # one model turn, no tool (verl's single_turn_agent reports 2 turns: user + assistant)
        assert r["num_turns/mean"] == 2
        assert 0 < r["response_length/mean"] <= (48 if family == "shortcot" else 128)
    assert (run / "checkpoints" / f"global_step_{steps}" / "stare_state.json").exists()
    assert sorted(p.name for p in (run / "plots").glob("*.png")) == [
        "dashboard.png",
        "entropy.png",
        "entropy_dynamics.png",
        "response_length.png",
        "reward.png",
    ]
    data = run / "data" / "train.parquet"
    import pandas as pd

    df = pd.read_parquet(data)
    assert set(df["agent_name"]) == {"single_turn_agent"}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["family"] == family and summary["steps"] == steps
    assert summary["rl_checkpoint"].endswith(f"global_step_{steps}/actor/huggingface")
    for key in ("eval_before", "eval_after"):
        assert set(summary[key]) == {"T=0", "T=1"} and summary[key]["T=0"]["n"] == 8
        assert summary[key]["T=0"]["mean_tool_calls"] == 0 and summary[key]["T=0"]["mean_turns"] == 1
    probe = summary["entropy_report"]["heldout_entropy"]  # one demonstration per held-out problem, one model turn
    assert probe["before"]["episodes"] == probe["after"]["episodes"] == 8 and probe["after"]["entropy"] > 0
    assert leftover_processes(f"{tag}-", prefix=True, grace_s=20.0) == []
