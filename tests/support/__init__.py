"""Helpers shared by the tests (imported as ``tests.support...``; the repository root is on pytest's
``pythonpath``): paths here, the CPU backend helpers in ``cpu``, the in-process agent-loop config in
``agent_loop``, the scripted OpenAI-compatible server in ``scripted_server``."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
