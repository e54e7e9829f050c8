"""Every command the Markdown files name exists: each ``python -m MODULE [SUBCOMMAND]`` (also under torchrun)
answers ``--help`` with its options and exit status 0, and each ``make TARGET`` is a target of the Makefile. Commands
are read from code only (fenced blocks and `inline spans`), so prose such as "make a tie look like a miss" is not
one."""

import contextlib
import io
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".git", "shared", ".pytest_cache", ".hypothesis", "node_modules", "build"}


def markdown_files() -> list[Path]:
    """The repository's *.md files, tracked or not (outside .venv, shared/ and what git ignores)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "--", "*.md"],
            cwd=REPO,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.split()
        paths = [REPO / p for p in listed]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        paths = list(REPO.rglob("*.md"))
    return sorted(p for p in paths if p.exists() and not SKIP_DIRS & set(p.relative_to(REPO).parts))


def code_of(text: str) -> list[str]:
    """Each command-like piece of code: every line of a fenced block (backslash continuations joined, comments
    dropped) and every inline span (which may wrap over lines)."""
    pieces = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            pieces.append(re.sub(r"(^|\s)#.*", "", line))
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    pieces += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    return pieces


MODULE = re.compile(r"(?:python[\d.]*|torchrun\b.*?)\s+-m\s+([A-Za-z_][\w.]*)(?:[ \t]+([a-z][\w-]*)(?=\s|$))?")
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+(?:[A-Z_]+=\S*\s+)*([a-z][\w-]*)")


def documented() -> tuple[dict, dict]:
    """(module command -> where named, make target -> where named)."""
    modules: dict[tuple, list[str]] = {}
    targets: dict[str, list[str]] = {}
    for path in markdown_files():
        where = str(path.relative_to(REPO))
        for piece in code_of(path.read_text()):
            for module, sub in MODULE.findall(piece):
                modules.setdefault((module, *([sub] if sub else [])), []).append(where)
            for target in MAKE.findall(piece):
                targets.setdefault(target, []).append(where)
    return modules, targets


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    variables = dict(re.findall(r"^([A-Z_]+)\s*[:?]?=\s*(.*)$", text, flags=re.M))
    expand = lambda s: re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), s)  # noqa: E731
    targets = set()
    for names in re.findall(r"^([^\s#=:][^=:\n]*?)\s*:(?!=)", text, flags=re.M):
        targets |= set(expand(names).split())
    return targets


MODULES, TARGETS = documented()


def test_the_documents_name_commands():  # the scan itself finds what it should
    assert {("experiments", "fig7"), ("experiments", "bench"), ("harness", "train")} <= set(MODULES)
    assert {"fig7", "plots", "test", "bench"} <= set(TARGETS) and "a" not in TARGETS


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_documented_make_target_exists(target):
    assert target in makefile_targets(), (
        f"`make {target}` (named in {', '.join(sorted(set(TARGETS[target])))}) is not a target of the Makefile"
    )


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # a package imports its submodule
@pytest.mark.parametrize("cmd", sorted(MODULES), ids=" ".join)
def test_every_documented_module_answers_help(cmd, monkeypatch, tmp_path):
    """As ``python -m <cmd> --help`` runs it (``runpy``, in this process: a subprocess each would mostly re-import
    torch), with no GPU and storing nothing here."""
    named = f"`python -m {' '.join(cmd)}` (named in {', '.join(sorted(set(MODULES[cmd])))})"
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(sys, "argv", [cmd[0], *cmd[1:], "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        runpy.run_module(cmd[0], run_name="__main__", alter_sys=True)
    assert done.value.code in (0, None) and out.getvalue().strip(), f"{named} --help: exit {done.value.code}"


def test_the_readme_python_example_runs_as_written(tmp_path):
    """README's one-line DDP example, saved and run the way its first line says (torchrun, 2 ranks)."""
    block = re.search(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.S | re.M).group(1)
    (tmp_path / "example.py").write_text(block)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r"\d+\.\d+ ms of allreduce\n", done.stdout), done.stdout  # rank 0's line, whole
