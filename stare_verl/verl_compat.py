"""The verl version gate, and the one patch of verl that STARE itself (not only the CPU backend) needs.

Every patch of verl internals in this project sits behind :func:`check_verl_version`: the CPU backend's
(``stare_verl.cpu.verl_compat``, imported only with ``VERL_PLATFORM=cpu``) and the trainer guard here,
which is installed on every machine (GPU nodes too), hence outside ``cpu/``.

The trainer guard wraps ``verl.trainer.ppo.v1.trainer_base.PPOTrainer.__init__`` so that
``algorithm.adv_estimator=stare`` with a trainer that cannot feed the estimator (any mode but ``stare_*``)
stops at start-up, before workers and rollouts, instead of at the first advantage computation. It relies on
verl 0.9.1's class layout (every V1 trainer mode subclasses ``PPOTrainer`` and receives the full config).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

PINNED_VERL_VERSION = "0.9.1"


class VerlVersionError(RuntimeError):
    """Raised when the installed verl is not the version these patches were written against."""


def _installed_verl_version() -> str:
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError as e:  # pragma: no cover - verl is a dependency
        raise VerlVersionError("stare_verl needs verl installed (pip install 'verl[verl-core]==0.9.1')") from e


def check_verl_version() -> str:
    """Return the installed verl version; raise :class:`VerlVersionError` unless it is the pinned one."""
    version = _installed_verl_version()
    if version != PINNED_VERL_VERSION:
        raise VerlVersionError(
            f"stare_verl patches verl internals (the stare trainer guard; the CPU backend: platform 'cpu', rollout "
            f"'hf') and supports verl=={PINNED_VERL_VERSION} only; found verl=={version}. Install "
            f"verl[verl-core]=={PINNED_VERL_VERSION}."
        )
    return version


def install_trainer_guard(refuse: Callable[[object, object], None]) -> None:
    """Wrap verl's ``PPOTrainer.__init__`` so that ``refuse(trainer, config)`` runs first (idempotent).

    Args:
        refuse: raises when the trainer cannot run the configured estimator; returns None otherwise.

    Raises:
        VerlVersionError: the installed verl is not :data:`PINNED_VERL_VERSION`.
    """
    check_verl_version()
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    init = PPOTrainer.__init__
    if getattr(init, "_stare_guard", False):
        return

    def __init__(self, config, *args, **kwargs):
        refuse(self, config)
        init(self, config, *args, **kwargs)

    __init__._stare_guard = True
    __init__.__wrapped__ = init
    PPOTrainer.__init__ = __init__
