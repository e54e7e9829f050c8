"""Emulated network (harness.netem.shaping), run in private namespaces: busbw matches the configured rate, the
host's network is untouched, ``auto`` measures and records a rate on the pool's ranks, emulated hosts shape only
what crosses between them, and faults across hosts end as stored errors. What is checked without emulating
(validation, refusals, ``auto``'s formula, drivers' rows): test_harness_netem_settings.py."""

import dataclasses
import math
import os
import statistics
import subprocess
import time

import pytest
import torch
import torch.distributed as dist

from harness import AllreduceConfig, LaunchError, TrainConfig, config, run_point, run_sweep, validate
from harness.netem import autorate
from harness.netem import shaping as netem
from harness.netem.rate import parse_rate
from harness.workloads.collectives import bus_factor


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
    out = [
        subprocess.run([tool, *args], capture_output=True, text=True, timeout=10).stdout
        for tool, args in ((netem.TC, ["qdisc", "show"]), (netem.IP, ["link", "show"]), (netem.IP, ["addr", "show"]))
    ]
    return "\n".join(out)


@needs_netem
@pytest.mark.parametrize("net", ["200mbit", "1gbit"])
def test_allreduce_busbw_matches_the_configured_rate(net):
    before = _host_network()
    cfg = AllreduceConfig(
        backend="gloo",
        profile="cpu",
        world_size=2,
        total_params=2_000_000,
        params_per_call=2_000_000,
        iters=5,
        warmup=2,
        threads_per_rank=1,
        net=net,
        timeout_s=60,
    )
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
    cfg = AllreduceConfig(
        backend="gloo",
        profile="cpu",
        world_size=4,
        hosts=2,
        total_params=2_000_000,
        params_per_call=2_000_000,
        iters=4,
        warmup=1,
        threads_per_rank=1,
        net="200mbit",
        timeout_s=60,
    )
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
    base = dict(
        model="small",
        impl="ours",
        world_size=2,
        hosts=2,
        iters=400,
        warmup=0,
        threads_per_rank=1,
        net="500mbit",
        timeout_s=timeout_s,
    )
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


@needs_netem
def test_a_failing_rank_inside_the_namespace_fails_the_launch():
    cfg = AllreduceConfig(
        backend="gloo",
        profile="cpu",
        world_size=2,
        total_params=100_000,
        params_per_call=100_000,
        iters=1,
        warmup=0,
        threads_per_rank=1,
        net="1gbit",
        timeout_s=60,
        fault="raise@1",
    )
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
    cfg = TrainConfig(
        model="small",
        profile="cpu",
        backend="gloo",
        world_size=2,
        iters=2,
        warmup=1,
        threads_per_rank=1,
        net="auto",
        timeout_s=60,
    )
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
    other = validate(
        TrainConfig(
            model="small", profile="cpu", backend="gloo", world_size=2, bucket_cap_mb=1, threads_per_rank=1, net="auto"
        )
    )
    assert autorate.point_rate(other) == (rate, backward_ms) and len(launches) == 2  # cached


def _allocator_env(ctx, cfg):
    return [dict(mmap_max=os.environ.get("MALLOC_MMAP_MAX_", "unset"))]


@pytest.mark.parametrize("net", ["loopback", pytest.param("1gbit", marks=needs_netem)])
def test_a_points_allocator_setting_reaches_its_ranks(net):
    base = TrainConfig(model="small", world_size=2, threads_per_rank=1, timeout_s=60, net=net)
    retain = run_point(dataclasses.replace(base, malloc="retain"), fn=_allocator_env)
    assert [r["mmap_max"] for r in retain] == ["0"] * 2
    assert [r["mmap_max"] for r in run_point(base, fn=_allocator_env)] == ["unset"] * 2
