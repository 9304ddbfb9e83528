"""The README's methods table is the one the registry generates (``stare-verl methods --markdown``)."""

from __future__ import annotations

import pytest

from stare_verl.jobs import methods_table
from stare_verl.jobs.cli import main
from stare_verl.methods import METHODS
from tests.support import REPO

README = REPO / "README.md"


def test_readme_methods_table_is_the_generated_one():
    """Fails when a method, a docstring's first line, a summary or a default changed without the README:
    run ``stare-verl methods --markdown --write README.md``."""
    assert methods_table.table_in(README.read_text(encoding="utf-8")) == methods_table.methods_markdown()


def test_table_has_every_method_with_its_defaults():
    rows = methods_table.methods_markdown().splitlines()
    assert rows[0] == "| method | what it does | how | settings (defaults) |"
    assert [r.split("|")[1].strip() for r in rows[2:]] == [f"`{name}`" for name in METHODS]
    stare = next(r for r in rows if r.startswith("| `stare` |"))
    assert "`reweight_w=1.1`" in stare and "`target_entropy=0.3`" in stare and "`adaptive=false`" in stare
    assert "`variant=O1`" in stare and "`norm_adv_by_std_in_grpo=null`" in stare
    grpo = next(r for r in rows if r.startswith("| `grpo` |"))
    assert grpo.endswith("| none |")
    kl = next(r for r in rows if r.startswith("| `kl_cov` |"))
    assert "\\|log pi - log pi_old\\|" in kl and "``" not in kl  # pipes escaped, reST backticks converted


def test_write_replaces_only_the_table(tmp_path, capsys):
    f = tmp_path / "README.md"
    f.write_text(f"intro\n{methods_table.BEGIN}\n| stale |\n{methods_table.END}\noutro\n", encoding="utf-8")
    assert main(["methods", "--write", str(f)]) == 0
    text = f.read_text(encoding="utf-8")
    assert text.startswith(f"intro\n{methods_table.BEGIN}\n| method |")
    assert text.endswith(f"{methods_table.END}\noutro\n")
    assert methods_table.table_in(text) == methods_table.methods_markdown()
    assert methods_table.write_table(f) is False  # already current: untouched
    assert "table updated" in capsys.readouterr().out


def test_missing_markers_are_a_clear_error(tmp_path, capsys):
    f = tmp_path / "other.md"
    f.write_text("no table here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no generated methods table"):
        methods_table.table_in(f.read_text(encoding="utf-8"))
    assert main(["methods", "--write", str(f)]) == 2
    assert "no generated methods table" in capsys.readouterr().err
    assert main(["methods", "--write", str(tmp_path / "missing.md")]) == 2


def test_markdown_flag_prints_the_table(capsys):
    assert main(["methods", "--markdown"]) == 0
    assert capsys.readouterr().out == methods_table.methods_markdown()
    assert main(["methods"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("grpo: ")
