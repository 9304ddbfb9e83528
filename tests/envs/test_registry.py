"""envs.registry.Registry: names and aliases, built-ins loaded on first use, clear errors for clashes and unknowns."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from envs.registry import Registry


@dataclass(frozen=True)
class Item:
    name: str
    aliases: tuple[str, ...] = ()


def test_lookup_by_name_or_alias_and_builtins_loaded_once():
    calls = []

    def builtins():
        calls.append(1)
        return (Item("tooluse", ("tool_use",)), Item("shortcot", ("short_cot",)))

    reg = Registry("family", builtins)
    assert calls == []  # nothing is loaded before the first use
    assert reg.get("tool_use") is reg.get("tooluse") and reg.get("short_cot").name == "shortcot"
    assert reg.names() == ("tooluse", "shortcot") and reg.spellings() == ("tooluse", "shortcot", "tool_use", "short_cot")
    assert "short_cot" in reg and "cot" not in reg and reg.find(None) is None and reg.find(3) is None
    assert [i.name for i in reg] == ["tooluse", "shortcot"] and calls == [1]
    with pytest.raises(ValueError, match=r"unknown family 'cot'; expected one of \['tooluse', 'shortcot'\]"):
        reg.get("cot")


def test_register_refuses_clashes_and_unregister_drops_aliases():
    reg = Registry("family")
    toy = reg.register(Item("toy", ("old_toy",)))
    assert reg.register(Item("toy", ("old_toy",))) == toy  # the same entry again: kept
    with pytest.raises(ValueError, match="'toy' is already registered"):
        reg.register(Item("toy", ("other",)))
    with pytest.raises(ValueError, match="'old_toy' already names 'toy'"):
        reg.register(Item("old_toy"))
    with pytest.raises(ValueError, match="'toy' already names 'toy'"):
        reg.register(Item("new", ("toy",)))
    assert reg.register(Item("toy", ("other",)), replace=True).aliases == ("other",)
    assert reg.find("old_toy") is None and reg.get("other").name == "toy"
    reg.unregister("other")  # by alias
    assert reg.names() == () and reg.find("toy") is None
    with pytest.raises(ValueError, match="non-empty str name"):
        reg.register(Item(""))
