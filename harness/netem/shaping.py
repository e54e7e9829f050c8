"""Emulated network: a point's ranks run in a private network namespace whose loopback is rate-limited.

Why: spawned ranks on one CPU machine talk over loopback, which is nearly free and whose copies run on the
same cores as the compute, so bucket size and overlap barely matter. The paper's trade-offs need a network
that is slower than memory and does not burn the compute's cores. ``net`` (a field of every point config):

    net = "loopback"     the machine's own loopback, no emulation (the harness default)
    net = "500mbit"      RATE: every rank gets a link of this bandwidth (units kbit, mbit, gbit, tbit; as tc)
    net = "auto"         the RATE at which allreducing the model's whole gradient once takes as long as its
                         backward (the regime of the paper's Figure 2), measured here on the point's ranks
                         without DDP (:mod:`harness.netem.autorate`); cached per model/profile/batch/threads/ranks

How: a :class:`NamespacePool` (the sweep keeps one per network and rank count) runs ``unshare -rn <python> -c
<harness.netem.helper.main>``: a helper in a new user+network namespace brings its ``lo`` up, shapes it with ``tc
qdisc add dev lo root tbf rate <world_size x R> burst <B> limit <L>`` and keeps a
:class:`~harness.launch.spawn.RankPool` whose ranks inherit the namespace. Requests travel as JSON lines
(:mod:`harness.netem.wire`). Nothing is pickled and the host's network is never touched: the namespace, its
``lo`` and qdisc vanish with the helper.

Shaping: all ranks share one ``lo`` and every packet crosses lo's egress qdisc once. In a ring allreduce every
rank sends at the same time, so lo is shaped to ``world_size x R``; each rank then gets R, i.e. allreduce
busbw (nccl-tests) = R (checked within 15% by tests/harness/test_harness_netem.py). ``burst`` =
max(256 KiB, 1 ms at lo's rate): more than lo's 64 KiB packets, small next to a bucket's megabytes.
``limit`` (queue) = max(64 MiB, 50 ms at lo's rate): TCP's in-flight data never overflows it, because a
packet dropped on lo costs a 200 ms retransmission timeout. Drops, if any, are reported on stderr.

Hosts (``hosts=H``, the paper's servers joined by a slower network): the ranks are split evenly over H hosts
(contiguous ranks, as torchrun places them). Each host is a network namespace of its own inside the helper's,
whose one interface ``eth0`` (10.77.h.1) is a veth joined to a bridge in the helper's namespace (the switch),
shaped on egress by the same ``tbf`` at ``net``'s rate: the host's NIC (a ring sends and receives the same
amount, so each host's link carries one ring edge each way and busbw = R again). Ranks enter their host's
namespace before opening a socket and bind Gloo to its ``eth0``, so traffic between ranks of one host stays on
that host's own loopback, unshaped, like a server's interconnect. (One namespace with an address per host does
not work: the kernel gives a connection to a local address that address as its source too, so the traffic of
two hosts cannot be told apart.)

Not available under torchrun (RANK set): those ranks already run on the real network, so ``auto`` resolves
to ``loopback`` there and a RATE is refused (see ``harness.config.resolve`` and ``harness.preflight``).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from ddp_impl.options import MIB
from harness.launch.errors import ConfigError
from harness.launch.spawn import LaunchError
from harness.netem.wire import encode

_SBIN = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"


def _find(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path=_SBIN) or name


# Executables (module attributes, so tests can point them elsewhere).
UNSHARE = _find("unshare")  # util-linux
IP = _find("ip")  # iproute2
TC = _find("tc")  # iproute2
NSENTER = _find("nsenter")  # util-linux

BURST_MIN_BYTES = 256 * 1024
BURST_S = 1e-3
LIMIT_MIN_BYTES = 64 * MIB
LIMIT_S = 0.05


class NetemUnavailable(ConfigError):
    """This machine cannot emulate a network: a tool is missing or namespaces/tc are refused (a ValueError)."""


# --------------------------------------------------------------------------- availability

_available: set[tuple[str, str, str]] = set()


def run_tool(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def require() -> None:
    """Check once (per tool paths) that namespaces and tc work here; raise NetemUnavailable naming what not."""
    key = (UNSHARE, IP, TC)
    if key in _available:
        return
    hint = "Use --net=loopback (net='loopback': no emulation) on this machine."
    missing = [
        f"`{name}` ({pkg}, looked for {path!r})"
        for name, pkg, path in (("unshare", "util-linux", UNSHARE), ("ip", "iproute2", IP), ("tc", "iproute2", TC))
        if shutil.which(path) is None and shutil.which(path, path=_SBIN) is None
    ]
    if missing:
        raise NetemUnavailable(f"network emulation needs {', '.join(missing)}, not found. {hint}")
    try:
        probe = run_tool([UNSHARE, "-rn", "true"])
    except (OSError, subprocess.SubprocessError) as exc:
        raise NetemUnavailable(
            f"network emulation needs user+network namespaces, but `{UNSHARE} -rn true` could not run: {exc}. {hint}"
        ) from exc
    if probe.returncode != 0:
        raise NetemUnavailable(
            f"network emulation needs user+network namespaces, but `{UNSHARE} -rn true` failed (exit code "
            f"{probe.returncode}): {probe.stderr.strip() or 'no message'}. Containers and hardened kernels often "
            f"refuse them (docker's default seccomp profile, kernel.unprivileged_userns_clone=0, "
            f"user.max_user_namespaces=0). {hint}"
        )
    setup = f"{shlex.quote(IP)} link set lo up && {shlex.quote(TC)} qdisc add dev lo root {tbf_args(1000.0)}"
    probe = run_tool([UNSHARE, "-rn", "sh", "-c", setup])
    if probe.returncode != 0:
        raise NetemUnavailable(
            f"network emulation needs `ip` and `tc` to shape lo inside a network namespace, but `{setup}` failed "
            f"(exit code {probe.returncode}): {probe.stderr.strip() or 'no message'} (is the kernel's sch_tbf "
            f"qdisc available?). {hint}"
        )
    _available.add(key)


def tbf_args(lo_rate_mbit: float) -> str:
    bytes_per_s = lo_rate_mbit * 1e6 / 8
    burst = max(BURST_MIN_BYTES, int(bytes_per_s * BURST_S))
    limit = max(LIMIT_MIN_BYTES, int(bytes_per_s * LIMIT_S))
    return f"tbf rate {max(1, round(lo_rate_mbit * 1000))}kbit burst {burst} limit {limit}"


# --------------------------------------------------------------------------- parent side

HELPER_MAIN = "import sys; from harness.netem.helper import main; sys.exit(main(sys.argv[1]))"


class NamespacePool:
    """A :class:`~harness.launch.spawn.RankPool` inside one private network namespace whose lo gives every rank
    ``rate_mbit``, kept for many launches (the sweep keeps one per network and rank count). Started with
    ``rate_mbit=None``, the link is unshaped until :meth:`shape` (``net=auto`` times its backward on the ranks
    first).

    The helper (``unshare -rn python -c ...``) reads one JSON request per line on its stdin and writes one JSON
    answer per line to a pipe of its own (the ranks keep stdout and stderr). A helper that misses a deadline is
    killed with every rank it spawned; the next :meth:`run` starts a new namespace.
    """

    def __init__(
        self,
        world_size: int,
        backend: str,
        *,
        rate_mbit: float | None,
        timeout_s: float,
        threads: int,
        hosts: int = 1,
        env: dict | None = None,
    ):
        self.setup = dict(
            world_size=world_size,
            backend=backend,
            timeout_s=timeout_s,
            threads=threads,
            rate_mbit=rate_mbit,
            hosts=hosts,
        )
        self.env = dict(env or {})  # for the helper and the ranks it spawns
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "NamespacePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        require()
        repo = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, **self.env, "PYTHONPATH": path}
        if "TORCH_CPP_LOG_LEVEL" not in env:
            # The helper hosts the rendezvous store, whose server warns that it cannot reverse-resolve its
            # clients (no DNS in the namespace). Quiet the helper only; it unsets this before spawning the ranks.
            env.update(TORCH_CPP_LOG_LEVEL="ERROR", _DDP_NETEM_UNSET_LOG_LEVEL="1")
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        try:
            self._proc = subprocess.Popen(
                [UNSHARE, "-rn", sys.executable, "-c", HELPER_MAIN, str(write_fd)],
                env=env,
                stdin=subprocess.PIPE,
                text=True,
                pass_fds=(write_fd,),
                start_new_session=True,
            )  # own process group: killed as a whole
        finally:
            os.close(write_fd)
        self._answers = os.fdopen(read_fd, "r")
        answer = self._ask(dict(self.setup, sys_path=sys.path, cwd=os.getcwd()), timeout_s=120)
        if answer["status"] == "setup_error":
            self.close()
            raise NetemUnavailable(answer["message"])

    def _ask(self, request: dict, timeout_s: float | None) -> dict:
        """Send one request and wait for its answer; a helper that dies or overruns ends the pool."""
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        except OSError:
            pass  # the helper is gone: reported below as no answer
        ready, _, _ = select.select([self._answers], [], [], timeout_s)
        line = self._answers.readline() if ready else ""
        if line:
            return json.loads(line)
        code = self._proc.poll()
        self.close()
        why = "ran past its deadline" if not ready else f"exited with code {code} without an answer"
        raise LaunchError(f"the network-emulation helper (`unshare -rn python -c ...harness.netem.helper`) {why}")

    def run(self, fn, args=(), deadline_s: float | None = None) -> list:
        """``fn(ctx, *args)`` on every rank behind the emulated link; the results by rank (JSON round trip)."""
        if fn.__module__ == "__main__":
            raise TypeError(f"network emulation imports fn by name; move {fn.__qualname__} out of the __main__ script")
        request = dict(fn=f"{fn.__module__}:{fn.__qualname__}", args=encode(list(args)), deadline_s=deadline_s)
        if self._proc is None:
            self._start()
        answer = self._ask(request, None if deadline_s is None else deadline_s + 60)
        if answer["status"] != "ok":
            self.close()  # a fault may have changed the namespace (a host's link down): the next run starts afresh
            raise LaunchError(
                answer["message"], answer.get("crashed", ()), answer.get("failed_rank"), answer.get("cause", "")
            )
        if answer["dropped"]:
            print(
                f"[netem] the emulated links dropped {answer['dropped']} packet(s) at {self.setup['rate_mbit']:g} "
                f"Mbit/s; TCP retransmissions may have inflated the times",
                file=sys.stderr,
            )
        return answer["results"]

    def shape(self, rate_mbit: float) -> None:
        """Limit the unshaped link to ``rate_mbit`` per rank, now and for the namespaces a failure restarts."""
        if self.setup["rate_mbit"] is not None:
            raise ValueError(f"the link is already shaped at {self.setup['rate_mbit']:g} Mbit/s")
        self.setup["rate_mbit"] = rate_mbit
        if self._proc is not None:
            answer = self._ask({"shape": rate_mbit}, timeout_s=60)
            if answer["status"] != "ok":
                self.close()
                raise NetemUnavailable(answer["message"])

    def close(self) -> None:
        """End the helper: politely (end of its stdin) when idle, else with every rank it spawned."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        self._answers.close()
