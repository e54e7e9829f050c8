"""Network settings checked without emulating a network: ``net`` and ``hosts`` validation, refused namespaces
stop a sweep with a clear message before anything launches, ``auto``'s rate formula and where it means loopback,
rates under torchrun, arguments that travel to the helper as JSON, and drivers that never mix rows of different
networks or host counts. Runs on emulated links: test_harness_netem.py."""

import math

import pytest

from harness import AllreduceConfig, TrainConfig, config, run_sweep, validate
from harness.launch import env
from harness.launch.env import available_cores
from harness.netem import autorate
from harness.netem import shaping as netem
from harness.netem import wire as netem_wire
from harness.preflight import preflight


def test_hosts_need_an_emulated_network_and_must_divide_the_ranks():
    with pytest.raises(ValueError, match="hosts=3 must divide world_size=4"):
        validate(TrainConfig(world_size=4, hosts=3, net="1gbit"))
    with pytest.raises(ValueError, match="hosts=2 emulates hosts behind their own links"):
        validate(TrainConfig(world_size=4, hosts=2, net="loopback"))
    with pytest.raises(ValueError, match="needs hosts > 1"):
        validate(TrainConfig(world_size=4, net="1gbit", fault="linkdown@1"))
    one = TrainConfig(world_size=4, net="1gbit")
    assert config.point_id(one) == config.point_id(TrainConfig(world_size=4, net="1gbit", hosts=1))  # ids kept
    assert config.point_id(one) != config.point_id(TrainConfig(world_size=4, net="1gbit", hosts=2))


