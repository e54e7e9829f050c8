"""Verdicts from interleaved tasks: ratios paired within a task, or through the anchor two tasks share."""
import numpy as np
import pandas as pd

from experiments import verdicts

TRUE = {0: 1.30, 5: 1.00, 25: 1.02, 1000: 1.20}  # latency relative to the best cap (5)


def _per_task(tasks_per_repeat, seed=0):
    """Median latency per (cap, repeat, task): the true ratio times a drift of the whole task (0.6x-1.6x)."""
    rng = np.random.default_rng(seed)
    rows = []
    for repeat, tasks in enumerate(tasks_per_repeat):
        for t, caps in enumerate(tasks):
            drift = rng.uniform(0.6, 1.6)
            rows += [dict(cap=c, repeat=repeat, task=f"r{repeat}t{t}", ms=500 * TRUE[c] * drift) for c in caps]
    return pd.DataFrame(rows).set_index(["cap", "repeat", "task"])["ms"]


def test_ratios_inside_a_task_and_through_the_anchor_cancel_the_drift_of_tasks():
    per_task = _per_task([[[25, 0, 5], [25, 1000]], [[25, 1000, 0], [25, 5]], [[25, 5, 1000, 0]]])
    assert np.allclose(verdicts.paired_ratios(per_task, 0, 5), 1.3)  # together, then via 25, then together
    assert np.allclose(verdicts.paired_ratios(per_task, 1000, 5), 1.2)
    ranking = verdicts.rank_options(per_task)
    assert ranking == (5, [5, 25], [], [0, 1000])  # 25 is 2% slower: tied; 1000 (20%) and 0 (30%) are worse


def test_an_option_whose_interval_straddles_the_margin_is_not_resolved():
    ratios = {5: [1.0, 1.0, 1.0], 25: [1.02, 1.04, 1.03], 1: [1.05, 1.14, 1.09], 0: [1.25, 1.3, 1.2]}
    per_task = pd.DataFrame([dict(cap=c, repeat=r, task=f"t{r}", ms=100 * x) for c, xs in ratios.items()
                             for r, x in enumerate(xs)]).set_index(["cap", "repeat", "task"])["ms"]
    ranking = verdicts.rank_options(per_task)
    assert (ranking.best, ranking.tied, ranking.unresolved, ranking.worse) == (5, [5, 25], [1], [0])
    assert ranking.not_worse == [1, 5, 25]


def test_without_tasks_the_ratio_is_of_repetition_medians_and_keeps_the_drift():
    per_task = _per_task([[[0], [5]], [[0], [5]], [[0], [5]]])
    paired = verdicts.paired_ratios(per_task, 0, 5)
    folded = verdicts.paired_ratios(verdicts.per_repeat(per_task), 0, 5)
    assert np.allclose(paired, folded) and not np.allclose(paired, 1.3)  # nothing measured together: drift stays


def test_an_anchor_measured_in_several_tasks_counts_once_per_repetition():
    per_task = _per_task([[[25, 0], [25, 5]], [[25, 0], [25, 5]]])
    per_repeat = verdicts.per_repeat(per_task)
    assert list(per_repeat.xs(25).index) == [0, 1]
    assert verdicts.spread(per_repeat.xs(25)).n == 2


def test_fig9_efficiency_and_ddp_over_no_ddp_are_taken_repetition_by_repetition():
    from experiments import fig09_scalability as fig9

    drift = {0: 1.0, 1: 1.5, 2: 0.8}  # a whole repetition runs slower or faster
    ms = {("ours", 1): 400, ("local", 1): 380, ("ours", 2): 500, ("local", 2): 400}
    rows = [dict(model="resnet50", backend="gloo", impl=impl, world_size=n, repeat=r, bucket_cap_mb=25,
                 point_id=f"{impl}{n}{r}", group="", error="", net="loopback", hosts=1, rank=0, total_ms=v * d)
            for (impl, n), v in ms.items() for r, d in drift.items()]
    cfg = fig9.Config(models=("resnet50",), world_sizes=(1, 2), net="loopback")
    per_n = fig9._scaling(pd.DataFrame(rows), cfg)["resnet50", "gloo"]
    latency, efficiency, local, over = per_n[2]
    assert latency.center == 500 and (latency.lo, latency.hi) == (400, 750)  # the drift shows in latency
    assert np.isclose(efficiency.center, 80) and np.isclose(efficiency.lo, 80) and np.isclose(efficiency.hi, 80)
    assert np.isclose(over.center, 1.25) and local.center == 400  # ... not in the ratios
    assert np.isclose(per_n[1][3].center, 400 / 380)
    [claim] = fig9.claims(pd.DataFrame(rows), cfg)
    assert claim.what == "weak-scaling efficiency 1 -> 2 ranks, resnet50/gloo" and np.isclose(claim.measured.center, 80)


def test_zero_memory_check_counts_and_names_the_points_outside_the_tolerance():
    from experiments.zero import memory_check
    t = pd.DataFrame(dict(impl=["torch", "fsdp", "deepspeed3"], world_size=[2, 2, 4],
                          categories_vs_measured_pct=[-0.5, 9.9, -12.3]))
    line = memory_check(t)
    assert "within 10% at 2 of 3 points" in line and "worst deepspeed3 N=4 -12.3%" in line
    assert line.endswith("outside: deepspeed3 N=4 -12%")
    assert "outside" not in memory_check(t.iloc[:2])
