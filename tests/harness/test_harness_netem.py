"""Emulated network (harness.netem): busbw matches the configured rate, the host's network is untouched,
refused namespaces give a clear error, ``auto`` picks and records a rate, emulated hosts shape only what crosses
between them."""
import dataclasses
import math
import os
import statistics
import subprocess
import time

import pytest
import torch
import torch.distributed as dist

from harness import (AllreduceConfig, LaunchError, TrainConfig, autorate, config, env, netem, netem_wire, run_point,
                     run_sweep, validate)
from harness.collectives import bus_factor
from harness.env import available_cores
from harness.preflight import preflight
from harness.rate import parse_rate


def _emulation_works() -> str:
    try:
        netem.require()
        return ""
    except netem.NetemUnavailable as exc:
        return str(exc)


_UNAVAILABLE = _emulation_works()
needs_netem = pytest.mark.skipif(bool(_UNAVAILABLE), reason=f"no network emulation here: {_UNAVAILABLE}")


def _host_network() -> str:
    """What a leak into the host would change: every qdisc and every link."""
    out = [subprocess.run([tool, *args], capture_output=True, text=True, timeout=10).stdout
           for tool, args in ((netem.TC, ["qdisc", "show"]), (netem.IP, ["link", "show"]),
                              (netem.IP, ["addr", "show"]))]
    return "\n".join(out)


@needs_netem
@pytest.mark.parametrize("net", ["200mbit", "1gbit"])
def test_allreduce_busbw_matches_the_configured_rate(net):
    before = _host_network()
    cfg = AllreduceConfig(backend="gloo", profile="cpu", world_size=2, total_params=2_000_000,
                          params_per_call=2_000_000, iters=5, warmup=2, threads_per_rank=1, net=net, timeout_s=60)
    rows = run_point(cfg)
    rate = parse_rate(net)
    busbw_mbit = statistics.median(r["busbw_gbps"] * 8000 for r in rows)  # GB/s -> Mbit/s
    assert abs(busbw_mbit / rate - 1) < 0.15, (busbw_mbit, rate)
    assert {r["net"] for r in rows} == {net} and {r["net_rate_mbit"] for r in rows} == {rate}
    assert _host_network() == before  # the shaping lived and died in the private namespace


def _transfer_ms(ctx, cfg):
    """Rank 0 sends 4 MiB to rank 1 (same emulated host), then rank 1 to rank 2 (the next host): the receiver's
    ms for each, timed from a barrier."""
    data = torch.zeros(1024 * 1024)
    rows = []
    for src, dst in ((0, 1), (1, 2)):
        dist.barrier()
        start = time.perf_counter()
        if ctx.rank == src:
            dist.send(data, dst)
        elif ctx.rank == dst:
            dist.recv(data, src)
            rows.append(dict(pair=f"{src}->{dst}", ms=(time.perf_counter() - start) * 1e3))
        dist.barrier()
    return rows


@needs_netem
def test_emulated_hosts_shape_only_the_traffic_between_hosts():
    before = _host_network()
    cfg = AllreduceConfig(backend="gloo", profile="cpu", world_size=4, hosts=2, total_params=2_000_000,
                          params_per_call=2_000_000, iters=4, warmup=1, threads_per_rank=1, net="200mbit",
                          timeout_s=60)
    took = {r["pair"]: r["ms"] for r in run_point(cfg, fn=_transfer_ms)}
    wire_ms = 4 * 2**20 * 8 / 200e6 * 1e3  # 4 MiB at 200 Mbit/s: 168 ms
    assert abs(took["1->2"] / wire_ms - 1) < 0.2, took  # between hosts: the host's link
    assert took["0->1"] < wire_ms / 5, took  # inside a host: unshaped
    rows = run_point(cfg)  # a ring over 2 hosts: each host's link carries one edge each way, so busbw = R
    busbw_mbit = statistics.median(r["busbw_gbps"] * 8000 for r in rows)
    assert abs(busbw_mbit / 200 - 1) < 0.2, busbw_mbit
    assert {r["hosts"] for r in rows} == {2} and _host_network() == before


