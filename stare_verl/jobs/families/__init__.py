"""The families of the jobs, one descriptor each (:class:`JobFamily`, holding its ``envs`` family), registered by name.

- ``base``: the descriptor (:class:`JobFamily`, :class:`PretrainedTask`) and the problem it works on (``Problem``).
- ``registry``: the registry (:func:`job_family`, :func:`register_job_family`, ...; ``--family``'s :func:`family_arg`).
- ``problems``: the CPU default's problems (reasoning-gym, from the family's task table), disjoint splits, the
  verl rows (the family's ``envs`` row builder) and the RL parquet.
- ``tooluse``, ``cot``: the built-in families (``TOOLUSE``; ``SHORTCOT``, ``LONGCOT``) with their demonstrations.

The demo pipeline (``stare_verl.jobs.demo``), the evaluation, train and compare ask these; none of them compares
family names.
"""

from stare_verl.jobs.families.base import DEFAULT_FAMILY, JobFamily
from stare_verl.jobs.families.registry import (
    family_arg,
    job_families,
    job_family,
    job_family_names,
    register_job_family,
    row_job_family,
    unregister_job_family,
)

__all__ = [
    "DEFAULT_FAMILY",
    "JobFamily",
    "family_arg",
    "job_families",
    "job_family",
    "job_family_names",
    "register_job_family",
    "row_job_family",
    "unregister_job_family",
]
