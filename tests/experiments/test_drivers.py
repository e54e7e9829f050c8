"""Every figure driver end to end in a tiny configuration (small model, 2 ranks, 2 iterations)."""

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from experiments import plotting, verdicts
from experiments.__main__ import main
from experiments.figures import fig07_bucket_size as fig7
from experiments.registry import drivers, stored_config
from experiments.tools import tune
from harness import load_results, point_id
from tests.experiments.test_verdicts import fig7_case

TINY = {  # fig7 as make fig7 runs it (behind the emulated link, net=auto); the others over loopback
    "fig2": ["--params_per_call=50000,200000", "--total_params=200000", "--compute_model=small", "--net=loopback"],
    "fig6": ["--models=small", "--net=loopback", "--bucket_cap_mb=auto"],  # auto: the cap ours finds first
    "fig7": ["--models=small", "--bucket_caps_mb=0,25", "--repeats=2"],
    "fig8": ["--models=small", "--bucket_caps_mb=0,25,auto", "--world_size=3", "--net=loopback"],  # fig7's draw
    "fig9": ["--models=small", "--world_sizes=1,2", "--net=loopback"],
    "fig10": ["--models=small", "--world_sizes=2", "--sync_every=1,2", "--iters=2", "--net=loopback"],
    "fig11": ["--batch_sizes=16", "--sync_every=2", "--iters=8", "--eval_every=4", "--smooth=2", "--seeds=0,1"],
    "fig12": ["--models=small", "--groups=1,3", "--net=loopback", "--bucket_cap_mb=auto"],
    "zero": ["--models=small", "--world_sizes=2", "--systems=torch,fsdp", "--net=loopback"],
}
RANKS_OPTIONS = {"fig7", "fig8", "fig10", "fig12", "zero"}  # and tune (test_tune_draws_...)
REPO = Path(__file__).resolve().parents[2]
COMMON = ["--iters=2", "--warmup=1", "--profile=cpu", "--repeats=1"]


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("results")


def test_every_paper_figure_has_a_driver():
    assert {"fig2", "fig6", "fig7", "fig8", "fig9", "fig10", "fig11", "fig12"} <= set(drivers())


@pytest.mark.parametrize("name", TINY)
def test_driver_end_to_end(name, results_dir, monkeypatch):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(results_dir))
    fields = {f"--{f.name}" for f in dataclasses.fields(drivers()[name].Config)}  # fig11 has no warmup/profile
    argv = [
        name,
        *TINY[name],
        *[a for a in COMMON if a.split("=")[0] in fields and a.split("=")[0] not in " ".join(TINY[name])],
    ]
    assert main(argv) == 0
    df = load_results(name, results_dir)
    assert not df.empty and (df["error"].fillna("") == "").all(), df["error"].dropna().tolist()
    driver = drivers()[name]
    assert set(df["point_id"]) == {point_id(p) for p in driver.points(stored_config(driver, results_dir))}
    assert df.groupby("point_id").size().min() >= 2  # every rank's measured iterations are stored
    png = results_dir / "figures" / f"{name}.png"
    assert (results_dir / "figures" / f"{name}.pdf").stat().st_size > 0
    with Image.open(png) as im:
        assert im.size[0] > 400 and len(im.convert("L").getcolors(maxcolors=1 << 16) or []) > 20  # drawn, not blank
    if name in RANKS_OPTIONS:  # beside the latencies, the paired statistic its verdicts read
        fig = driver.plot(df, stored_config(driver, results_dir))
        assert any(plotting.drawn_paired(ax) for ax in fig.axes), name
        plt.close(fig)


def test_repetitions_run_in_seeded_interleaved_passes(results_dir):
    df = load_results("fig7", results_dir)
    first = df.drop_duplicates("point_id").sort_values("run_position")
    assert list(first["repeat"]) == [0, 0, 1, 1]  # one pass per repetition
    assert set(first["order_seed"]) == {0} and list(first["run_position"]) == [0, 1, 2, 3]
    caps = [list(first.loc[first["repeat"] == r, "bucket_cap_mb"]) for r in (0, 1)]
    assert sorted(caps[0]) == sorted(caps[1]) == [0, 25]
    summary = drivers()["fig7"].summarize(df, stored_config(drivers()["fig7"], results_dir))
    assert "[" in summary and "tied with it (within 5%)" in summary  # an interval from 2 repetitions
    assert first["group"].nunique() == 2  # each repetition's two caps were measured together