@needs_netem
def test_a_pool_started_unshaped_limits_its_hosts_links_once_shaped():
    """``net=auto`` times its backward on a pool's ranks before their links are shaped: the links are free until
    then, and after :meth:`NamespacePool.shape` limited between hosts as if the pool had started shaped."""
    wire_ms = 4 * 2**20 * 8 / 200e6 * 1e3
    with netem.NamespacePool(4, "gloo", rate_mbit=None, timeout_s=60, threads=1, hosts=2) as pool:
        free = {r["pair"]: r["ms"] for rank in pool.run(_transfer_ms, (None,)) for r in rank}
        pool.shape(200)
        shaped = {r["pair"]: r["ms"] for rank in pool.run(_transfer_ms, (None,)) for r in rank}
        with pytest.raises(ValueError, match="already shaped at 200 Mbit/s"):
            pool.shape(100)
    assert free["1->2"] < wire_ms / 5, free
    assert abs(shaped["1->2"] / wire_ms - 1) < 0.2 and shaped["0->1"] < wire_ms / 5, shaped


@needs_netem
def test_faults_across_emulated_hosts_are_stored_as_errors_and_the_sweep_goes_on(tmp_path):
    """A rank SIGKILLed mid-run, and its host's link taken down mid-run: every rank on both hosts ends within the
    process-group timeout, each point is stored as an error, and the next point on the same pool settings measures
    normally (the namespace is rebuilt, its links up again)."""
    timeout_s = 15
    base = dict(model="small", impl="ours", world_size=2, hosts=2, iters=400, warmup=0, threads_per_rank=1,
                net="500mbit", timeout_s=timeout_s)
    killed, cut = TrainConfig(**base, fault="kill@1"), TrainConfig(**base, fault="linkdown@1")
    fine = TrainConfig(**dict(base, iters=3), repeat=1)  # the second pass: after both faults
    start = time.monotonic()
    df = run_sweep("faults", [killed, cut, fine], root=tmp_path, progress=False)
    took = time.monotonic() - start
    failed = df[df["error"].fillna("") != ""].set_index("point_id")
    assert set(failed.index) == {config.point_id(killed), config.point_id(cut)}, failed["error"].tolist()
    killed_row = failed.loc[config.point_id(killed)]  # rank 1 is the cause, though its peer may report first
    assert (killed_row["failed_rank"], killed_row["cause"]) == (1, "killed by SIGKILL"), killed_row["error"][:500]
    assert killed_row["error"].startswith("rank 1 failed first: killed by SIGKILL")
    cut_row = failed.loc[config.point_id(cut)]  # either side may time out first
    assert cut_row["failed_rank"] in (0, 1) and cut_row["cause"], cut_row["error"][:500]
    ok = df[df["point_id"] == config.point_id(fine)]
    assert len(ok) == 2 * 3 and ok["total_ms"].notna().all()
    assert took < 2 * timeout_s + 90, took  # nothing waited beyond the timeout (plus start-up of 3 pools)


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


@needs_netem
def test_a_failing_rank_inside_the_namespace_fails_the_launch():
    cfg = AllreduceConfig(backend="gloo", profile="cpu", world_size=2, total_params=100_000, params_per_call=100_000,
                          iters=1, warmup=0, threads_per_rank=1, net="1gbit", timeout_s=60, fault="raise@1")
    with pytest.raises(LaunchError, match="injected fault on rank 1"):
        run_point(cfg)


@needs_netem
def test_a_namespace_pool_reuses_its_ranks_and_restarts_after_a_failure():
    from test_harness_launch import check_pool_keeps_ranks_until_a_failure

    with netem.NamespacePool(2, "gloo", rate_mbit=1000, timeout_s=60, threads=1) as pool:
        check_pool_keeps_ranks_until_a_failure(pool)


