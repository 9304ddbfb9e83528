"""Shared end-to-end fixtures.

``stare_probe_run``: the one ``main_ppo`` launch that ``test_loss_receives_weights.py`` and ``test_cpu_e2e.py`` both
read (STARE on 2 ranks with the loss probe, six steps; ``tests/support/stare_probe.py``). A verl launch on the
2-core machine pays about a minute of start-up for seconds of training, so checks that can read one run share it.
"""

from __future__ import annotations

import pytest

from tests.support.stare_probe import launch_stare_probe


@pytest.fixture(scope="session")
def stare_probe_run(tmp_path_factory) -> dict:
    """The shared STARE + loss-probe run, launched once per session (see ``launch_stare_probe``)."""
    return launch_stare_probe(tmp_path_factory.mktemp("stare_probe"))
