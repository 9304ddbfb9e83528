"""The registry of the jobs' families (:class:`~stare_verl.jobs.families.base.JobFamily`), looked up by name or alias.

The built-ins (``tooluse``, ``shortcot``, ``longcot``: ``stare_verl.jobs.families.tooluse`` and ``.cot``) come
first, tool use first (the jobs' default); a new family is passed to :func:`register_job_family`. A family answers
to its environment family's aliases too (``tool_use``, ``short_cot``, ``long_cot``), so ``--family`` accepts them
(:func:`family_arg`) and every lookup returns the family under its one name.
"""

from __future__ import annotations

from envs.families import ENV_FAMILIES, row_env_family
from envs.registry import Registry
from stare_verl.jobs.families.base import JobFamily
from stare_verl.jobs.families.cot import LONGCOT, SHORTCOT
from stare_verl.jobs.families.tooluse import TOOLUSE

__all__ = [
    "JOB_FAMILIES",
    "family_arg",
    "job_families",
    "job_family",
    "job_family_names",
    "register_job_family",
    "row_job_family",
    "unregister_job_family",
]

JOB_FAMILIES: Registry[JobFamily] = Registry("family", builtins=lambda: (TOOLUSE, SHORTCOT, LONGCOT))
"""Every registered job family."""


def register_job_family(family: JobFamily, *, replace: bool = False) -> JobFamily:
    """Register ``family`` under its name and aliases (its environment family must be registered, in
    ``envs.families``); returns it.

    Raises:
        ValueError: a spelling is taken by another family (unless ``replace`` and the same name), or its environment
            family is not the registered one of its name.
    """
    if ENV_FAMILIES.find(family.name) != family.env:
        raise ValueError(f"family {family.name!r}: its environment family is not registered (envs.families)")
    return JOB_FAMILIES.register(family, replace=replace)


def unregister_job_family(name: str) -> None:
    """Remove a registered family (tests; a built-in comes back only in a new process)."""
    JOB_FAMILIES.unregister(name)


def job_family(name: str | JobFamily) -> JobFamily:
    """The family registered as ``name`` or with ``name`` among its aliases (a :class:`JobFamily` is returned as it
    is, so that a variant such as :meth:`JobFamily.for_pretrained` passes through the functions that take a family).
    Raises ValueError, naming the registered ones, for an unknown name."""
    if isinstance(name, JobFamily):
        return name
    return JOB_FAMILIES.get(name)


def job_families() -> tuple[JobFamily, ...]:
    """Every registered family, the built-ins first."""
    return JOB_FAMILIES.values()


def job_family_names() -> tuple[str, ...]:
    """The registered names in registration order (``tooluse``, ``shortcot``, ``longcot``, then new ones)."""
    return JOB_FAMILIES.names()


def family_arg(value: str) -> str:
    """``--family``'s ``type``: the name of the family ``value`` spells (an alias gives its family's name), ``value``
    itself when it names none (argparse's ``choices=job_family_names()`` then says which are known)."""
    fam = JOB_FAMILIES.find(value)
    return fam.name if fam is not None else value


def row_job_family(env: str | None, tool_use: bool) -> JobFamily:
    """The job family of an evaluation row with ``extra_info["family"] == env`` run with (``tool_use``) or without
    the tool loop (``envs.families.row_env_family``: the tool-use family for tool-use rows, short CoT, the
    reward's default family, for other unknown ones).

    Raises:
        ValueError: that environment family has no registered job family.
    """
    return job_family(row_env_family(env, tool_use).name)
