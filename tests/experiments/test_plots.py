"""``python -m experiments plots`` redraws every figure whose results are stored (the drivers', their variants
stored beside them, the tools' and claims), skips the rest with a note, writes where it is told, and writes the same
bytes for the same results; each figure reads ``results/`` where it holds that figure's results and the reference
run where not."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments import registry
from experiments.__main__ import main
from harness import results

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A results folder holding a slice of the reference run: fig7 on 1 and 2 emulated hosts (ResNet50, three
    caps), the tuning run, and simval's table (without its points)."""
    root = tmp_path_factory.mktemp("results")
    (root / "fig7_hosts" / "points").mkdir(parents=True)
    for path in sorted((REFERENCE / "fig7_hosts" / "points").glob("*.csv")):
        head = pd.read_csv(path, nrows=1)
        if head["model"].iloc[0] == "resnet50" and head["bucket_cap_mb"].iloc[0] in (0, 5, 1000):
            shutil.copy(path, root / "fig7_hosts" / "points")
    shutil.copytree(REFERENCE / "tune", root / "tune")
    (root / "simval").mkdir()
    shutil.copy(REFERENCE / "simval" / "validation.csv", root / "simval")
    return root


def test_plots_redraws_every_stored_figure_and_says_which_it_skips(stored, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(stored))
    monkeypatch.delenv("DDP_REPRO_FIGURES", raising=False)
    out = tmp_path / "figs"
    assert main(["plots", f"--figures_dir={out}"]) == 0
    printed = capsys.readouterr().out
    drawn = {"fig7-hosts1", "fig7-hosts2", "tune", "simval"}
    assert {p.name for p in out.iterdir()} == {f"{n}.{ext}" for n in drawn for ext in ("png", "pdf")}
    assert not (stored / "figures").exists()  # --figures_dir, not the results folder
    assert "[fig2] no stored results yet; run `make fig2` first" in printed
    last = printed.strip().splitlines()[-1]
    assert last.startswith(f"[plots] redrew 4 figure(s) into {out}; nothing stored for fig2, ")
    assert "timeline, claims (skipped)" in last and "fig7-hosts" not in last
    cfg = registry.variants(registry.drivers()["fig7"], stored)["fig7-hosts2"].args[1](
        results.load_results("fig7_hosts", stored)
    )
    assert (cfg.hosts, cfg.world_size, cfg.models, cfg.bucket_caps_mb) == (2, 4, ("resnet50",), (0, 5, 1000))


def test_a_redraw_of_unchanged_results_writes_the_same_bytes(stored, tmp_path, monkeypatch):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(stored))
    monkeypatch.setenv("DDP_REPRO_FIGURES", str(tmp_path))  # as the environment variable says
    assert main(["plots", "tune"]) == 0
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(first) == {"tune.png", "tune.pdf"} and b"CreationDate" not in first["tune.pdf"]
    assert main(["plots", "tune"]) == 0
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == first


def test_plots_refuses_a_figure_it_does_not_know(stored, monkeypatch, capsys):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(stored))
    assert main(["plots", "fig7-host2"]) == 2
    err = capsys.readouterr().err
    assert "unknown figure 'fig7-host2'" in err and "did you mean fig7-hosts2?" in err, err


def test_each_figure_reads_your_results_where_you_have_some_and_the_reference_where_not(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DDP_REPRO_RESULTS", raising=False)
    monkeypatch.setattr(results, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(registry, "REPO_ROOT", tmp_path)
    reference = tmp_path / "results" / "reference"
    monkeypatch.setattr(registry, "REFERENCE", reference)
    for figure in ("fig7", "fig8"):
        (reference / figure / "points").mkdir(parents=True)
        (reference / figure / "points" / "a.csv").write_text("")
    assert registry.root_for("fig7") == registry.root_for("fig8") == reference  # a fresh clone
    said = capsys.readouterr().out
    assert "[fig7] reading results/reference (the committed reference run" in said, said
    (tmp_path / "results" / "fig7" / "points").mkdir(parents=True)
    (tmp_path / "results" / "fig7" / "points" / "b.csv").write_text("")
    assert registry.root_for("fig7") == tmp_path / "results"  # your own run of fig7
    assert registry.root_for("fig8") == reference  # and still the reference where you have none
    assert capsys.readouterr().out.splitlines()[0] == "[fig7] reading results"
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(tmp_path / "elsewhere"))
    assert registry.root_for("fig8") == tmp_path / "elsewhere"  # as told
    notebook = (Path(__file__).resolve().parents[2] / "notebooks" / "figures.ipynb").read_text()
    assert "root_for(" in notebook and "stored_or_reference" not in notebook
