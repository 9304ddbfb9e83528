"""The registry of environment families (``envs.family.EnvFamily``), built-ins first, looked up by name or alias.

The built-ins are ``envs.cot.SHORT_COT_FAMILY`` / ``LONG_COT_FAMILY`` and ``envs.tool_use.TOOL_USE_FAMILY`` (the
order of ``envs.contract.FAMILIES``); a new family registers its own with :func:`register_env_family`.

Lookups: :func:`env_family` (by name or alias), :func:`env_families` (all), :func:`env_family_names`,
:func:`is_tool_family`, :func:`row_env_family` (the family that scores an evaluation row).
"""

from __future__ import annotations

from typing import Any

from envs.cot import LONG_COT_FAMILY, SHORT_COT_FAMILY
from envs.family import EnvFamily
from envs.registry import Registry
from envs.tool_use import TOOL_USE_FAMILY

__all__ = [
    "ENV_FAMILIES",
    "env_families",
    "env_family",
    "env_family_names",
    "is_tool_family",
    "register_env_family",
    "row_env_family",
    "unregister_env_family",
]

ENV_FAMILIES: Registry[EnvFamily] = Registry(
    "environment family", builtins=lambda: (SHORT_COT_FAMILY, LONG_COT_FAMILY, TOOL_USE_FAMILY)
)
"""Every registered environment family."""


def register_env_family(family: EnvFamily, *, replace: bool = False) -> EnvFamily:
    """Register ``family`` under its name and aliases; returns it. Raises ValueError for a spelling already taken by
    another one (unless ``replace`` and the same name)."""
    return ENV_FAMILIES.register(family, replace=replace)


def unregister_env_family(name: str) -> None:
    """Remove a registered family (tests; a built-in comes back only in a new process)."""
    ENV_FAMILIES.unregister(name)


def env_family(name: str) -> EnvFamily:
    """The family registered as ``name`` (or with ``name`` among its aliases). Raises ValueError (naming the
    registered ones) for an unknown name."""
    return ENV_FAMILIES.get(name)


def env_families() -> tuple[EnvFamily, ...]:
    """Every registered family, built-ins first."""
    return ENV_FAMILIES.values()


def env_family_names(aliases: bool = False) -> tuple[str, ...]:
    """The registered names, built-ins first (with ``aliases``: then every older spelling they answer to)."""
    return ENV_FAMILIES.spellings() if aliases else ENV_FAMILIES.names()


def is_tool_family(name: Any) -> bool:
    """Whether ``name`` (e.g. a row's ``extra_info["family"]``) names a registered family whose episodes use a tool."""
    fam = ENV_FAMILIES.find(name)
    return fam is not None and fam.tool_use


def row_env_family(name: str | None, tool_use: bool) -> EnvFamily:
    """The family whose reward scores a row with ``extra_info["family"] == name`` run with (``tool_use``) or without
    the tool loop: the registered family of that name when its tool use matches, else the first registered family
    with (tool loop) or without a tool (short CoT: ``envs.reward.compute_score``'s default family, which reads
    ``name`` itself)."""
    fam = ENV_FAMILIES.find(name)
    if fam is not None and fam.tool_use == bool(tool_use):
        return fam
    return next(f for f in ENV_FAMILIES if f.tool_use == bool(tool_use))
