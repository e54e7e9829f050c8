"""The results schema: CSV round trip, atomic writes, loading, summarize, and its documentation."""

import math
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from harness import results
from harness.config import TrainConfig, config_columns
from harness.results import SCHEMA, load_results, summarize, write_csv_atomic, write_point

README = Path(__file__).resolve().parents[2] / "results" / "README.md"


def _rows(n_ranks=2, n_iters=3, **extra):
    cfg = config_columns(TrainConfig(comm_hook="", fault=""))
    rows = []
    for rank in range(n_ranks):
        for it in range(n_iters):
            rows.append(
                {
                    **cfg,
                    "rank": rank,
                    "iteration": it,
                    "synced": it % 2 == 0,
                    "forward_ms": 0.1 + rank + it / 3,
                    "total_ms": 1 / 3 + it,
                    "backward_comm_exposed_ms": math.nan if it == 1 else 0.0,
                    "bucket_times_json": '{"launch_ms":[0.5,1.25],"finish_ms":[2.0,3.5]}',
                    "hostname": "NA",
                    "num_params": 12345678901,
                    "error": "",
                    **extra,
                }
            )
    return rows


def test_schema_round_trip(tmp_path):
    rows = _rows()
    path = write_point("exp", "abc123", rows, root=tmp_path)
    assert path == tmp_path / "exp" / "points" / "abc123.csv"
    back = load_results("exp", root=tmp_path)
    expected = results.to_frame([{**r, "experiment": "exp", "point_id": "abc123"} for r in rows])
    pd.testing.assert_frame_equal(back, expected)
    assert back["forward_ms"].iloc[4] == rows[4]["forward_ms"]  # floats survive exactly
    assert back["hostname"].iloc[0] == "NA" and back["comm_hook"].iloc[0] == ""  # strings are not NaN
    assert str(back["synced"].dtype) == "boolean" and str(back["rank"].dtype) == "Int64"
    assert list(back.columns) == [c for c in SCHEMA if c in back.columns]


def test_unknown_columns_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="not_a_column"):
        write_point("exp", "p", [{"rank": 0, "not_a_column": 1}], root=tmp_path)


def test_write_is_atomic(tmp_path, monkeypatch):
    write_point("exp", "p1", _rows(n_iters=1), root=tmp_path)
    before = (tmp_path / "exp" / "points" / "p1.csv").read_bytes()

    def crash(src, dst):
        raise OSError("killed mid-write")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        write_point("exp", "p1", _rows(n_iters=5), root=tmp_path)
    monkeypatch.undo()
    assert (tmp_path / "exp" / "points" / "p1.csv").read_bytes() == before
    assert os.listdir(tmp_path / "exp" / "points") == ["p1.csv"]  # no temp file left behind
    (tmp_path / "exp" / "points" / ".tmp-half.csv").write_text("experiment,point_id\nexp,ha")
    assert results.stored_point_ids("exp", root=tmp_path) == {"p1"}  # stray temp files are not points
    assert len(load_results("exp", root=tmp_path)) == 2


def test_write_csv_atomic_makes_folders_and_shareable_files(tmp_path, monkeypatch):
    path = tmp_path / "bench" / "summary.csv"
    write_csv_atomic(pd.DataFrame({"ratio": [1.0, 1.25]}), path)
    assert pd.read_csv(path)["ratio"].tolist() == [1.0, 1.25] and path.stat().st_mode & 0o777 == 0o644

    def crash(src, dst):
        raise OSError("killed mid-write")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        write_csv_atomic(pd.DataFrame({"ratio": [9.0]}), path)
    assert pd.read_csv(path)["ratio"].tolist() == [1.0, 1.25] and os.listdir(path.parent) == ["summary.csv"]


def test_load_of_missing_experiment_is_empty(tmp_path):
    df = load_results("nothing", root=tmp_path)
    assert len(df) == 0 and "error" in df.columns


def test_summarize_percentiles_over_ranks_and_iterations():
    df = pd.DataFrame(
        {
            "impl": ["ours"] * 11 + ["torch"] * 3,
            "total_ms": [float(v) for v in range(11)] + [5.0, 7.0, 1000.0],
            "error": [""] * 13 + ["boom"],
        }
    )
    out = summarize(df, by=["impl"], metrics=["total_ms"]).set_index("impl")
    assert out.loc["ours", "total_ms_p50"] == 5.0
    assert out.loc["ours", "total_ms_p10"] == pytest.approx(1.0)
    assert out.loc["ours", "total_ms_p90"] == pytest.approx(9.0)
    assert out.loc["torch", "n"] == 2 and out.loc["torch", "total_ms_p50"] == 6.0  # error row dropped
    assert out.loc["ours", "total_ms_mean"] == 5.0


def test_failed_point_ids(tmp_path):
    write_point("exp", "good", _rows(n_iters=1), root=tmp_path)
    write_point("exp", "bad", [{**config_columns(TrainConfig()), "error": "Traceback ..."}], root=tmp_path)
    assert results.failed_point_ids("exp", root=tmp_path) == {"bad"}
    df = load_results("exp", root=tmp_path)
    assert df.loc[df["point_id"] == "bad", "rank"].isna().all()


def test_readme_defines_every_column():
    documented = set(re.findall(r"^\| `([a-z0-9_]+)`", README.read_text(), flags=re.M))
    assert set(SCHEMA) <= documented, sorted(set(SCHEMA) - documented)


def test_figures_go_to_the_results_folder_or_where_told_and_the_reference_redraw_stays_out_of_the_tree(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("DDP_REPRO_FIGURES", raising=False)
    monkeypatch.delenv("DDP_REPRO_RESULTS", raising=False)
    assert results.figures_dir(tmp_path) == tmp_path / "figures"
    assert results.figures_dir() == results.REPO_ROOT / "results" / "figures"
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(results.REPO_ROOT / "results" / "reference"))
    redraw = results.figures_dir()  # the committed figures under results/reference/figures/ are never written
    assert redraw == results.REPO_ROOT / "results" / "figures" / "reference"
    assert not (results.REFERENCE / "figures" / "x.png").resolve().is_relative_to(redraw.resolve())
    ignored = subprocess.run(["git", "-C", str(results.REPO_ROOT), "check-ignore", "-q", str(redraw / "fig7.png")])
    assert ignored.returncode == 0  # git ignores it: a redraw leaves the tree clean
    monkeypatch.setenv("DDP_REPRO_FIGURES", str(tmp_path / "elsewhere"))
    assert results.figures_dir() == results.figures_dir(tmp_path) == tmp_path / "elsewhere"