@needs_netem
def test_auto_measures_records_and_caches_a_rate(monkeypatch):
    launches = []
    real_run = netem.NamespacePool.run

    def counting_run(pool, fn, *args, **kwargs):
        launches.append((fn.__name__, pool.setup["rate_mbit"]))
        return real_run(pool, fn, *args, **kwargs)

    monkeypatch.setattr(netem.NamespacePool, "run", counting_run)
    monkeypatch.setattr(autorate, "launch", None)  # no launch of its own: the backward is timed on the pool's ranks
    autorate._backward_cache.clear()
    cfg = TrainConfig(model="small", profile="cpu", backend="gloo", world_size=2, iters=2, warmup=1,
                      threads_per_rank=1, net="auto", timeout_s=60)
    rows = run_point(cfg)
    rates = {r["net_rate_mbit"] for r in rows}
    assert len(rates) == 1 and {r["net"] for r in rows} == {"auto"}
    rate = rates.pop()
    backward_ms = rows[0]["net_auto_backward_ms"]
    assert math.isfinite(rate) and rate > 0 and backward_ms > 0
    bus_bits = bus_factor(2) * rows[0]["num_params"] * 4 * 8
    assert rate == pytest.approx(bus_bits / 1e6 / (backward_ms / 1e3))  # one allreduce takes one backward
    # timed on the unshaped pool, whose ranks then ran the point behind the rate found
    assert launches == [("_time_backward", None), ("run_training_point", rate)]
    other = validate(TrainConfig(model="small", profile="cpu", backend="gloo", world_size=2, bucket_cap_mb=1,
                                 threads_per_rank=1, net="auto"))
    assert autorate.point_rate(other) == (rate, backward_ms) and len(launches) == 2  # cached


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


@pytest.mark.parametrize("tool,value,message", [
    ("UNSHARE", "false", r"user\+network namespaces.*failed \(exit code 1\).*--net=loopback"),
    ("UNSHARE", "/nonexistent/unshare", r"needs `unshare` \(util-linux.*not found.*--net=loopback"),
    ("TC", "/nonexistent/tc", r"needs `tc` \(iproute2.*not found"),
])
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
    df = pd.DataFrame({
        "point_id": ["emu", "plain", "one", "rate"], "point_type": ["TrainConfig"] * 4, "error": [""] * 4,
        "net": ["auto", "loopback", "loopback", "1gbit"], "backend": ["gloo"] * 4, "world_size": [2, 2, 1, 2],
        "impl": ["ours"] * 4,
    })
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

    from experiments.figures import fig09_scalability as fig9
    from experiments.common import ok_rows

    df = pd.DataFrame({"point_id": ["old", "flat", "two", "local"], "point_type": ["TrainConfig"] * 4,
                       "error": [""] * 4, "net": ["1gbit"] * 3 + ["loopback"], "backend": ["gloo"] * 4,
                       "world_size": [4, 4, 4, 1], "impl": ["ours", "ours", "ours", "local"],
                       "hosts": [None, 1, 2, 1]})  # "old": stored before the column existed
    assert list(ok_rows(df, net="1gbit")["point_id"]) == ["old", "flat"]
    assert list(ok_rows(df, net="1gbit", hosts=2)["point_id"]) == ["two"]
    assert list(ok_rows(df, net="loopback", hosts=2)["point_id"]) == ["local"]  # no communication: any hosts
    points = fig9.points(fig9.Config(world_sizes=(2, 4), hosts=2, models=("small",), repeats=1))
    assert {(p.impl, p.hosts) for p in points} == {("ours", 2), ("local", 1)}


def _allocator_env(ctx, cfg):
    return [dict(mmap_max=os.environ.get("MALLOC_MMAP_MAX_", "unset"))]


@pytest.mark.parametrize("net", ["loopback", pytest.param("1gbit", marks=needs_netem)])
def test_a_points_allocator_setting_reaches_its_ranks(net):
    base = TrainConfig(model="small", world_size=2, threads_per_rank=1, timeout_s=60, net=net)
    retain = run_point(dataclasses.replace(base, malloc="retain"), fn=_allocator_env)
    assert [r["mmap_max"] for r in retain] == ["0"] * 2
    assert [r["mmap_max"] for r in run_point(base, fn=_allocator_env)] == ["unset"] * 2
