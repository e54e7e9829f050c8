"""Run a function on several Gloo ranks in spawned processes, with a deadline, and return each rank's result.

A rank that raises or hangs fails the test instead of hanging CI: exceptions come back as text, and the parent
kills every rank once the deadline passes.
"""
from __future__ import annotations

import datetime
import os
import socket
import traceback

import torch.multiprocessing as mp

GROUP_TIMEOUT = datetime.timedelta(seconds=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, backend, fn, args, queue):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT)
        queue.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class RankFailed(RuntimeError):
    pass


def run_ranks(fn, world_size: int, *args, timeout: float = 180, expect_errors: bool = False,
              backend: str = "gloo") -> list:
    """Results of ``fn(rank, world_size, *args)`` per rank; with ``expect_errors`` the tracebacks instead."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, backend, fn, args, queue), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, object]] = {}
    try:
        for _ in range(world_size):
            rank, ok, value = queue.get(timeout=timeout)
            results[rank] = (ok, value)
    except Exception as e:  # queue.Empty: some rank hung past the deadline
        raise RankFailed(f"ranks {sorted(set(range(world_size)) - set(results))} gave no result within "
                         f"{timeout} s") from e
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if expect_errors:
        return [None if ok else value for ok, value in (results[r] for r in range(world_size))]
    failed = {r: v for r, (ok, v) in results.items() if not ok}
    if failed:
        raise RankFailed("\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(failed.items())))
    return [results[r][1] for r in range(world_size)]
