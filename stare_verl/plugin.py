"""verl plugin (entry point group ``verl.plugins``): loaded by ``import verl`` in every process.

Registers the ``stare`` advantage estimator and the ``stare_*`` trainer modes. verl swallows plugin
import errors at debug level, so failures are also logged here at error level.
"""

import logging

_logger = logging.getLogger("stare_verl")

# CPU backend (platform "cpu", rollout "hf"): registers only when VERL_PLATFORM=cpu; cheap otherwise.
# Must run first: importing verl's trainer/engine modules below resolves the platform singleton.
try:
    import stare_verl.cpu

    stare_verl.cpu.register()
except Exception:  # pragma: no cover - surfaced by tests/test_cpu_*.py
    _logger.exception("stare_verl: registering the CPU backend (platform cpu, rollout hf) failed")
    raise

try:
    import stare_verl.estimator  # noqa: F401  (registers adv_estimator "stare")
    import stare_verl.trainer  # noqa: F401  (registers trainer modes stare_sync, stare_colocate_async)
except Exception:  # pragma: no cover - surfaced by tests/test_plugin.py
    _logger.exception("stare_verl: registering the STARE estimator/trainer with verl failed")
    raise
