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


@pytest.mark.parametrize(("module", "argv"), [
    ("stare_verl.jobs.sft", ["data"]),
    ("stare_verl.jobs.sft", ["train"]),
    ("stare_verl.jobs.demo.sft", []),
    ("stare_verl.jobs.demo.evaluate", ["ckpt"]),
    ("stare_verl.jobs.compare", []),
    ("stare_verl.jobs.train", []),
])  # fmt: skip
def test_every_option_of_the_job_commands_has_help(module, argv, monkeypatch):
    """The parser a command parses with (caught at its parse): every argument has a help line."""
    import argparse
    import importlib

    parsers = []

    def caught(self, args=None, namespace=None):
        parsers.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", caught)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_intermixed_args", lambda self, a=None, n=None: caught(self))
    with pytest.raises(SystemExit):
        importlib.import_module(module).main(argv)
    sub = [p for parser in parsers for a in parser._actions if isinstance(a, argparse._SubParsersAction)
           for p in a.choices.values()]  # fmt: skip
    actions = [a for parser in parsers + sub for a in parser._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]  # fmt: skip
    assert actions and [a.dest for a in actions if not (a.help or "").strip()] == []
