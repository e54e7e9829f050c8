"""The documents cannot drift from the committed results (``make report``) and carry answers, not history."""

import re
import subprocess

import pytest

from experiments.tools import report as documents
from harness.results import REPO_ROOT

HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
DATED_SECTION = "## Where the reference run ran"  # REPRODUCTION.md's one section that may say when


def _shallow() -> bool:
    done = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() != "false"


@pytest.mark.skipif(_shallow(), reason="a shallow clone cannot tell which code measured a stored result")
def test_committed_documents_hold_what_the_committed_results_give():
    assert documents.update(check=True) == [], "run `make report` and commit the documents"


def test_a_region_is_regenerated_whole_and_an_unknown_one_refused():
    text = "before\n<!-- make report: run-times -->\nan old number: 1 s\n<!-- end: run-times -->\nafter\n"
    out = documents.render(text)
    assert "old number" not in out and "`make test` from a fresh clone" in out
    assert out.startswith("before\n<!-- make report: run-times -->\n") and out.endswith(
        "<!-- end: run-times -->\nafter\n"
    )
    assert documents.render(out) == out
    with pytest.raises(ValueError, match="unknown region 'nope'"):
        documents.render("<!-- make report: nope -->\n<!-- end: nope -->\n")


def _undated(name: str) -> str:
    text = (REPO_ROOT / name).read_text()
    if DATED_SECTION in text:
        start = text.index(DATED_SECTION)
        end = text.find("\n## ", start + len(DATED_SECTION))
        text = text[:start] + (text[end:] if end >= 0 else "")
    return text


@pytest.mark.parametrize(
    "name", [*documents.DOCUMENTS, "results/README.md", "harness/README.md", "simulator/README.md"]
)
def test_documents_name_no_commit_and_no_date_outside_where_the_reference_ran(name):
    text = _undated(name)
    assert HASH.findall(text) == [] and DATE.findall(text) == []


def test_benchmarks_answers_in_at_most_250_lines():
    assert len((REPO_ROOT / "BENCHMARKS.md").read_text().splitlines()) <= 250


def test_reproduction_shows_every_reference_figure_and_readme_shows_fig7():
    reproduction = (REPO_ROOT / "REPRODUCTION.md").read_text()
    figures = {p.name for p in (REPO_ROOT / "results/reference/figures").glob("fig*.png")}
    shown = set(re.findall(r"!\[[^]]*\]\(results/reference/figures/([^)]+\.png)\)", reproduction))
    assert figures - shown == set()
    assert "](results/reference/figures/fig7.png)" in (REPO_ROOT / "README.md").read_text()
