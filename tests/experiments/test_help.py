"""Help that explains: every option of every command says what it is beside its default (a Config field's comment,
read from its source), ``predict`` lists only what a prediction reads, and every file the code cites is in the
repository. In this process: each command's parser is caught as ``--help`` prints it."""

import argparse
import contextlib
import dataclasses
import io
import re
from pathlib import Path

import pytest

from experiments import registry
from experiments.__main__ import TOOLS, main
from experiments.tools import predict as predict_cli
from harness import __main__ as harness_cli
from harness.cli import OneLineParser, field_comments
from harness.config import POINT_TYPES

REPO = Path(__file__).resolve().parents[2]
COMMANDS = {  # what a user types after `python -m`: how this process runs it
    **{f"experiments {name}": (main, [name]) for name in registry.drivers()},
    **{f"experiments {name}": (main, [name]) for name in ("plots", "report", "claims", *TOOLS)},
    **{f"harness {kind}": (harness_cli.main, [kind]) for kind in harness_cli.KINDS},
}
DEFAULT = re.compile(r"\(default: [^)]*\)|\(required\)")


def parser_of(command: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser ``command --help`` prints (its text formatted too, so that a bad help string fails here)."""
    run, argv = COMMANDS[command]
    printed, print_help = [], OneLineParser.print_help

    def caught(self, file=None):
        printed.append(self)
        print_help(self, io.StringIO())

    monkeypatch.setattr(OneLineParser, "print_help", caught)
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as done:
        run([*argv, "--help"])
    assert done.value.code == 0 and printed, command
    return printed[-1]


def listed(parser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_says_what_it_is_beside_its_default(command, monkeypatch):
    for action in listed(parser_of(command, monkeypatch)):
        name = "/".join(action.option_strings) or action.dest
        about = DEFAULT.sub("", action.help or "")
        assert re.search(r"[a-zA-Z]", about), f"python -m {command} {name}: no description, only {action.help!r}"
        if action.option_strings and action.nargs != 0:  # an option taking a value names what it is without one
            assert "default" in action.help, f"python -m {command} {name}: no default in {action.help!r}"


def test_every_point_field_is_described():
    for cls in POINT_TYPES:
        missing = [f.name for f in dataclasses.fields(cls) if not field_comments(cls).get(f.name)]
        assert not missing, f"{cls.__name__}: no comment on {missing}"


def test_predict_lists_only_what_a_prediction_reads_and_refuses_the_rest(monkeypatch, capsys):
    options = {a.dest for a in listed(parser_of("experiments predict", monkeypatch))}
    assert options == {*predict_cli.PREDICTED, "calibration", "probe", "cluster", "json"}
    monkeypatch.undo()
    assert main(["predict", "--cluster=paper-v100", "--iters=5"]) == 2
    assert "iters=5: predict does not model it" in capsys.readouterr().err


# a file a command writes, named in its code as what it writes, not as a source
WRITTEN = {"summary.md"}
CITED = re.compile(r"[\w./{},-]*\.md\b")
OTHER_REPOSITORY = re.compile(r"[\w.-]+/[\w.-]+,?$")  # "owner/repo path/README.md": a file of another repository


def cited(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every Markdown file ``path`` names, less those of other repositories and those it writes."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for m in CITED.finditer(line):
            name = m.group().lstrip("/")
            if name not in WRITTEN and not OTHER_REPOSITORY.search(line[: m.start()].rstrip()):
                out.append((number, name))
    return out


def test_every_markdown_file_the_code_cites_is_in_the_repository():
    sources = [
        p
        for d in ("experiments", "simulator", "harness")
        for ext in ("py", "json")
        for p in sorted((REPO / d).rglob(f"*.{ext}"))
    ]
    assert any(name == "BENCHMARKS.md" for p in sources for _, name in cited(p))  # the scan finds citations
    missing = [
        f"{p.relative_to(REPO)}:{line}: {name}"
        for p in sources
        for line, name in cited(p)
        if not any((base / name).resolve().is_relative_to(REPO) and (base / name).exists() for base in (REPO, p.parent))
    ]
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)
