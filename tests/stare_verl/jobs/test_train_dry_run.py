"""``stare-verl train --dry-run`` on a machine without a GPU (a monkeypatched probe): the backend it would choose,
the exact main_ppo command with its Hydra overrides, the composed config; nothing trained, written or launched
(issue 32 items 4 and 6). Also the GPU options (--gpu, --gpu-recipe, --n-gpus, --nnodes, --logger) on real runs."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from stare_verl.jobs import train
from stare_verl.jobs.backend import GpuProbe
from stare_verl.recipe_files import recipes_dir
from tests.support.inprocess import run_main
from tests.support.model_folder import write_model_folder

pytestmark = pytest.mark.integration

NO_GPU = GpuProbe(gpu=False, name=None, sglang=False)


class _NoLaunch(subprocess.Popen):
    """subprocess.Popen that fails the test (a class: Ray subclasses Popen when it is first imported)."""

    def __init__(self, cmd, *args, **kwargs):
        pytest.fail(f"launched {cmd}")


@pytest.fixture
def cpu_machine(monkeypatch, tmp_path):
    """A machine without a GPU, the working directory an empty folder; launching anything fails the test."""
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: NO_GPU)
    monkeypatch.setattr(train.launch.subprocess, "Popen", _NoLaunch)
    monkeypatch.setattr(train.launch, "run_main_ppo", lambda *a, **k: pytest.fail("main_ppo launched"))
    monkeypatch.delenv("MODEL", raising=False)
    monkeypatch.delenv("RUN_DIR", raising=False)
    monkeypatch.delenv("STARE_STALL_TIMEOUT_S", raising=False)
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plan(out: str, name: str):
    """(the composed config, the command as a list, the plan's own lines) of a dry run's stdout."""
    lines = out.splitlines()
    head = f"[{name}] composed config"
    start = next(i for i, ln in enumerate(lines) if ln.startswith(head)) + 1
    end = next(i for i, ln in enumerate(lines) if i > start and ln.startswith(f"[{name}] backend: "))
    cfg = OmegaConf.create("\n".join(lines[start:end]))
    cmd = shlex.split(lines[lines.index(f"[{name}] command:") + 1])
    return cfg, cmd, [ln for ln in lines[end:] if ln.startswith(f"[{name}]")]


def test_dry_run_plans_the_gpu_recipe_on_a_cpu_machine(cpu_machine, capsys, monkeypatch):
    rc = train.main(["--family", "shortcot", "--dry-run", "--gpu", "--n-gpus", "4", "--nnodes", "2",
                     "--logger", "console,wandb", "--steps", "7", "algorithm.stare.target_entropy=0.25"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    cfg, cmd, plan = _plan(out, "train-shortcot")
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"] and "main_ppo" in out
    assert cmd[4] == "--config-name=shortcot_qwen2.5-math-7b_stare"
    run = cpu_machine / "runs" / "shortcot-stare-seed0-sglang"
    # verl's file logger beside the asked ones and Hydra's folder under logs/: the run folder is the CPU run's
    assert cmd[5:] == ["trainer.logger=[console,wandb,file]", f"hydra.run.dir={run / 'logs' / 'hydra'}",
                       f"trainer.default_local_dir={run / 'checkpoints'}", "trainer.total_training_steps=7",
                       "trainer.n_gpus_per_node=4", "trainer.nnodes=2", "algorithm.stare.target_entropy=0.25"]  # fmt: skip
    assert cfg.algorithm.adv_estimator == "stare" and cfg.algorithm.stare.target_entropy == 0.25
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes, list(cfg.trainer.logger)) == (
        4,
        2,
        ["console", "wandb", "file"],
    )
    assert (
        cfg.actor_rollout_ref.rollout.name == "sglang"
        and cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-Math-7B"
    )
    assert cfg.data.train_files == "data/shortcot/dapo_math_train.parquet"
    assert plan[0].startswith("[train-shortcot] backend: gpu-sglang (verl + SGLang, the GPU recipe): rollout backend "
                              "sglang, platform cuda")  # fmt: skip
    assert plan[1].startswith(
        "[train-shortcot] chosen because: --gpu (a real run here: this machine has no GPU"
    )
    assert f"[train-shortcot] run folder (not created): {run}" in plan
    assert (
        "[train-shortcot] model Qwen/Qwen2.5-Math-7B; 4 GPU(s) per node x 2 node(s); logger ['console', "
        "'wandb', 'file']; 7 steps" in plan
    )
    assert any(
        "no data file data/shortcot/dapo_math_train.parquet here yet (make data-hf" in ln for ln in plan
    )
    ok = next(i for i, ln in enumerate(plan) if ln.startswith("[train-shortcot] ok: validates as verl would at "
                                                                 "launch: adv_estimator=stare"))  # fmt: skip
    # the stall watch of the CPU runs watches the GPU run too
    assert "[train-shortcot] stall watch: exit 124 after 1800 s without an RL step (STARE_STALL_TIMEOUT_S)" in (
        ", ".join(plan))
    # --nnodes 2: what to run on the head, on the worker node, and the run itself
    multi = [ln.removeprefix("[train-shortcot] ").strip() for ln in plan[ok + 1 :]]
    assert multi[0].startswith("multi-node run on 2 nodes (trainer.nnodes=2)")
    head = multi[multi.index("on the head node:") + 1]
    assert head == "ray start --head --port=6379 --num-gpus=4 --dashboard-host=0.0.0.0 --dashboard-port=8265"
    assert multi[multi.index("on each of the 1 worker node(s), once the head is up:") + 1] == (
        "ray start --address=$HEAD_IP:6379 --num-gpus=4")
    submit = shlex.split(next(ln for ln in multi if ln.startswith("ray job submit")))
    assert submit[:4] == ["ray", "job", "submit", "--address=http://$HEAD_IP:8265"]
    assert submit[5:8] == ["--", "python", "-m"] and submit[8:] == ["verl.trainer.main_ppo", *cmd[3:]]
    runtime_env = json.loads(submit[4].removeprefix("--runtime-env-json="))
    assert set(runtime_env) == {"env_vars"} and not {"PYTHONPATH", "VERL_FILE_LOGGER_PATH", "STARE_VERL_RUN_TAG",
                                                     "VERL_PLATFORM"} & set(runtime_env["env_vars"])  # fmt: skip
    driver = next(ln for ln in multi if ln.startswith("env RAY_ADDRESS="))
    assert shlex.split(driver) == ["env", "RAY_ADDRESS=$HEAD_IP:6379", "stare-verl", "train", "--gpu", "--family",
                                   "shortcot", "--steps", "7", "--n-gpus", "4", "--nnodes", "2", "--logger",
                                   "console,wandb", "algorithm.stare.target_entropy=0.25"]  # fmt: skip
    assert any("every node advertises 4 GPU(s)" in ln for ln in multi)
    assert not any("bubblewrap" in ln for ln in multi)  # short CoT has no tool
    assert sorted(p.name for p in cpu_machine.iterdir()) == []  # no run folder, no cache, nothing
    # one node: no multi-node part; the tool family names the sandbox's needs per node
    assert train.main(["--family", "shortcot", "--dry-run", "--gpu"]) == 0
    assert "multi-node run" not in capsys.readouterr().out
    assert train.main(["--family", "tooluse", "--dry-run", "--gpu", "--nnodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "on each of the 2 worker node(s)" in out and "every node needs bubblewrap" in out
    assert "SandboxFusion URL reachable from every node" in out


def test_dry_run_with_model_plans_the_gpu_run_where_a_real_run_is_an_error(cpu_machine, capsys, monkeypatch):
    """MODEL=... without a GPU stays a clear error for a real run; with --dry-run it plans the GPU recipe (the 1.5B
    pair here, with the GRPO-ds twin), MODEL as the model path, and says the folder is missing on this machine."""
    monkeypatch.setenv("MODEL", "/models/qwen")
    assert train.main(["--family", "shortcot"]) == 2
    err = capsys.readouterr().err
    assert "MODEL=/models/qwen is for GPU runs" in err and "make train-shortcot" in err and "--dry-run" in err
    argv = [
        "--family",
        "shortcot",
        "--dry-run",
        "--gpu-recipe",
        "shortcot_qwen2.5-math-1.5b",
        "--method",
        "grpo",
    ]
    assert train.main(argv) == 0
    out = capsys.readouterr().out
    cfg, cmd, plan = _plan(out, "train-shortcot")
    assert (
        "--config-name=shortcot_qwen2.5-math-1.5b_grpo" in cmd
        and "actor_rollout_ref.model.path=/models/qwen" in cmd
    )
    assert "++algorithm.stare.reweight_w=1.0" in cmd  # the twin's pins
    assert cfg.actor_rollout_ref.model.path == "/models/qwen" and cfg.trainer.n_gpus_per_node == 4
    assert (cfg.algorithm.stare.reweight_w, cfg.algorithm.stare.reweight_m) == (1.0, 1.0)
    assert plan[1].startswith("[train-shortcot] chosen because: MODEL=/models/qwen (a real run here:")
    assert "[train-shortcot] note: a real run here would stop: MODEL=/models/qwen: no such folder" in plan
    assert train.main(["--family", "shortcot", "--dry-run", "--cpu"]) == 2  # MODEL with --cpu: the same error
    assert "--cpu was given" in capsys.readouterr().err
    assert list(cpu_machine.iterdir()) == []


def test_dry_run_of_the_cpu_default_prints_the_tiny_recipe_command(cpu_machine, capsys):
    rc = train.main(
        ["--family", "tooluse", "--dry-run", "--steps", "3", "--logger", "console", "--seed", "2"]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    cfg, cmd, plan = _plan(out, "train-tooluse")
    run = cpu_machine / "runs" / "tooluse-stare-seed2"
    assert cmd[3:5] == [f"--config-path={recipes_dir() / 'cpu'}", "--config-name=tooluse_tiny_stare"]
    assert (
        f"data.train_files={run / 'data' / 'train.parquet'}" in cmd
        and "trainer.total_training_steps=3" in cmd
    )
    assert "trainer.logger=[console,file]" in cmd  # metrics.jsonl is read from verl's file logger
    sft = cmd[5].removeprefix("actor_rollout_ref.model.path=")
    assert sft.startswith(str(cpu_machine / "cache" / "sft-"))
    assert cfg.algorithm.adv_estimator == "stare" and cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3 and cfg.data.seed == 2
    assert plan[0].startswith(
        "[train-tooluse] backend: cpu (verl on this CPU, the tiny recipe): rollout backend hf"
    )
    assert any(f"the cold-start SFT checkpoint {sft} is not cached yet" in ln for ln in plan)
    assert "CPU rank(s) per node" in out and plan[-1].startswith("[train-tooluse] ok: validates")
    assert "[train-tooluse] stall watch: exit 124 after 1800 s without an RL step (STARE_STALL_TIMEOUT_S), or 180 s " \
        "without one after a Ray worker's death" in plan
    assert list(cpu_machine.iterdir()) == []


@pytest.mark.parametrize(("value", "line"), [
    ("600", "stall watch: exit 124 after 600 s without an RL step (STARE_STALL_TIMEOUT_S), or 180 s without one "
            "after a Ray worker's death"),
    ("120", "stall watch: exit 124 after 120 s without an RL step (STARE_STALL_TIMEOUT_S)"),  # comes before 180 s
    ("1234567", "stall watch: exit 124 after 1234567 s without an RL step"),
    ("0", "stall watch: off (STARE_STALL_TIMEOUT_S=0)"),
])
def test_dry_run_says_when_the_run_would_be_stopped(cpu_machine, capsys, monkeypatch, value, line):
    monkeypatch.setenv("STARE_STALL_TIMEOUT_S", value)
    assert train.main(["--family", "tooluse", "--dry-run"]) == 0
    plan = [ln for ln in capsys.readouterr().out.splitlines() if "stall watch" in ln]
    assert len(plan) == 1 and plan[0].startswith(f"[train-tooluse] {line}")
    assert ("Ray worker" in plan[0]) == (value in ("600", "1234567"))
    monkeypatch.setenv("STARE_STALL_TIMEOUT_S", "5")  # too short: refused before any plan
    assert train.main(["--family", "tooluse", "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "stall watch" not in out and "STARE_STALL_TIMEOUT_S='5'" in err


def test_dry_run_errors_are_one_line(cpu_machine, capsys):
    assert train.main(["--family", "shortcot", "--dry-run", "--gpu", "algorithm.stare.variant=X9"]) == 2
    out, err = capsys.readouterr()
    assert "[train-shortcot] command:" in out and "would fail at launch" in err and "variant" in err
    assert train.main(["--family", "shortcot", "--dry-run", "--gpu", "--gpu-recipe", "shortcot_nope"]) == 2
    err = capsys.readouterr().err
    assert "no GPU recipe shortcot_nope_stare" in err and "shortcot_qwen2.5-math-1.5b" in err
    assert train.main(["--family", "shortcot", "--dry-run", "--gpu", "--n-eval", "5"]) == 2
    assert "--n-eval only apply to the CPU" in capsys.readouterr().err
    assert list(cpu_machine.iterdir()) == []


def test_gpu_options_on_real_runs(cpu_machine, capsys, monkeypatch):
    """--gpu without a usable GPU, --n-gpus on the CPU run and --gpu-recipe on the tiny recipe stop before anything
    runs; --gpu --cpu is a usage error, unknown loggers and --n-gpus 0 are one-line errors of the options."""
    assert train.main(["--family", "shortcot", "--gpu"]) == 2
    err = capsys.readouterr().err
    assert (
        "--gpu asks for the GPU recipe" in err and "no NVIDIA GPU listed" in err and "--dry-run --gpu" in err
    )
    assert train.main(["--family", "shortcot", "--n-gpus", "2"]) == 2
    assert "--n-gpus count GPUs and this is the CPU run" in capsys.readouterr().err
    assert train.main(["--family", "shortcot", "--gpu-recipe", "shortcot_qwen2.5-math-1.5b"]) == 2
    assert "--gpu-recipe applies to the GPU recipe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--gpu", "--cpu"])
    assert "not allowed with" in capsys.readouterr().err
    for argv, said in ((["--logger", "console,slack"], "error: --logger: unknown logger slack (verl's: "),
                       (["--logger", ","], "error: --logger: expected logger names"),
                       (["--n-gpus", "0"], "error: --n-gpus must be >= 1 (got 0)")):  # fmt: skip
        assert train.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(said) and err.count("\n") == 1
    assert list(cpu_machine.iterdir()) == []


def test_gpu_run_takes_the_recipe_gpu_count_and_logger(monkeypatch, tmp_path):
    """On a GPU node with SGLang the options reach main_ppo's command (the recipe, then the Hydra keys)."""
    launched = []

    real_popen = train.launch.subprocess.Popen

    class Fake:
        def __new__(cls, cmd, **kwargs):
            launched.append(cmd)
            return real_popen([sys.executable, "-c", "pass"], **kwargs)

    monkeypatch.setattr(train.entry, "probe_gpu", lambda: GpuProbe(True, "NVIDIA H200", True))
    monkeypatch.setattr(train.launch.subprocess, "Popen", Fake)
    monkeypatch.delenv("MODEL", raising=False)
    assert train.main(["--family", "shortcot", "--gpu", "--run-dir", str(tmp_path / "r"), "--gpu-recipe",
                       "shortcot_qwen2.5-math-1.5b", "--n-gpus", "2", "--logger", "console"]) == 0  # fmt: skip
    cmd = launched[-1]
    assert "--config-name=shortcot_qwen2.5-math-1.5b_stare" in cmd
    assert cmd[-1] == "trainer.n_gpus_per_node=2" and "trainer.logger=[console,file]" in cmd


@pytest.mark.parametrize(("family", "method", "recipe", "key", "process"), [
    ("short_cot", "grpo", "shortcot_tiny_grpo", "++algorithm.stare.reweight_w=1.0", True),  # the alias; the twin's pins
    ("tooluse", "entropy_bonus:coef=0.01", "tooluse_tiny_grpo", "++actor_rollout_ref.actor.entropy_coeff=0.01", False),
])  # fmt: skip
def test_python_dash_m_plans_a_family_and_method(
    tmp_path, monkeypatch, capsys, family, method, recipe, key, process
):
    """``python -m stare_verl.jobs.train --dry-run`` (the package's ``__main__``), a process of its own on this
    machine (``process``; else the ``main`` it runs, in this process): the plan of the family's tiny recipe for the
    method, validated, and nothing written."""
    import os

    env = {**os.environ, "STARE_CACHE_DIR": str(tmp_path / "cache")}
    for name in ("MODEL", "RUN_DIR", "STARE_STALL_TIMEOUT_S", "RAY_ADDRESS"):
        env.pop(name, None)
    argv = ["--cpu", "--dry-run", "--family", family, "--method", method, "--steps", "3"]
    if process:
        proc = subprocess.run([sys.executable, "-m", "stare_verl.jobs.train", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    else:
        for name in ("MODEL", "RUN_DIR", "STARE_STALL_TIMEOUT_S", "RAY_ADDRESS"):
            monkeypatch.delenv(name, raising=False)
        proc = run_main(train.main, argv, monkeypatch, capsys, env={"STARE_CACHE_DIR": env["STARE_CACHE_DIR"]},
                        cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    name = "train-" + family.replace("_", "")
    _, cmd, plan = _plan(proc.stdout, name)
    assert f"--config-name={recipe}" in cmd and key in cmd and "trainer.total_training_steps=3" in cmd
    label = method.replace(":", "-").replace("=", "")
    assert f"trainer.experiment_name={family.replace('_', '')}-{label}-seed0" in cmd
    assert plan[-1].startswith(f"[{name}] ok: validates as verl would at launch")
    assert list(tmp_path.iterdir()) == []  # no run folder, no cache


def test_gpu_dry_run_loads_model_as_the_recipe_s_model_path(cpu_machine, capsys, monkeypatch):
    """--gpu --model: verl's actor_rollout_ref.model.path (a folder as given, a registered model's prepared folder);
    the CPU pipeline's defaults of a --model run (20 steps, 100 held-out problems) are not the GPU recipe's."""
    folder = write_model_folder(cpu_machine / "my-model")
    assert train.main(["--family", "shortcot", "--dry-run", "--gpu", "--model", str(folder)]) == 0
    cfg, cmd, plan = _plan(capsys.readouterr().out, "train-shortcot")
    assert f"actor_rollout_ref.model.path={folder}" in cmd and cfg.actor_rollout_ref.model.path == str(folder)
    assert not [c for c in cmd if c.startswith(("trainer.total_training_steps=", "data.seed="))]
    assert not [p for p in plan if "would stop" in p]
    assert train.main(["--family", "shortcot", "--dry-run", "--gpu", "--model", "smollm2-135m"]) == 0
    cfg, cmd, plan = _plan(capsys.readouterr().out, "train-shortcot")
    prepared = cpu_machine / "cache" / "models" / "smollm2-135m"
    assert cfg.actor_rollout_ref.model.path == str(prepared)
    assert any(p.startswith("[train-shortcot] note: a real run here would stop: model smollm2-135m is not prepared "
                            f"in {prepared}: run `make model`") for p in plan)  # fmt: skip


@pytest.mark.parametrize(("argv", "env", "said"), [
    (["--model", "tiny"], None, "error: --model tiny is the CPU pipeline's from-scratch model; the GPU recipe (--gpu) "
                                "takes a registered pretrained model (smollm2-135m), a model folder or a Hugging Face "
                                "hub id\n"),
    (["--model", "Qwen/Qwen2.5-7B"], "/models/qwen", "error: --model Qwen/Qwen2.5-7B and MODEL=/models/qwen name "
                                                     "different models: give one of them\n"),
])  # fmt: skip
def test_gpu_model_that_cannot_be_the_recipe_s_is_one_line(cpu_machine, capsys, monkeypatch, argv, env, said):
    if env:
        monkeypatch.setenv("MODEL", env)
    assert train.main(["--family", "shortcot", "--dry-run", "--gpu", *argv]) == 2
    assert capsys.readouterr().err == said


def test_gpu_cluster_plan_passes_model_on(cpu_machine, capsys):
    from stare_verl.jobs.cluster import driver_argv

    opts = train.parse_options(["--gpu", "--model", "Qwen/Qwen2.5-7B", "--family", "shortcot"])
    assert driver_argv(opts, opts.kind_defaults()) == ["stare-verl", "train", "--gpu", "--family", "shortcot",
                                                       "--model", "Qwen/Qwen2.5-7B"]  # fmt: skip


def _broken_model(folder, how: str):
    """A model folder whose weights cannot be loaded, ``how``: config only, or model.safetensors with a garbage header,
    cut in half or empty, or a shard index whose second shard is missing."""
    from tests.support.model_folder import write_weights

    write_model_folder(folder, weights=how != "config_only")
    f = folder / "model.safetensors"
    if how == "garbage_header":
        f.write_bytes(b"GARBAGEGARBAGE" + f.read_bytes()[14:])
    elif how == "truncated":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif how == "empty":
        f.write_bytes(b"")
    elif how == "missing_shard":
        f.unlink()
        write_weights(folder / "model-00001-of-00002.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    return folder


_BROKEN = {
    "config_only": "the folder has no weights transformers loads (none of model.safetensors, ",
    "garbage_header": "model.safetensors is not a readable safetensors file (Error while deserializing header: header "
                      "too large)",
    "truncated": "model.safetensors is not a readable safetensors file (Error while deserializing header: incomplete "
                 "metadata, file not fully covered)",
    "empty": "model.safetensors is not a readable safetensors file (Error while deserializing header: header too "
             "small)",
    "missing_shard": "model.safetensors.index.json names the shard model-00002-of-00002.safetensors, missing from the "
                     "folder",
}  # fmt: skip


@pytest.mark.parametrize("how", sorted(_BROKEN))
@pytest.mark.parametrize("dry", [False, True])
def test_a_model_folder_whose_weights_do_not_load_is_one_line_before_anything(cpu_machine, capsys, how, dry):
    """--model PATH whose weights do not load: refused with exit 2 and one line
    naming the file, before a run folder, a cache or a process exists (the real run and its dry run alike)."""
    folder = _broken_model(cpu_machine / "bad", how)
    dry_run = ["--dry-run"] if dry else []
    assert train.main(["--family", "shortcot", "--model", str(folder), *dry_run]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --model {folder}: {_BROKEN[how]}") and err.count("\n") == 1
    assert err.endswith("; give a folder whose weights load (save or copy the model again)\n")
    assert sorted(p.name for p in cpu_machine.iterdir()) == ["bad"]  # no run folder, no cache


@pytest.mark.parametrize("prefix", ["", "+", "++"])
@pytest.mark.parametrize("dry", [False, True])
def test_a_model_path_override_points_to_model(cpu_machine, capsys, prefix, dry):
    """An override of actor_rollout_ref.model.path would train another model than the one the job evaluates and
    names: refused with exit 2 and one line naming --model, sound folder, broken folder or no folder alike, before
    anything is written."""
    dry_run = ["--dry-run"] if dry else []
    for folder in (write_model_folder(cpu_machine / "good"), _broken_model(cpu_machine / "bad", "truncated"),
                   cpu_machine / "no"):  # fmt: skip
        assert train.main(["--family", "shortcot", *dry_run, f"{prefix}actor_rollout_ref.model.path={folder}"]) == 2
        assert capsys.readouterr().err == (
            f"error: override actor_rollout_ref.model.path={folder}: the CPU job trains the model of --model (its "
            f"evaluations, warm start and summary follow it); give --model {folder} instead\n")
    assert sorted(p.name for p in cpu_machine.iterdir()) == ["bad", "good"]  # no run folder, no cache


def test_a_damaged_prepared_model_is_a_note_of_the_dry_run_and_an_error_of_the_run(cpu_machine, capsys):
    from stare_verl.models.prepare import PREPARED_MARK

    prepared = _broken_model(cpu_machine / "cache" / "models" / "smollm2-135m", "truncated")
    (prepared / PREPARED_MARK).write_text("{}")
    said = (f"model smollm2-135m is prepared in {prepared}, but {_BROKEN['truncated']}: prepare it again (`make "
            "model`, or `python -m stare_verl.models prepare smollm2-135m`)")  # fmt: skip
    assert train.main(["--family", "shortcot", "--model", "smollm2-135m", "--dry-run"]) == 0
    _, _, plan = _plan(capsys.readouterr().out, "train-shortcot")
    assert f"[train-shortcot] note: a real run here would stop: {said}" in plan
    assert train.main(["--family", "shortcot", "--model", "smollm2-135m"]) == 2
    assert capsys.readouterr().err == f"error: {said}\n"
    assert train.main(["--family", "shortcot", "--model", "smollm2-135m", "--dry-run", "--gpu"]) == 0
    _, _, plan = _plan(capsys.readouterr().out, "train-shortcot")
    assert f"[train-shortcot] note: a real run here would stop: {said}" in plan
    assert sorted(p.name for p in cpu_machine.iterdir()) == ["cache"]


@pytest.mark.parametrize(("where", "override", "said"), [
    ("--cpu", "data.max_response_length=0", "data.max_response_length must be an integer >= 1 (got 0)"),
    ("--cpu", "data.max_response_length=-5", "data.max_response_length must be an integer >= 1 (got -5)"),
    ("--cpu", "actor_rollout_ref.actor.optim.lr=-1",
     "actor_rollout_ref.actor.optim.lr must be a number in (0, 1] (got -1)"),
    ("--gpu", "actor_rollout_ref.actor.optim.lr=abc",
     "actor_rollout_ref.actor.optim.lr must be a number in (0, 1] (got 'abc')"),
    ("--cpu", "actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n must be an integer >= 1 (got 0)"),
    ("--gpu", "actor_rollout_ref.rollout.temperature=-1",
     "actor_rollout_ref.rollout.temperature must be a number >= 0 (got -1)"),
    ("--gpu", "actor_rollout_ref.model.path=/tmp",
     "actor_rollout_ref.model.path must be a model folder with config.json (got /tmp, a folder without one)"),
    ("--cpu", "actor_rollout_ref.rollout.top_p=1.5",
     "actor_rollout_ref.rollout.top_p must be a number in (0, 1] (got 1.5)"),
    ("--gpu", "actor_rollout_ref.actor.ppo_epochs=0",
     "actor_rollout_ref.actor.ppo_epochs must be an integer >= 1 (got 0)"),
    ("--cpu", "algorithm.stare.reweight_ww=2", "recipes/cpu/shortcot_tiny_stare.yaml with these overrides does not "
     "compose: override 'algorithm.stare.reweight_ww=2': no key algorithm.stare.reweight_ww in this recipe; did you "
     "mean algorithm.stare.reweight_w?"),
    ("--gpu", "algorithm.stare.reweight_ww=2", "recipes/shortcot_qwen2.5-math-7b_stare.yaml with these overrides "
     "does not compose: override 'algorithm.stare.reweight_ww=2': no key algorithm.stare.reweight_ww in this recipe; "
     "did you mean algorithm.stare.reweight_w?"),
])  # fmt: skip
def test_dry_run_refuses_impossible_override_values(cpu_machine, capsys, where, override, said):
    """An override whose value no run can take stops the dry run as a bad option does: one line, status 2, before
    the plan; nothing written."""
    assert train.main(["--family", "shortcot", "--dry-run", where, override]) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {said}\n"
    assert "composed config" not in out and "command:" not in out
    assert list(cpu_machine.iterdir()) == []


def test_a_method_config_error_of_the_dry_run_is_one_line(cpu_machine, capsys):
    assert train.main(["--family", "shortcot", "--dry-run", "--cpu", "algorithm.stare.target_entropy=-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "algorithm.stare.target_entropy" in err and "(got -1)" in err


def test_real_runs_refuse_impossible_override_values_before_anything_is_written(cpu_machine, capsys, monkeypatch):
    """The CPU run before its cold-start SFT, the GPU run before its run folder and main_ppo."""
    assert train.main(["--family", "shortcot", "data.max_response_length=0"]) == 2
    assert capsys.readouterr().err.endswith(
        "error: data.max_response_length must be an integer >= 1 (got 0)\n")  # fmt: skip
    assert list(cpu_machine.iterdir()) == []
    monkeypatch.setattr(train.entry, "probe_gpu", lambda: GpuProbe(True, "NVIDIA H200", True))
    for override, said in (("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n must be an integer >= 1"),
                           ("algorithm.stare.reweight_ww=2", "did you mean algorithm.stare.reweight_w?")):  # fmt: skip
        assert train.main(["--family", "shortcot", "--gpu", override]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and said in err and err.count("\n") == 1
    assert list(cpu_machine.iterdir()) == []


def test_a_finished_run_of_other_settings_is_refused_and_the_same_command_is_nothing_to_train(
    cpu_machine, tmp_path, capsys
):
    """``train --run-dir`` on a finished run: the same command has nothing to train (status 0); another lr (an
    override) or method setting is refused with what differs, never "nothing to train" as if it were that run."""
    import json

    from stare_verl.jobs.train.options import parse_options

    run = tmp_path / "run"
    (run / "checkpoints" / "global_step_3").mkdir(parents=True)
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3")
    argv = ["--cpu", "--family", "shortcot", "--method", "stare", "--steps", "3", "--run-dir", str(run)]
    opts = parse_options(argv)
    (run / "summary.json").write_text(json.dumps({"steps": 3, "settings": opts.run_settings()}))
    (run / "train.log").write_text("the run's own log\n")
    files = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert train.main(argv) == 0
    assert "nothing to train" in capsys.readouterr().out
    assert train.main([a for a in argv if a != "--cpu"]) == 0  # the machine flag is no setting of the run
    assert "nothing to train" in capsys.readouterr().out
    for extra, said in [(["actor_rollout_ref.actor.optim.lr=1e-4"], "overrides none, not [actor_rollout_ref.actor."
                                                                        "optim.lr=1e-4]"),
                        (["--method", "stare:reweight_w=2"], "method stare, not stare:reweight_w=2")]:  # fmt: skip
        assert train.main([*argv, *extra]) == 2
        out, err = capsys.readouterr()
        assert f"holds a finished run of other settings ({said})" in err and "nothing to train" not in out
    # neither the refusals nor "nothing to train" wrote into the finished run (its log gained no verl warnings)
    assert (run / "train.log").read_text() == "the run's own log\n"
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == files
