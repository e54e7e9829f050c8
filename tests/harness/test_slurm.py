"""The project's sbatch script through real `sbatch` on a one-machine SLURM cluster the test sets up itself
(slurmctld + slurmd, munge for auth; Debian's `slurm-wlm` and `munge`): its rows equal a spawned run's."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import TrainConfig, load_results, point_id, run_point
from harness.launch.spawn import find_free_port

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("slurmctld", "slurmd", "sbatch", "sinfo", "munged", "munge")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starting slurmctld, slurmd and munged needs root")


def _missing() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _install() -> None:
    """Debian's packages, installed here if missing (seconds); skip with the reason where that fails."""
    if not _missing():
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        out = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"could not install slurm-wlm and munge: {exc}")
    if _missing():
        pytest.skip(f"apt-get install slurm-wlm munge did not provide {_missing()}: {out.stderr[-500:]}")


POINT = dict(
    model="small",
    impl="ours",
    backend="gloo",
    profile="cpu",
    world_size=2,
    bucket_cap_mb=25.0,
    iters=3,
    warmup=1,
    timeout_s=600.0,
)  # floats as the command line parses them (ids hash the values)


def _munge_running() -> bool:
    return subprocess.run(["munge", "-n"], capture_output=True).returncode == 0


def _start_munge() -> None:
    """munged as its own user, with the directories Debian's package expects (no init system here)."""
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True, capture_output=True)
    for _ in range(50):
        if _munge_running():
            return
        time.sleep(0.1)
    raise RuntimeError("munged did not start")


def _write_conf(root: Path, host: str) -> Path:
    """slurm.conf for one node, this machine with all its CPUs, its state and pid files under ``root``."""
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=ddprepro",
                f"SlurmctldHost={host}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                f"StateSaveLocation={root}/state",
                f"SlurmdSpoolDir={root}/spool",
                f"SlurmctldPidFile={root}/slurmctld.pid",
                f"SlurmdPidFile={root}/slurmd.pid",
                f"SlurmctldPort={find_free_port()}",
                f"SlurmdPort={find_free_port()}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
                "SchedulerType=sched/builtin",
                "SelectType=select/cons_tres",
                "ReturnToService=2",
                "MpiDefault=none",
                f"NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    return conf


def _wait_until_idle(env: dict, root: Path) -> None:
    for _ in range(100):
        idle = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env).stdout
        if "idle" in idle:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the node never became idle: {idle!r}; {(root / 'slurmctld.log').read_text()[-2000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A one-node cluster on this machine: its config, slurmctld and slurmd on free ports; torn down after."""
    _install()
    if not _munge_running():
        _start_munge()
    root = tmp_path_factory.mktemp("slurm")
    host = socket.gethostname()
    (root / "state").mkdir()
    (root / "spool").mkdir()
    conf = _write_conf(root, host)
    env = dict(os.environ, SLURM_CONF=str(conf))
    for daemon in ("slurmctld", "slurmd"):
        subprocess.run([daemon, "-f", str(conf), "-L", str(root / f"{daemon}.log")], check=True, env=env)
    try:
        _wait_until_idle(env, root)
        yield env, root
    finally:
        for daemon in ("slurmd", "slurmctld"):
            pid = root / f"{daemon}.pid"
            if pid.exists():
                subprocess.run(["kill", pid.read_text().strip()], capture_output=True)


def test_the_sbatch_script_runs_a_point_like_a_spawned_run(cluster, tmp_path):
    env, root = cluster
    results = tmp_path / "results"
    job = subprocess.run(
        [
            "sbatch",
            "--wait",
            "--nodes=1",
            "--gpus-per-node=0",
            f"--cpus-per-task={os.cpu_count()}",
            f"--output={tmp_path}/job-%j.out",
            "--export=ALL,GPUS=2,BACKEND=gloo,PROFILE=cpu,MODEL=small,ITERS=3,"
            f"WARMUP=1,EXPERIMENT=slurm,RDZV_PORT={find_free_port()},DDP_REPRO_RESULTS={results}",
            "harness/slurm_example.sbatch",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = "".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert job.returncode == 0, f"{job.stdout}{job.stderr}\n{log[-3000:]}"
    # every rank ended its group before exit (harness.launch.groups.end_rank): no thread left to abort it, nothing said
    for sign in ("terminate called", "Fatal Python error", "still run after destroy_process_group"):
        assert sign not in log, log[-3000:]
    stored = load_results("slurm", results)
    cfg = TrainConfig(**POINT, net="loopback")
    assert set(stored["point_id"]) == {point_id(cfg)}  # the same point a spawned run stores
    assert (stored["error"].fillna("") == "").all()
    spawned = pd.DataFrame(run_point(cfg))
    keys = ["rank", "iteration"]
    merged = stored.merge(spawned, on=keys, suffixes=("_slurm", "_spawned"))
    assert len(merged) == len(spawned) == 2 * 3
    pd.testing.assert_series_equal(
        merged["loss_slurm"].astype(float), merged["loss_spawned"].astype(float), check_names=False, rtol=1e-5
    )