def test_stored_nccl_rows_keep_their_panels_on_a_machine_without_gpus(results_dir):
    driver = drivers()["fig7"]
    df = load_results("fig7", results_dir)
    cfg = stored_config(driver, results_dir)
    as_nccl = df.assign(backend="nccl", point_id=df["point_id"] + "-nccl")  # as if measured on a GPU cluster
    fig = driver.plot(pd.concat([df, as_nccl], ignore_index=True), cfg)
    titles = {ax.get_title().split(" (")[0] for ax in fig.axes}
    assert {"small / gloo", "small / nccl"} <= titles
    assert "NCCL unavailable" not in " ".join(t.get_text() for t in fig.texts)
    fig = driver.plot(df, cfg)  # no NCCL rows and no GPU: no panel, one caption line says why
    assert "NCCL unavailable" in " ".join(t.get_text() for t in fig.texts)
    assert not any("nccl" in ax.get_title() for ax in fig.axes)


def test_plots_redraws_from_stored_csvs_without_running(results_dir, monkeypatch):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(results_dir))
    assert main(["fig7", *TINY["fig7"], *COMMON]) == 0  # stored already when the tests above ran
    png = results_dir / "figures" / "fig7.png"
    png.unlink()
    monkeypatch.setattr("harness.sweep._measure", lambda *a, **k: pytest.fail("plots must not run points"))
    assert main(["plots", "fig7"]) == 0
    assert png.exists()


