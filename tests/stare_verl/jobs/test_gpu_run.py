"""A GPU recipe's run keeps the CPU path's run folder (``stare_verl.jobs.gpu_run``), checked on this machine with
the GPU command planned as a GPU node would run it and a fake ``main_ppo`` that writes verl's file-logger lines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stare_verl.jobs import train
from stare_verl.jobs.backend import GpuProbe
from stare_verl.jobs.gpu_run import logger_override, with_run_overrides
from stare_verl.jobs.runlog import RunFolder

H200 = GpuProbe(True, "NVIDIA H200", True)

# a stand-in for verl's main_ppo: two steps through verl's file logger (VERL_FILE_LOGGER_PATH), console lines, and
# the exit status given by FAKE_RC
FAKE_MAIN_PPO = r"""
import json, os, sys
rows = [
    {"actor/entropy": 0.31, "stare/batch_entropy": 0.30, "stare/target_entropy": 0.25, "stare/gate_on": 1.0,
     "stare/w": 1.1, "stare/m": 0.9, "stare/mean_weight": 1.02, "critic/score/mean": 0.25,
     "response_length/mean": 120.0},
    {"actor/entropy": 0.27, "stare/batch_entropy": 0.26, "stare/target_entropy": 0.25, "stare/gate_on": 1.0,
     "stare/w": 1.1, "stare/m": 0.9, "stare/mean_weight": 1.01, "critic/score/mean": 0.5,
     "response_length/mean": 110.0},
]
with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as f:
    for i, r in enumerate(rows, 1):
        print(f"step:{i} - actor/entropy:{r['actor/entropy']}", flush=True)
        f.write(json.dumps({"step": i, "data": r}) + "\n")
print(os.environ.get("FAKE_LOG", ""), file=sys.stderr, flush=True)
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


class _FakeVerl:
    """``subprocess.Popen`` for the main_ppo launch: records the command and environment, runs FAKE_MAIN_PPO."""

    launched: list[tuple[list[str], dict]] = []

    def __new__(cls, cmd, env=None, **kwargs):
        cls.launched.append((cmd, env))
        return _REAL_POPEN([sys.executable, "-c", FAKE_MAIN_PPO], env=env, **kwargs)


_REAL_POPEN = subprocess.Popen


@pytest.fixture
def gpu_node(monkeypatch):
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: H200)
    monkeypatch.setattr(train.launch.subprocess, "Popen", _FakeVerl)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _FakeVerl.launched.clear()


def test_gpu_run_folder_is_laid_out_like_a_cpu_run(gpu_node, tmp_path, capsys):
    run = tmp_path / "run"
    assert train.main(["--family", "shortcot", "--run-dir", str(run), "--steps", "2", "--logger", "console"]) == 0
    cmd, env = _FakeVerl.launched[-1]
    # verl's file logger beside the asked ones, its lines into this invocation's part under logs/
    assert "trainer.logger=[console,file]" in cmd and not any(c == "trainer.logger=[console]" for c in cmd)
    assert f"hydra.run.dir={run / 'logs' / 'hydra'}" in cmd
    assert env["VERL_FILE_LOGGER_PATH"].startswith(str(run / "logs" / "verl_metrics."))
    assert "VERL_PLATFORM" not in env  # verl's own NVIDIA platform
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["critic/score/mean"] == 0.5
    assert {"dashboard.png", "entropy.png", "reward.png", "response_length.png"} <= {
        p.name for p in (run / "plots").glob("*.png")
    }
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_status"] == 0 and summary["steps"] == 2 and summary["command"] == cmd
    assert summary["backend"]["rollout"] == "sglang" and summary["recipe"].startswith("shortcot_")
    report = summary["entropy_report"]
    assert report["steps"] == 2 and report["target_entropy"] == 0.25 and report["gate_on_share"] == 1.0
    assert all((run / "plots" / p.split("/")[-1]).is_file() for p in summary["plots"])
    log = (run / "train.log").read_text().splitlines()
    assert log[0].endswith("rollout backend sglang, platform cuda, device cuda (NVIDIA H200), sandbox none")
    assert "step:2 - actor/entropy:0.27" in log
    out = capsys.readouterr().out
    assert "done in" in out and "metrics.jsonl, plots/, summary.json" in out

    # with a checkpoint in the folder, the next invocation says it resumes (verl's resume_mode auto)
    (run / "checkpoints" / "global_step_2").mkdir(parents=True)
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    assert train.main(["--family", "shortcot", "--run-dir", str(run), "--steps", "4"]) == 0
    assert f"resuming from the checkpoint of step 2 in {run / 'checkpoints'}" in capsys.readouterr().out
    assert len(RunFolder(run).verl_metric_parts()) >= 1
    assert "trainer.logger=[console,wandb,file]" in _FakeVerl.launched[-1][0]  # verl's default list, plus file


def test_a_failed_gpu_run_keeps_what_it_got_to_and_says_how_to_resume(gpu_node, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_RC", "3")
    run = tmp_path / "run"
    assert train.main(["--family", "shortcot", "--run-dir", str(run), "--steps", "5"]) == 3
    err = capsys.readouterr().err
    assert "verl main_ppo exited with 3" in err and f"resumes from the last checkpoint in {run / 'checkpoints'}" in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_status"] == 3 and summary["steps"] == 2
    assert (run / "plots" / "dashboard.png").is_file()


@pytest.mark.parametrize("log, cause, resumable", [
    ("ray.exceptions.OutOfMemoryError: 4 worker(s) were killed due to the node running low on memory. Memory on the "
     "node (IP: 10.0.0.2, ID: ab) was 77.1GB used / 79.0GB limit (0.98)",
     "out of memory: Ray killed 4 worker(s) at 77.1 of 79.0 GB", True),
    ("Could not override 'algorithm.stare.reweight_w'.", "a configuration error", False),
])  # fmt: skip
def test_a_failed_gpu_run_names_its_cause(gpu_node, tmp_path, capsys, monkeypatch, log, cause, resumable):
    monkeypatch.setenv("FAKE_RC", "1")
    monkeypatch.setenv("FAKE_LOG", log)
    run = tmp_path / "run"
    assert train.main(["--family", "shortcot", "--run-dir", str(run), "--steps", "5"]) == 1
    err = capsys.readouterr().err
    assert f"verl main_ppo exited with 1: {cause}" in err and f"main_ppo's output: {run / 'train.log'}" in err
    assert ("resumes from the last checkpoint" in err) == resumable


def test_logger_override_keeps_the_asked_loggers_and_adds_file():
    assert logger_override(None) == "trainer.logger=[console,wandb,file]"
    assert logger_override(["console"]) == "trainer.logger=[console,file]"
    assert logger_override(["wandb", "file"]) == "trainer.logger=[wandb,file]"
    run = RunFolder("/r")
    cmd = ["py", "-m", "verl.trainer.main_ppo", "--config-path=/x", "--config-name=rec", "a=1",
           "trainer.logger=[wandb]", "b=2"]  # fmt: skip
    out = with_run_overrides(cmd, run, None)
    assert out == ["py", "-m", "verl.trainer.main_ppo", "--config-path=/x", "--config-name=rec",
                   "trainer.logger=[wandb,file]", "hydra.run.dir=/r/logs/hydra", "a=1", "b=2"]  # fmt: skip