def test_auto_rate_formula_and_reference_model(monkeypatch):
    asked = []

    def fake(model, profile, batch_size, threads, ranks, run=None):
        asked.append((model, profile, batch_size, threads, ranks))
        return {"backward_ms": 100.0, "grad_bytes": 100_000_000}

    monkeypatch.setattr(autorate, "measure_backward", fake)
    monkeypatch.setattr(env, "cuda_available", lambda: False)
    monkeypatch.setattr(netem, "require", lambda: None)
    rate, backward_ms = autorate.point_rate(validate(AllreduceConfig(world_size=3, threads_per_rank=1, net="auto")))
    assert backward_ms == 100.0 and rate == pytest.approx(4 / 3 * 8e8 / 1e6 / 0.1)  # 2(n-1)/n x 800 Mbit / 0.1 s
    assert asked == [("resnet50", "cpu", 0, 1, 3)]  # allreduce points use ResNet50's backward, on 3 ranks
    autorate.point_rate(validate(TrainConfig(model="bert-base", batch_size=3, world_size=2, net="auto")))
    assert asked[-1] == ("bert-base", "cpu", 3, max(1, available_cores() // 2), 2)  # the point's threads, ranks
    rate, backward_ms = autorate.point_rate(validate(TrainConfig(net="500mbit")))
    assert rate == 500.0 and math.isnan(backward_ms)
    assert autorate.point_rate(validate(TrainConfig(net="loopback")))[0] is None


def test_auto_is_loopback_where_nothing_is_emulated(monkeypatch):
    monkeypatch.setattr(env, "cuda_available", lambda: False)
    monkeypatch.setattr(netem, "require", lambda: None)
    assert validate(TrainConfig(net="auto")).net == "auto"
    assert validate(TrainConfig(net="auto", world_size=1)).net == "loopback"
    assert validate(TrainConfig(net="auto", impl="local")).net == "loopback"
    monkeypatch.setattr(env, "cuda_available", lambda: True)  # GPUs (NCCL): the real interconnect
    assert config.resolve(TrainConfig(net="auto")).net == "loopback"
    assert config.resolve(AllreduceConfig(net="auto", backend="gloo")).net == "loopback"


def test_rates_under_torchrun_are_refused(monkeypatch):
    monkeypatch.setattr(env, "cuda_available", lambda: False)
    monkeypatch.setenv("RANK", "0")
    assert validate(TrainConfig()).net == "loopback"  # the default, auto: the real network
    preflight([validate(TrainConfig())])
    with pytest.raises(ValueError, match="torchrun"):
        preflight([validate(TrainConfig(net="1gbit"))])


@pytest.mark.parametrize("net", ["1gbps", "fast", "0mbit", "-1gbit", "1 gbit/s"])
def test_bad_net_values_are_refused(net):
    with pytest.raises(ValueError, match="unknown net"):
        validate(TrainConfig(net=net))


@pytest.mark.parametrize(
    "tool,value,message",
    [
        ("UNSHARE", "false", r"user\+network namespaces.*failed \(exit code 1\).*--net=loopback"),
        ("UNSHARE", "/nonexistent/unshare", r"needs `unshare` \(util-linux.*not found.*--net=loopback"),
        ("TC", "/nonexistent/tc", r"needs `tc` \(iproute2.*not found"),
    ],
)
def test_refused_namespaces_stop_with_a_clear_message(monkeypatch, tmp_path, tool, value, message):
    monkeypatch.setattr(netem, tool, value)
    monkeypatch.setattr(env, "cuda_available", lambda: False)
    monkeypatch.setattr("harness.sweep._Pools.get_for", lambda *a, **k: pytest.fail("nothing may launch"))
    with pytest.raises(netem.NetemUnavailable, match=message):
        run_sweep("netem", [TrainConfig(net="loopback"), TrainConfig(net="1gbit")], root=tmp_path, progress=False)
    assert not (tmp_path / "netem").exists()  # stopped before the first point, nothing stored
    assert validate(TrainConfig(net="loopback")).net == "loopback"  # --net=loopback still works


def test_launch_arguments_travel_as_json():
    cfg = TrainConfig(model="resnet50", net="1gbit")
    encoded = netem_wire.encode([cfg, (1, "a"), {"k": [1.5, None]}])
    assert netem_wire.decode(encoded) == [cfg, (1, "a"), {"k": [1.5, None]}]
    with pytest.raises(TypeError, match="JSON"):
        netem_wire.encode([object()])


def test_drivers_never_mix_rows_of_different_networks(monkeypatch):
    import pandas as pd

    from experiments.common import ok_rows

    monkeypatch.setattr(env, "cuda_available", lambda: False)
    df = pd.DataFrame(
        {
            "point_id": ["emu", "plain", "one", "rate"],
            "point_type": ["TrainConfig"] * 4,
            "error": [""] * 4,
            "net": ["auto", "loopback", "loopback", "1gbit"],
            "backend": ["gloo"] * 4,
            "world_size": [2, 2, 1, 2],
            "impl": ["ours"] * 4,
        }
    )
    assert list(ok_rows(df, net="auto")["point_id"]) == ["emu", "one"]  # one rank: auto means loopback
    assert list(ok_rows(df, net="loopback")["point_id"]) == ["plain", "one"]
    assert list(ok_rows(df, net="1gbit")["point_id"]) == ["rate"]
    assert len(ok_rows(df)) == 4
    monkeypatch.setattr(env, "cuda_available", lambda: True)  # plotted on a GPU machine: the same rows
    monkeypatch.setenv("RANK", "0")  # or under torchrun
    assert list(ok_rows(df, net="auto")["point_id"]) == ["emu", "one"]
    df["net_auto_loopback"] = [False, True, True, False]  # as stored since that column exists: it decides
    assert list(ok_rows(df, net="auto")["point_id"]) == ["emu", "plain", "one"]


def test_drivers_never_mix_rows_of_different_host_counts():
    import pandas as pd

    from experiments.common import ok_rows
    from experiments.figures import fig09_scalability as fig9

    df = pd.DataFrame(
        {
            "point_id": ["old", "flat", "two", "local"],
            "point_type": ["TrainConfig"] * 4,
            "error": [""] * 4,
            "net": ["1gbit"] * 3 + ["loopback"],
            "backend": ["gloo"] * 4,
            "world_size": [4, 4, 4, 1],
            "impl": ["ours", "ours", "ours", "local"],
            "hosts": [None, 1, 2, 1],
        }
    )  # "old": stored before the column existed
    assert list(ok_rows(df, net="1gbit")["point_id"]) == ["old", "flat"]
    assert list(ok_rows(df, net="1gbit", hosts=2)["point_id"]) == ["two"]
    assert list(ok_rows(df, net="loopback", hosts=2)["point_id"]) == ["local"]  # no communication: any hosts
    points = fig9.points(fig9.Config(world_sizes=(2, 4), hosts=2, models=("small",), repeats=1))
    assert {(p.impl, p.hosts) for p in points} == {("ours", 2), ("local", 1)}