def test_notebook_executes_against_stored_results(results_dir, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("DDP_REPRO_RESULTS", str(results_dir))
    assert main(["fig7", *TINY["fig7"], *COMMON]) == 0  # the fixture results (already stored if run above)
    nb = nbformat.read(REPO / "notebooks" / "figures.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "drawn: [" in printed and "'fig7'" in printed
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 1


def test_claims_chart_gathers_every_driver(results_dir, monkeypatch, capsys):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(results_dir))
    assert main(["claims"]) == 0
    out = capsys.readouterr().out
    for figure in ("fig6", "fig7", "fig8", "fig10", "fig12"):  # the drivers with numbers, run above
        assert figure in out
    assert (results_dir / "figures" / "claims.png").stat().st_size > 0


def test_fig10_measures_after_the_first_synchronized_iteration_and_the_rebuild_at_every_n():
    fig10 = drivers()["fig10"]
    cfg = fig10.Config(models=("small",), world_sizes=(2,), sync_every=(1, 2, 8), repeats=1, backends=("gloo",))
    assert {p.sync_every: p.warmup for p in fig10.points(cfg)} == {1: 2, 2: 4, 8: 16}
    # rows stored when warmup was not yet counted in cycles (n = 8 measured from iteration 2) are left out
    rows = pd.DataFrame(
        dict(
            model="small",
            sync_every=[1, 8, 8],
            warmup=[2, 2, 16],
            bucket_cap_mb=25.0,
            error="",
            synced=True,
            net=cfg.net,
            hosts=1,
            impl="ours",
            total_ms=[1.0, 2.0, 3.0],
        )
    )
    assert list(fig10._selected(rows, cfg)["total_ms"]) == [1.0, 3.0]


def _paired_panels(fig) -> dict:
    """The title of each panel over a paired panel -> (what that panel drew, its x tick labels)."""
    out = {}
    for lower in fig.axes:
        drawn = plotting.drawn_paired(lower)
        if drawn:
            [upper] = [
                ax
                for ax in fig.axes
                if ax is not lower and ax.get_title() and lower.get_shared_x_axes().joined(lower, ax)
            ]
            out[upper.get_title()] = drawn, [t.get_text() for t in lower.get_xticklabels()]
    return out


def _agrees(drawn: dict, ranking: verdicts.Ranking, labels: list, options: list) -> dict:
    """Checks that a paired panel draws ``ranking``'s own numbers and that the option marked best has no option drawn
    below it; returns option -> its mark."""
    for option in options:
        assert np.allclose(drawn[str(option)], ranking.ratios[option][:3]), option  # center, lo, hi: the verdict's
    marks = dict(zip(options, (label.split("\n")[1] for label in labels)))
    assert marks == plotting.verdict_marks(ranking)
    if "best" in marks.values():
        assert all(center >= 1 for center, _, _ in drawn.values()), "an option drawn faster than the one called best"
    return marks


def test_fig7_calls_a_cap_best_only_where_the_paired_ratios_it_draws_agree():
    """The fresh run whose figure called BERT-base's 1 MiB best beside visibly lower boxes of 5, 25 and 100 MiB: under
    each cap the figure now draws what the verdict rests on, every cap's paired ratio to the reference with its
    interval, and marks a cap best only where no cap is drawn below it (here none: 0 MiB beats 1 MiB)."""
    df, cfg = fig7_case(), fig7.Config(cluster="")
    fig = fig7.plot(df, cfg)
    panels = _paired_panels(fig)
    plt.close(fig)
    per_task = fig7.task_medians(df, cfg)
    marks = {}
    for model in cfg.models:
        [(drawn, labels)] = [v for title, v in panels.items() if title.startswith(f"{model} / gloo")]
        caps = sorted(per_task.xs(model).index.unique(level="bucket_cap_mb"))
        marks[model] = _agrees(drawn, verdicts.rank_options(per_task.xs((model, "gloo"))), labels, caps)
    assert marks["bert-base"][1] == "ref" and "best" not in marks["bert-base"].values()
    assert marks["resnet50"] == {0: "worse", 1: "tied", 5: "tied", 25: "best", 100: "worse", 1000: "worse"}
    summary = fig7.summarize(df, cfg)
    assert "bert-base/gloo: best cap not resolved (0 MiB faster than 1 MiB" in summary
    assert "resnet50/gloo: best cap 25 MiB" in summary


def test_tune_draws_the_paired_ratios_its_report_reads(tmp_path, monkeypatch):
    case = fig7_case()
    per_task = verdicts.task_medians(case[case["model"] == "resnet50"], ["bucket_cap_mb"])
    grid = (0.0, 1.0, 5.0, 25.0, 100.0, 1000.0)
    out = dict(
        recommended_mb=5.0,
        predicted={c: 100.0 + c / 10 for c in grid},
        measured=per_task,
        band={c: (90.0, 110.0 + c / 10) for c in grid},
        regret={c: 1.0 for c in grid},
    )
    figures = []
    monkeypatch.setattr(plotting, "save", lambda fig, name, root=None: figures.append(fig) or tmp_path / "tune.png")
    tune.plot(out, tune.Config(), tmp_path)
    [lower] = [ax for ax in figures[0].axes if plotting.drawn_paired(ax)]
    ranking = verdicts.rank_options(per_task)
    marks = _agrees(plotting.drawn_paired(lower), ranking, [t.get_text() for t in lower.get_xticklabels()], list(grid))
    assert marks[25] == "best" and marks[5] == "tied"
    assert (
        f"measured recommended 5 MiB: {verdicts.spread(verdicts.per_repeat(per_task).xs(5)).fmt()}, "
        f"{ranking.ratios[5].fmt('x', 3)} of the best measured (25 MiB)" in tune.report(out)
    )
    plt.close(figures[0])


def test_fig2_calls_larger_than_every_parameter_are_one_call_of_all_once():
    from experiments.figures import fig02_allreduce_granularity as fig2

    calls = [
        p.params_per_call
        for p in fig2.points(fig2.Config(total_params=1_000_000, repeats=1, backends=("gloo",)))
        if type(p).__name__ == "AllreduceConfig"
    ]
    assert sorted(calls) == [10_000, 100_000, 1_000_000]  # 10M and 25.6M: the one call of all, not twice more
