"""CPU backend for verl 0.9.1's V1 trainer: a ``cpu`` platform and an ``hf`` (transformers) rollout.

Use: ``VERL_PLATFORM=cpu python -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=hf ...``
(see ``recipes/cpu/``). The registration runs from the project's ``verl.plugins`` entry point, i.e.
in every process that imports verl. The ``hf`` rollout is registered whatever the platform (on verl's CUDA
platform its server runs the model on the GPU of its trainer ranks); the ``cpu`` platform and the patches of
verl internals it needs only when ``VERL_PLATFORM=cpu``.

Modules: ``verl_compat`` (all touch points on verl internals + version check), ``platform``
(the platform), ``hf_server`` (the generation server), ``hf_rollout`` (verl adapter and replica),
``rollout_seeds`` (the hf rollout's per-request seeds, independent of which replica serves a request).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "hf"
PLATFORM_NAME = "cpu"

_registered = False  # the cpu platform and its patches
_rollout_registered = False


def _load_replica():
    from stare_verl.cpu.hf_rollout import HFReplica

    return HFReplica


def register(force: bool = False) -> bool:
    """Register the ``hf`` rollout (always, with its routing-independent request seeds:
    ``verl_compat.install_rollout_seeds``) and the ``cpu`` platform (under ``VERL_PLATFORM=cpu``); cheap and
    idempotent.

    Safe to call while ``verl/__init__`` is still importing (verl's plugin loader does that): only
    verl's platform registry is touched now; the rollout registries and the patches are applied
    when verl imports the modules concerned.

    Args:
        force: register the ``cpu`` platform and its patches even when ``VERL_PLATFORM`` is not ``cpu`` (tests).

    Returns:
        True when the ``cpu`` platform is registered (now or before), False when only the ``hf`` rollout is
        (``VERL_PLATFORM != cpu``: verl's own platform, e.g. CUDA, stays in charge).

    Raises:
        stare_verl.cpu.verl_compat.VerlVersionError: the installed verl is not 0.9.1.
    """
    global _registered, _rollout_registered
    if _registered:
        return True
    try:
        from stare_verl.cpu import verl_compat
    except Exception as e:  # the version check: say it loudly, verl's plugin loader only logs at debug
        logger.error("stare_verl hf rollout / CPU backend not registered: %s", e)
        raise
    if not _rollout_registered:
        verl_compat.register_rollout(ROLLOUT_NAME, "stare_verl.cpu.hf_rollout.HFServerAdapter", _load_replica)
        verl_compat.install_rollout_seeds(ROLLOUT_NAME)
        _rollout_registered = True
    if not force and not verl_compat.platform_is_cpu():
        return False
    from stare_verl.cpu.platform import CPUPlatform

    verl_compat.register_platform(PLATFORM_NAME, CPUPlatform)
    verl_compat.install_cpu_patches()
    _registered = True
    return True


__all__ = ["register", "ROLLOUT_NAME", "PLATFORM_NAME"]
