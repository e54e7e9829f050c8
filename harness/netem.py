"""Emulated network: a point's ranks run in a private network namespace whose loopback is rate-limited.

Why: spawned ranks on one CPU machine talk over loopback, which is nearly free and whose copies run on the
same cores as the compute, so bucket size and overlap barely matter. The paper's trade-offs need a network
that is slower than memory and does not burn the compute's cores. ``net`` (a field of every point config):

    net = "loopback"     the machine's own loopback, no emulation (the harness default)
    net = "500mbit"      RATE: every rank gets a link of this bandwidth (units kbit, mbit, gbit, tbit; as tc)
    net = "auto"         the RATE at which allreducing the model's whole gradient once takes as long as its
                         backward (the regime of the paper's Figure 2), measured here on the point's ranks
                         without DDP (:mod:`harness.autorate`); cached per model/profile/batch/threads/ranks

How: ``launch_in_namespace(fn, ..., rate_mbit=R)`` (the sweep's choice for such points) runs
``unshare -rn <python> -c <_helper> REQUEST RESULT``: a helper in a new user+network namespace brings its
``lo`` up, shapes it with ``tc qdisc add dev lo root tbf rate <world_size x R> burst <B> limit <L>`` and runs
the normal spawned launch, whose ranks inherit the namespace. ``fn`` travels by import name and its arguments
as JSON (plain values and dataclasses); per-rank results come back as JSON in RESULT (tuples come back as
lists). Nothing is pickled and the host's network is never touched: the namespace, its ``lo`` and qdisc
vanish with the helper.

Shaping: all ranks share one ``lo`` and every packet crosses lo's egress qdisc once. In a ring allreduce every
rank sends at the same time, so lo is shaped to ``world_size x R``; each rank then gets R, i.e. allreduce
busbw (nccl-tests) = R (checked within 15% by tests/harness/test_harness_netem.py). ``burst`` =
max(256 KiB, 1 ms at lo's rate): more than lo's 64 KiB packets, small next to a bucket's megabytes.
``limit`` (queue) = max(64 MiB, 50 ms at lo's rate): TCP's in-flight data never overflows it, because a
packet dropped on lo costs a 200 ms retransmission timeout. Drops, if any, are reported on stderr.

Not available under torchrun (RANK set): those ranks already run on the real network, so ``auto`` resolves
to ``loopback`` there and a RATE is refused (see ``harness.config.resolve`` and ``harness.preflight``).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from harness.launch import LaunchError, launch

_SBIN = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"


def _find(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path=_SBIN) or name


# Executables (module attributes, so tests can point them elsewhere).
UNSHARE = _find("unshare")  # util-linux
IP = _find("ip")  # iproute2
TC = _find("tc")  # iproute2

BURST_MIN_BYTES = 256 * 1024
BURST_S = 1e-3
LIMIT_MIN_BYTES = 64 * 1024 * 1024
LIMIT_S = 0.05

class NetemUnavailable(ValueError):
    """This machine cannot emulate a network: a tool is missing or namespaces/tc are refused."""


# --------------------------------------------------------------------------- availability

_available: set[tuple[str, str, str]] = set()


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def require() -> None:
    """Check once (per tool paths) that namespaces and tc work here; raise NetemUnavailable naming what not."""
    key = (UNSHARE, IP, TC)
    if key in _available:
        return
    hint = "Use --net=loopback (net='loopback': no emulation) on this machine."
    missing = [f"`{name}` ({pkg}, looked for {path!r})" for name, pkg, path in
               (("unshare", "util-linux", UNSHARE), ("ip", "iproute2", IP), ("tc", "iproute2", TC))
               if shutil.which(path) is None and shutil.which(path, path=_SBIN) is None]
    if missing:
        raise NetemUnavailable(f"network emulation needs {', '.join(missing)}, not found. {hint}")
    try:
        probe = _run([UNSHARE, "-rn", "true"])
    except (OSError, subprocess.SubprocessError) as exc:
        raise NetemUnavailable(f"network emulation needs user+network namespaces, but `{UNSHARE} -rn true` "
                               f"could not run: {exc}. {hint}") from exc
    if probe.returncode != 0:
        raise NetemUnavailable(
            f"network emulation needs user+network namespaces, but `{UNSHARE} -rn true` failed (exit code "
            f"{probe.returncode}): {probe.stderr.strip() or 'no message'}. Containers and hardened kernels often "
            f"refuse them (docker's default seccomp profile, kernel.unprivileged_userns_clone=0, "
            f"user.max_user_namespaces=0). {hint}")
    setup = f"{shlex.quote(IP)} link set lo up && {shlex.quote(TC)} qdisc add dev lo root {_tbf_args(1000.0)}"
    probe = _run([UNSHARE, "-rn", "sh", "-c", setup])
    if probe.returncode != 0:
        raise NetemUnavailable(
            f"network emulation needs `ip` and `tc` to shape lo inside a network namespace, but `{setup}` failed "
            f"(exit code {probe.returncode}): {probe.stderr.strip() or 'no message'} (is the kernel's sch_tbf "
            f"qdisc available?). {hint}")
    _available.add(key)


def _tbf_args(lo_rate_mbit: float) -> str:
    bytes_per_s = lo_rate_mbit * 1e6 / 8
    burst = max(BURST_MIN_BYTES, int(bytes_per_s * BURST_S))
    limit = max(LIMIT_MIN_BYTES, int(bytes_per_s * LIMIT_S))
    return f"tbf rate {max(1, round(lo_rate_mbit * 1000))}kbit burst {burst} limit {limit}"


# --------------------------------------------------------------------------- JSON for the helper

def _encode(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return {"__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("network emulation passes arguments as JSON: dict keys must be strings")
        return {k: _encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"network emulation passes launch arguments as JSON; cannot send {type(value).__name__}")


def _import(qualified: str):
    module, _, name = qualified.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "__dataclass__" in value:
            return _import(value["__dataclass__"])(**{k: _decode(v) for k, v in value["fields"].items()})
        if "__tuple__" in value:
            return tuple(_decode(v) for v in value["__tuple__"])
        return {k: _decode(v) for k, v in value.items()}
    return value


def _plain(value):
    """json.dump fallback for results: numpy/torch scalars become Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"rank result of type {type(value).__name__} is not JSON-serializable")


