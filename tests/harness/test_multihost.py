"""Two hosts for real, on one machine: network namespaces with their own addresses joined by a veth pair, each
running its own torchrun with a c10d rendezvous across them, as a user would on a cluster (the README's recipe).
Training with our DDP there must end with the same parameters as the same world size on one host. The addresses
exist only inside the namespaces the test creates and removes; no traffic leaves them."""

import json
import os
import shutil
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
PORT = 29400


def _ip(*args) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """[(namespace, address, interface)] for two emulated hosts on one link; removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("creating network namespaces needs root and iproute2 (`ip netns add`)")
    tag = uuid.uuid4().hex[:6]
    hosts = [(f"ddp{tag}h{i}", f"10.77.0.{i + 1}", f"v{tag}{i}") for i in range(2)]
    try:
        for ns, _, _ in hosts:
            _ip("netns", "add", ns)
        _ip("link", "add", hosts[0][2], "type", "veth", "peer", "name", hosts[1][2])
        for ns, addr, dev in hosts:
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        _remove(hosts)
        pytest.skip(f"cannot create network namespaces here: {getattr(exc, 'stderr', '') or exc}")
    yield hosts
    _remove(hosts)


def _remove(hosts) -> None:
    for ns, _, _ in hosts:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _env(interface: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": interface, "OMP_NUM_THREADS": "1"}


def _start(cmd, interface: str, log: Path) -> tuple[subprocess.Popen, Path]:
    """Output goes to a file, not a pipe: a pipe nobody drains while we wait on another host's process fills up
    (each rank logs warnings) and blocks that host's ranks, and with them every rank."""
    with open(log, "w") as out:
        return subprocess.Popen(cmd, env=_env(interface), stdout=out, stderr=subprocess.STDOUT, text=True), log


def _finish(procs) -> list[dict]:
    try:
        for p, _ in procs:
            p.wait(timeout=180)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outs = []
    for p, log in procs:
        text = log.read_text()
        assert p.returncode == 0, text[-3000:]
        outs += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return outs


def _one_host_run(tmp_path, world: int) -> dict:
    """The reference: ``world`` ranks of one torchrun on this host; its parameters go to one.pt."""
    one_host = _start(
        [
            *TORCHRUN,
            "--standalone",
            f"--nproc-per-node={world}",
            "-m",
            "harness.workloads.smoke",
            f"--out={tmp_path / 'one.pt'}",
        ],
        "lo",
        tmp_path / "one.log",
    )
    (reference,) = _finish([one_host])
    return reference


def _two_host_run(two_hosts, tmp_path, ranks_per_host: int, attempt: int) -> list[dict]:
    """One torchrun per emulated host, meeting at a c10d rendezvous on the first; parameters go to two.pt."""
    head = two_hosts[0][1]
    return _finish(
        [
            _start(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    *TORCHRUN,
                    "--nnodes=2",
                    f"--nproc-per-node={ranks_per_host}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={head}:{PORT}",
                    f"--rdzv-id=smoke{ranks_per_host}-{attempt}",
                    f"--local-addr={addr}",
                    f"--rdzv-conf=is_host={int(addr == head)},join_timeout=90",
                    "-m",
                    "harness.workloads.smoke",
                    f"--out={tmp_path / 'two.pt'}",
                ],
                dev,
                tmp_path / f"{ns}-{attempt}.log",
            )
            for ns, addr, dev in two_hosts
        ]
    )


@pytest.mark.parametrize("ranks_per_host", [2])  # ranks within a host and across hosts
def test_two_hosts_train_to_the_same_parameters_as_one(two_hosts, tmp_path, ranks_per_host):
    world = 2 * ranks_per_host
    reference = _one_host_run(tmp_path, world)
    try:
        (summary,) = _two_host_run(two_hosts, tmp_path, ranks_per_host, 0)  # rank 0 (on one of the hosts) prints it
    except (AssertionError, subprocess.TimeoutExpired) as first:  # seen once in ~6 runs of 2 x 2 ranks: a
        warnings.warn(f"two-host launch failed once, retrying: {str(first)[-1500:]}")  # rendezvous that hung
        (summary,) = _two_host_run(two_hosts, tmp_path, ranks_per_host, 1)
    assert summary["world_size"] == world and summary["ranks_agree"]
    assert summary["interfaces"] == sorted(dev for _, _, dev in two_hosts)  # ranks on both hosts took part
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-6, atol=1e-7, msg=name)
    assert summary["checksum"] == pytest.approx(reference["checksum"], rel=1e-9)
