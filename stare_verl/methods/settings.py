"""How the entropy-control methods read their settings: the one boolean reader of the project, plain mappings
of OmegaConf sections, and validation errors that name the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from stare_verl.validation import error_text


class MethodConfigError(ValueError):
    """An entropy-control method's config is invalid; the message names the key and what is allowed."""


class ConfigBoolError(ValueError):
    """A boolean config key holds a value that is no boolean; the message names the key and the value."""


_TRUE = frozenset({"true", "t", "yes", "y", "on", "1"})
_FALSE = frozenset({"false", "f", "no", "n", "off", "0"})
_MISSING = object()


def config_bool(value: Any, key: str, null: bool | None = None) -> bool:
    """The one reading of a boolean config key (every method, the estimator, the trainer and ``stare-verl check``).

    Args:
        value: the key's value: a bool (numpy's too), the ints 0 / 1, or a string ``true/false``, ``yes/no``,
            ``on/off``, ``t/f``, ``y/n``, ``1/0`` (any case, surrounding spaces ignored): the spellings pydantic
            and Hydra read as booleans, so ``0`` and ``"false"`` are False everywhere (never true as a non-empty
            string or a non-zero object).
        key: the key's full name, for the error (e.g. ``algorithm.norm_adv_by_std_in_grpo``).
        null: what None (YAML ``null``) means; None: None is not allowed.
    Returns:
        the bool.
    Raises:
        ConfigBoolError: any other value (``"maybe"``, ``2``, ``0.5``, a list, None where ``null`` is None),
            naming ``key``.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value is None:
        if null is not None:
            return null
    elif isinstance(value, int) and value in (0, 1):
        return bool(value)
    elif isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ConfigBoolError(f"{key} must be a boolean (true or false), got {value!r}")


def read_bool(section: Any, key: str, default: bool, where: str, null: bool | None = None) -> bool:
    """:func:`config_bool` of ``section[key]`` (a mapping, DictConfig or object with attributes; None: empty),
    ``default`` when the key is absent. ``where`` is the section's name (``algorithm``), for the error.

    Raises:
        ConfigBoolError: the value is no boolean (or None where ``null`` is None).
    """
    if section is None:
        return default
    if hasattr(section, "get"):
        value = section.get(key, _MISSING)
    else:
        value = getattr(section, key, _MISSING)
    return default if value is _MISSING else config_bool(value, f"{where}.{key}", null)


def plain_mapping(obj: Any, where: str) -> dict[str, Any]:
    """OmegaConf DictConfig / Mapping / None -> plain dict.

    Raises:
        MethodConfigError: ``obj`` is neither (``where`` names the config key).
    """
    if obj is None:
        return {}
    if type(obj).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        obj = OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, Mapping):
        return dict(obj)
    raise MethodConfigError(f"{where} must be a mapping, got {type(obj).__name__}")


def format_validation_error(err: ValidationError, where: str, model: type[BaseModel]) -> str:
    """One line per problem, each naming ``<where>.<key>``; an unknown key names the nearest allowed one (a
    misspelling) and lists them all."""
    import difflib

    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(config)"
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields)
            near = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
            hint = f"did you mean {near[0]}? " if near else ""
            lines.append(f"{where}.{key}: unknown key; " + (f"{hint}allowed keys: {allowed}" if allowed else
                                                             "it takes no settings"))  # fmt: skip
        else:
            lines.append(f"{where}.{key}: {error_text(e)} (got {e.get('input')!r})")
    return f"invalid {where} config:\n  " + "\n  ".join(lines)
