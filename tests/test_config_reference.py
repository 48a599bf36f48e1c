"""docs/config.md, the config reference generated from the config dataclasses."""

import dataclasses

import pytest

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.tools import config_reference
from easyrl.tools.config_reference import DOC_PATH, field_docs, generate, main


def test_docs_config_md_is_current():
    assert DOC_PATH.exists(), "run: python -m easyrl.tools.config_reference --write"
    assert DOC_PATH.read_text() == generate(), (
        "docs/config.md is stale; run: python -m easyrl.tools.config_reference --write"
    )


def test_every_key_and_algorithm_is_documented():
    text = generate()
    for section in (config_lib.ReplayConfig, config_lib.AtariConfig, config_lib.StopConfig):
        for f in dataclasses.fields(section):
            assert f"| `{section.SECTION}.{f.name}` |" in text, f.name
    assert "| `replay.capacity` | `int` | `100000` | Items kept per memory shard" in text
    assert "| `env.atari` | section `env.atari` or null | `null` |" in text
    assert "| `algorithm.name` | `str` | required |" in text
    for name in registry.known():
        assert f"\n### {name}\n" in text, name
    ppo = text[text.index("\n### ppo\n") :]
    assert "| `algorithm.clip` | `float` | `0.2` | Surrogate clip" in ppo


def test_check_fails_on_a_stale_file_and_write_fixes_it(tmp_path, capsys):
    path = tmp_path / "config.md"
    assert main(["--check", "--path", str(path)]) == 1  # missing
    path.write_text(generate().replace("Discount factor.", "Discount."))
    assert main(["--check", "--path", str(path)]) == 1
    assert "is stale" in capsys.readouterr().err
    assert main(["--write", "--path", str(path)]) == 0
    assert main(["--check", "--path", str(path)]) == 0
    assert path.read_text() == generate()


@dataclasses.dataclass(frozen=True)
class _Inherited:
    kept: int = 1
    """From the base."""
    replaced: int = 2
    """Base text."""


@dataclasses.dataclass(frozen=True)
class _Documented(_Inherited):
    replaced: int = 3
    """Subclass text: | a pipe,
    over two lines."""


@dataclasses.dataclass(frozen=True)
class _Undocumented:
    fine: int = 1
    """Has one."""
    bare: int = 2


def test_field_docs_read_the_docstrings_under_the_fields():
    assert field_docs(_Documented) == {
        "kept": "From the base.",
        "replaced": "Subclass text: | a pipe, over two lines.",
    }
    rows = config_reference._table(_Documented, "x")
    assert rows[-1] == "| `x.replaced` | `int` | `3` | Subclass text: \\| a pipe, over two lines. |"
    with pytest.raises(ValueError, match="_Undocumented: fields without a docstring: bare"):
        field_docs(_Undocumented)
