"""verl plugin (entry point group ``verl.plugins``): loaded by ``import verl`` in every process.

Importing this module calls :func:`register`, which registers, by explicit calls: the CPU backend (only with
``VERL_PLATFORM=cpu``), the entropy-control methods' advantage estimators (``stare``, ``forking``, ``entropy_adv``, ``adaptive_entropy``, ``repo_r``) and the token-statistics trainer modes (``token_stats_sync``, ``token_stats_colocate_async`` and their older names ``stare_*``; with the trainer
guard), and the ``${stare_verl.recipe_file:...}`` OmegaConf resolver the recipes name their files with
(``stare_verl.recipe_files``; verl resolves the config in its driver and its Ray workers). verl swallows plugin import errors at debug level, so failures are also logged here at error level.
"""

import logging

_logger = logging.getLogger("stare_verl")


def register() -> None:
    """Register everything STARE adds to verl (idempotent).

    Raises:
        stare_verl.verl_compat.VerlVersionError: the installed verl is not the pinned version.
    """
    # The hf rollout (any platform) and, under VERL_PLATFORM=cpu only, the CPU platform; cheap otherwise.
    # Must run first: importing verl's trainer/engine modules below resolves the platform singleton.
    import stare_verl.cpu

    try:
        stare_verl.cpu.register()
    except Exception:  # pragma: no cover - surfaced by tests/test_cpu_*.py
        _logger.exception("stare_verl: registering the CPU backend (platform cpu, rollout hf) failed")
        raise

    import stare_verl.recipe_files

    stare_verl.recipe_files.register_resolver()  # verl-free, before any config is resolved

    import stare_verl.methods
    import stare_verl.trainer

    try:
        stare_verl.methods.register()  # the methods' advantage estimators: stare, forking, entropy_adv, ...
        stare_verl.trainer.register()  # trainer modes token_stats_sync, token_stats_colocate_async + the guard
    except Exception:  # pragma: no cover - surfaced by tests/test_estimator_verl.py
        _logger.exception("stare_verl: registering the STARE estimator/trainer with verl failed")
        raise


register()
