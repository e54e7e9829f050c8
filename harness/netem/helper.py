"""The network-emulation helper, inside its private network namespace (``unshare -rn python -c`` by
:class:`harness.netem.shaping.NamespacePool`): shape ``lo`` (one host) or build the emulated hosts behind a switch,
then run each request of the parent on a :class:`~harness.launch.spawn.RankPool` whose ranks inherit the namespace.
Everything it sets up vanishes with it, so the host's network is never touched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback

from harness.launch.spawn import LaunchError, RankPool
from harness.netem.netns import Host
from harness.netem.shaping import IP, NSENTER, TC, UNSHARE, NetemUnavailable, run_tool, tbf_args
from harness.netem.wire import decode, import_name, plain


def _configure(cmd: list[str]) -> None:
    """Run a set-up command inside the namespace; NetemUnavailable with its message if it fails."""
    done = run_tool(cmd)
    if done.returncode != 0:
        raise NetemUnavailable(
            f"`{' '.join(cmd)}` failed inside the network namespace (exit code "
            f"{done.returncode}): {done.stderr.strip() or 'no message'}"
        )


def _shape(rate_mbit: float, world_size: int, hosts_netns: list[str]) -> None:
    """Limit the links to ``rate_mbit`` per rank: one host's ``lo`` at world_size x the rate, else each host's NIC
    (``eth0``) at the rate."""
    if not hosts_netns:
        _configure([TC, "qdisc", "add", "dev", "lo", "root", *tbf_args(rate_mbit * world_size).split()])
    for netns in hosts_netns:
        nic = [TC, "qdisc", "add", "dev", HOST_INTERFACE, "root", *tbf_args(rate_mbit).split()]
        _configure(_in_netns(netns, nic))


HOST_INTERFACE = "eth0"  # an emulated host's one interface, as on a real server
SWITCH_ADDR = "10.77.255.1"  # the switch (the helper's own namespace): the rendezvous store is reached here


def _in_netns(netns: str, cmd: list[str]) -> list[str]:
    return [NSENTER, f"--net={netns}", *cmd] if netns else cmd


def _emulate_hosts(hosts: int, holders: list) -> list[str]:
    """The paper's servers behind a switch: each host a network namespace of its own (held by a ``sleep``
    appended to ``holders``), its ``eth0`` (10.77.h.1) a veth whose peer joins the bridge ``br0`` here (shaped by
    :func:`_shape` with the same ``tbf`` as the one-host case: the host's NIC). Returns each host's namespace
    path."""
    paths: list[str] = []
    for cmd in (
        [IP, "link", "add", "br0", "type", "bridge"],
        [IP, "addr", "add", f"{SWITCH_ADDR}/16", "dev", "br0"],
        [IP, "link", "set", "br0", "up"],
    ):
        _configure(cmd)
    own = os.readlink("/proc/self/ns/net")
    for h in range(hosts):
        holder = subprocess.Popen([UNSHARE, "-n", "sleep", "infinity"])
        holders.append(holder)
        netns = f"/proc/{holder.pid}/ns/net"
        deadline = time.monotonic() + 10
        while os.readlink(netns) == own:  # until unshare has made the new namespace
            if time.monotonic() > deadline or holder.poll() is not None:
                raise NetemUnavailable(f"`{UNSHARE} -n sleep infinity` made no network namespace for host {h}")
            time.sleep(0.01)
        paths.append(netns)
        for cmd in (
            [IP, "link", "add", f"vh{h}", "type", "veth", "peer", "name", HOST_INTERFACE],
            [IP, "link", "set", HOST_INTERFACE, "netns", str(holder.pid)],
            [IP, "link", "set", f"vh{h}", "master", "br0"],
            [IP, "link", "set", f"vh{h}", "up"],
            *(
                _in_netns(netns, c)
                for c in (
                    [IP, "link", "set", "lo", "up"],
                    [IP, "link", "set", HOST_INTERFACE, "up"],
                    [IP, "addr", "add", f"10.77.{h}.1/16", "dev", HOST_INTERFACE],
                )
            ),
        ):
            _configure(cmd)
    return paths


def _dropped(hosts_netns: list[str]) -> int:
    shows = [_in_netns(n, [TC, "-s", "qdisc", "show", "dev", HOST_INTERFACE]) for n in hosts_netns] or [
        [TC, "-s", "qdisc", "show", "dev", "lo"]
    ]
    return sum(int(n) for cmd in shows for n in re.findall(r"dropped (\d+)", run_tool(cmd).stdout))


def main(answer_fd: str) -> int:
    """The helper: set up the namespace's links as the parent's first request says (unshaped where its rate is
    None, until a ``shape`` request), then serve its requests."""
    answers = os.fdopen(int(answer_fd), "w")

    def answer(**out) -> None:
        answers.write(json.dumps(out, default=plain) + "\n")
        answers.flush()

    setup = json.loads(sys.stdin.readline())
    sys.path[:0] = [p for p in setup["sys_path"] if p not in sys.path]
    os.chdir(setup["cwd"])
    holders: list[subprocess.Popen] = []  # the emulated hosts' namespaces live as long as these
    try:
        try:
            _configure([IP, "link", "set", "lo", "up"])
            hosts_netns = _emulate_hosts(setup["hosts"], holders) if setup["hosts"] > 1 else []
            if setup["rate_mbit"] is not None:
                _shape(setup["rate_mbit"], setup["world_size"], hosts_netns)
        except (NetemUnavailable, OSError, subprocess.SubprocessError) as exc:
            answer(status="setup_error", message=str(exc))
            return 2
        return _serve(setup, answer, hosts_netns)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def _serve(setup: dict, answer, hosts_netns: list[str]) -> int:
    """The helper's loop: run each request on the pool's ranks until the parent closes our stdin."""
    world_size = setup["world_size"]
    hosts = (
        [Host(hosts_netns[r * len(hosts_netns) // world_size], HOST_INTERFACE) for r in range(world_size)]
        if hosts_netns
        else []
    )  # contiguous ranks per host, as torchrun places them
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # the only interface here; skips Gloo's hostname lookup
    if os.environ.pop("_DDP_NETEM_UNSET_LOG_LEVEL", None):  # torch is imported: the ranks log as usual
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    answer(status="ready")
    dropped = 0
    with RankPool(
        world_size,
        setup["backend"],
        timeout_s=setup["timeout_s"],
        threads=setup["threads"],
        rank_setup=[host.enter for host in hosts],
        store_host=SWITCH_ADDR if hosts else "127.0.0.1",
    ) as pool:
        for line in sys.stdin:  # one request per line until the parent closes our stdin
            req = json.loads(line)
            try:
                if "shape" in req:
                    _shape(req["shape"], world_size, hosts_netns)
                    answer(status="ok", results=None, dropped=0)
                    continue
                results = pool.run(import_name(req["fn"]), decode(req["args"]), req["deadline_s"])
            except LaunchError as exc:
                answer(
                    status="launch_error",
                    message=str(exc),
                    crashed=list(exc.crashed),
                    failed_rank=exc.failed_rank,
                    cause=exc.cause,
                )
                continue
            except Exception:  # noqa: BLE001 - reported to the parent as text
                answer(status="error", message=traceback.format_exc())
                continue
            total = _dropped(hosts_netns)
            answer(status="ok", results=results, dropped=total - dropped)
            dropped = total
    return 0
