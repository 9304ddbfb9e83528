"""``stare-verl --help`` lists every subcommand with its help line, the delegated ones (train, compare, sft) among
them, while ``stare-verl train --help`` is still train's own parser."""

import re

import pytest

from stare_verl.jobs import cli


def _help(capsys, argv):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


def test_main_help_lists_the_delegated_subcommands_with_their_help_line(capsys):
    out = _help(capsys, ["--help"])
    assert "{recipes,check,plot,methods,eval,train,compare,sft}" in out
    listed = dict(re.findall(r"^    (\w+)\s+(\S.*)$", out, flags=re.MULTILINE))
    assert set(listed) == {"recipes", "check", "plot", "methods", "eval", "train", "compare", "sft"}
    flat = " ".join(out.split())  # argparse wraps the help lines
    for name, (_, line) in cli.DELEGATED.items():
        assert line.startswith(listed[name]) and f"{name} {line}" in flat
    assert "also:" not in out


def test_delegated_help_is_the_modules_own(capsys):
    out = _help(capsys, ["train", "--help"])
    assert out.startswith("usage: stare-verl train") and "--dry-run" in out and "--n-gpus" in out
    assert "--logger" in out and "--gpu-recipe" in out
    out = _help(capsys, ["compare", "--help"])
    assert out.startswith("usage: stare-verl compare") and "--methods" in out
