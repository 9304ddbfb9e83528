"""`make train-tooluse` CPU default end to end (a short SFT and 2 + 1 RL steps), and its resume."""

import json
import os

import pytest

from stare_verl.jobs.backend import GpuProbe
from stare_verl.jobs.procs import RUN_TAG_ENV, leftover_processes
from stare_verl.jobs.train import main

pytestmark = pytest.mark.e2e


def _our_leftovers(tag):
    return leftover_processes(f"{tag}-", prefix=True, grace_s=20.0)


def test_cpu_default_run_writes_run_folder_and_resumes(tmp_path, monkeypatch, capsys):
    tag = f"pytest-{os.getpid()}"
    monkeypatch.setenv(RUN_TAG_ENV, tag)  # the driver tags every process of its runs with tag-<uuid>
    run = tmp_path / "run"
    (tmp_path / "cache").mkdir()  # --sft-cache must name an existing folder
    common = [
        "--cpu",
        "--run-dir",
        str(run),
        "--sft-steps",
        "40",
        "--sft-cache",
        str(tmp_path / "cache"),
        "--min-sft-accuracy",
        "0",
        "--n-eval",
        "8",
        "--n-train",
        "64",
        "--sft-threads",
        "1",
    ]
    assert main([*common, "--steps", "2"]) == 0

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["entropy_control/target_entropy"] == 0.04
        assert r["entropy_control/model_tokens"] > 0 and r["stare/nonfinite_tokens"] == 0
        assert 0 <= r["critic/score/mean"] <= 1 and r["actor/entropy"] > 0
        # the reward's own accuracy is logged per step; with 0/1 rewards it is the mean score
        assert r["reward/acc/mean"] == pytest.approx(r["critic/score/mean"])
        assert r["reward/acc/mean"] <= r["reward/has_answer/mean"] <= 1
        assert r["num_turns/mean"] >= 1
    assert (run / "checkpoints" / "global_step_2" / "stare_state.json").exists()
    assert sorted(p.name for p in (run / "plots").glob("*.png")) == [
        "dashboard.png",
        "entropy.png",
        "entropy_dynamics.png",
        "response_length.png",
        "reward.png",
    ]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["rl_checkpoint"].endswith("global_step_2/actor/huggingface")
    for key in ("eval_before", "eval_after"):
        assert set(summary[key]) == {"T=0", "T=1"} and summary[key]["T=0"]["n"] == 8
    report = summary["entropy_report"]  # the end-of-run entropy report (runlog.entropy_report)
    assert report["steps"] == 2 and report["target_entropy"] == 0.04 and report["verdict"] is not None
    assert report["acc_after"]["greedy"] == summary["eval_after"]["T=0"]["accuracy"]
    # the held-out probe: the same 8 demonstrations read by the SFT and the RL checkpoint (model tokens only)
    probe = report["heldout_entropy"]
    assert probe["before"]["episodes"] == probe["after"]["episodes"] == 8
    assert probe["before"]["tokens"] == probe["after"]["tokens"] > 8 * 10
    assert 0 < probe["before"]["entropy"] and 0 < probe["after"]["entropy"]
    assert probe["ratio"] == pytest.approx(probe["after"]["entropy"] / probe["before"]["entropy"])
    # the evaluation before RL is cached with the SFT checkpoint: later runs from it reuse it
    (sft_dir,) = (tmp_path / "cache").glob("sft-*")
    assert json.loads((sft_dir / "eval_n8_turns3.json").read_text()) == summary["eval_before"]
    assert json.loads((sft_dir / "heldout_entropy_n8.json").read_text())["before"] == probe["before"]
    assert _our_leftovers(tag) == []

    # a second invocation with the same run folder resumes from global_step_2 and runs step 3 only
    capsys.readouterr()
    assert main([*common, "--steps", "3"]) == 0
    assert f"resuming from the checkpoint of step 2 in {run / 'checkpoints'}" in capsys.readouterr().out
    parts = sorted((run / "logs").glob("verl_metrics.*.jsonl"))
    assert len(parts) == 2
    second = [json.loads(x)["step"] for x in parts[1].read_text().splitlines()]
    assert second == [3]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    state = json.loads((run / "checkpoints" / "global_step_3" / "stare_state.json").read_text())
    assert state["steps"] == 3  # the controller continued from the checkpoint, not from zero
    assert _our_leftovers(tag) == []


def test_model_without_gpu_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setenv("MODEL", "/models/qwen")
    monkeypatch.setattr(
        "stare_verl.jobs.train.entry.probe_gpu", lambda: GpuProbe(gpu=False, name=None, sglang=True)
    )
    assert main(["--family", "shortcot"]) == 2
    err = capsys.readouterr().err
    assert "MODEL=/models/qwen is for GPU runs" in err and "make train-shortcot" in err


def test_bad_steps_or_override_fail_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["--cpu", "--family", "longcot", "--run-dir", str(run), "--steps", "0"]) == 2
    assert "--steps must be in [1, 100000] (got 0)" in capsys.readouterr().err
    assert (
        main(["--cpu", "--family", "shortcot", "--run-dir", str(run), "+algorithm.stare.reweight_ww=1.2"])
        == 2
    )
    out, err = capsys.readouterr()
    assert "reweight_ww" in err and "checks passed" not in out
    assert not run.exists()