# --------------------------------------------------------------------------- parent side

def launch_in_namespace(fn, world_size: int, backend: str, args, timeout_s: float, threads: int,
                        deadline_s: float | None, rate_mbit: float) -> list:
    """Spawned launch inside a fresh namespace whose lo gives every rank ``rate_mbit``; results by rank."""
    require()
    if fn.__module__ == "__main__":
        raise TypeError(f"network emulation imports fn by name; move {fn.__qualname__} out of the __main__ script")
    request = dict(fn=f"{fn.__module__}:{fn.__qualname__}", args=_encode(list(args)), world_size=world_size,
                   backend=backend, timeout_s=timeout_s, threads=threads, deadline_s=deadline_s,
                   rate_mbit=rate_mbit, sys_path=sys.path, cwd=os.getcwd())
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    if "TORCH_CPP_LOG_LEVEL" not in env:
        # The helper hosts the rendezvous store, whose server warns that it cannot reverse-resolve its clients
        # (no DNS in the namespace). Quiet the helper only; it unsets this before spawning the ranks.
        env.update(TORCH_CPP_LOG_LEVEL="ERROR", _DDP_NETEM_UNSET_LOG_LEVEL="1")
    with tempfile.TemporaryDirectory(prefix="ddp-netem-") as tmp:
        req, res = Path(tmp, "request.json"), Path(tmp, "result.json")
        req.write_text(json.dumps(request))
        sys.stdout.flush()
        proc = subprocess.Popen([UNSHARE, "-rn", sys.executable, "-c", _HELPER_MAIN, str(req), str(res)],
                                env=env, start_new_session=True)  # own process group: killed as a whole
        code = None
        try:
            code = proc.wait(timeout=None if deadline_s is None else deadline_s + 60)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None or code is None:
                _kill_group(proc)
        answer = json.loads(res.read_text()) if res.exists() and res.stat().st_size else None
    if answer is None:
        why = "ran past its deadline" if code is None else f"exited with code {code} without an answer"
        raise LaunchError(f"the network-emulation helper (`unshare -rn python -c ...harness.netem._helper`) {why}")
    if answer["status"] == "setup_error":
        raise NetemUnavailable(answer["message"])
    if answer["status"] != "ok":
        raise LaunchError(answer["message"])
    dropped = answer.get("dropped", 0)
    if dropped:
        print(f"[netem] lo dropped {dropped} packet(s) at {rate_mbit:g} Mbit/s per rank; TCP retransmissions "
              f"may have inflated the times", file=sys.stderr)
    return answer["results"]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the helper and every rank it spawned
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# --------------------------------------------------------------------------- helper (inside the namespace)

_HELPER_MAIN = "import sys; from harness.netem import _helper; sys.exit(_helper(*sys.argv[1:3]))"

def _shape_loopback(lo_rate_mbit: float) -> None:
    shape = [TC, "qdisc", "add", "dev", "lo", "root", *_tbf_args(lo_rate_mbit).split()]
    for cmd in ([IP, "link", "set", "lo", "up"], shape):
        done = _run(cmd)
        if done.returncode != 0:
            raise NetemUnavailable(f"`{' '.join(cmd)}` failed inside the network namespace (exit code "
                                   f"{done.returncode}): {done.stderr.strip() or 'no message'}")


def _dropped() -> int:
    out = _run([TC, "-s", "qdisc", "show", "dev", "lo"]).stdout
    return sum(int(n) for n in re.findall(r"dropped (\d+)", out))


def _helper(request_path: str, result_path: str) -> int:
    req = json.loads(Path(request_path).read_text())
    sys.path[:0] = [p for p in req["sys_path"] if p not in sys.path]
    os.chdir(req["cwd"])

    def answer(**out) -> None:
        Path(result_path).write_text(json.dumps(out, default=_plain))

    try:
        _shape_loopback(req["rate_mbit"] * req["world_size"])
    except (NetemUnavailable, OSError, subprocess.SubprocessError) as exc:
        answer(status="setup_error", message=str(exc))
        return 2
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # the only interface here; skips Gloo's hostname lookup
    if os.environ.pop("_DDP_NETEM_UNSET_LOG_LEVEL", None):  # torch is imported: the ranks log as usual
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    try:
        results = launch(_import(req["fn"]), req["world_size"], req["backend"], args=_decode(req["args"]),
                         timeout_s=req["timeout_s"], threads=req["threads"], deadline_s=req["deadline_s"])
    except LaunchError as exc:
        answer(status="launch_error", message=str(exc))
        return 1
    except Exception:  # noqa: BLE001 - reported to the parent as text
        answer(status="error", message=traceback.format_exc())
        return 1
    answer(status="ok", results=results, dropped=_dropped())
    return 0

