"""The CPU demo's tokenizer is the project's one tiny tokenizer: ``envs.tiny_hf`` (build it with
``envs.tiny_hf.build_tokenizer``). This module only keeps the old import path of ``load_tokenizer`` for
``stare_verl.jobs.evaluation.local`` until that module imports ``envs.tiny_hf`` itself."""

from __future__ import annotations

from envs.tiny_hf import load_tokenizer

__all__ = ["load_tokenizer"]
