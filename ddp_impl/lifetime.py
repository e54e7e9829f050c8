"""Why a process that used this DDP never aborts at exit, however its script ends.

A Gloo process group runs worker threads and an I/O thread, joined only when the group object is freed. A group
still alive when the interpreter finalizes can abort the process after all its work is done ("terminate called
without an active exception", SIGABRT): a worker dropping a finished collective's tensors takes the GIL, a thread
taking the GIL during finalization is ended with ``pthread_exit``, and that unwinding meets a noexcept destructor.
Three things keep a group alive past a script's last line:

1. ``torch.distributed.nn.functional``'s default arguments (``group=group.WORLD``), evaluated when that module is
   first imported; torch imports it with ``torch._dynamo``, e.g. when an optimizer is created. Imported while a
   group exists, it holds that group for good: ``destroy_process_group()`` cannot free it. :func:`unpin_defaults`
   puts back the ``None`` those defaults have when the module is imported before any group (the same meaning:
   the collectives then use the default group).
2. A DDP that still references its group: alive in a global, or in a reference cycle.
3. A group never destroyed (the script leaves it to the interpreter's exit).

At exit (``atexit``, registered when ``ddp_impl`` is imported, so it runs after the handlers a script registers
later) :func:`release_at_exit` undoes all three once a DDP of ours was built in the process: it unpins, drops the
groups of every live DDP, destroys the groups still there (no barrier: a peer that already left would make it
wait out the timeout) and collects garbage, so the groups' threads are joined while the interpreter is whole. A
process leaving on an uncaught exception keeps its groups (destroying waits for collectives a failed peer may
never finish; it has failed already). A group the script itself still references at exit (a ``new_group()`` in a
global, a comm hook's state it keeps) stays alive: only the script can drop that reference.
"""

from __future__ import annotations

import atexit
import gc
import inspect
import sys
import weakref

import torch.distributed as dist

_live: weakref.WeakSet = weakref.WeakSet()  # every DDP of ours not yet freed
_used = False  # a DDP of ours was built in this process: the exit is then ours to make safe


def unpin_defaults() -> None:
    """Replace the process groups that ``torch.distributed.nn.functional``'s defaults captured with ``None``."""
    functional = sys.modules.get("torch.distributed.nn.functional")
    if functional is None:  # not imported yet: it will capture whatever group exists when it is
        return
    for fn in vars(functional).values():
        defaults = getattr(fn, "__defaults__", None) if inspect.isfunction(fn) else None
        if defaults and any(isinstance(d, dist.ProcessGroup) for d in defaults):
            fn.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) else d for d in defaults)


def track(ddp) -> None:
    """Called by each DDP as it is built: unpin now (a group the script destroys is then freed with its last
    DDP), and remember the DDP, whose groups the exit drops."""
    global _used
    _used = True
    _live.add(ddp)
    unpin_defaults()


def exiting_on_exception() -> bool:
    """At exit: whether the program is leaving on an uncaught exception (the interpreter has set ``sys.last_*``)."""
    return getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None


def release_at_exit() -> None:
    """The exit's part (see the module docstring); does nothing in a process that built no DDP of ours."""
    if not _used:
        return
    failing = exiting_on_exception()
    try:
        unpin_defaults()
        for ddp in list(_live):
            ddp.release_groups()
        if not failing and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - a failing teardown must not turn a finished run into a failure
        print(f"[ddp_impl] releasing the process groups at exit failed: {exc}", file=sys.stderr)
    gc.collect()


atexit.register(release_at_exit)


class Picklable:
    """What a DDP drops when pickled (``torch.save``, ``copy.deepcopy``) and rebuilds when unpickled, as torch's DDP:
    its process groups and reducer; and :meth:`release_groups`, which :func:`release_at_exit` calls."""

    def __getstate__(self):
        if self.process_group is not dist.group.WORLD:
            raise RuntimeError(
                "pickling DistributedDataParallel (torch.save, copy.deepcopy) is only supported "
                "with the default process group, as in torch: save model.module instead"
            )
        state = dict(self.__dict__)
        for key in ("process_group", "_primary", "reducer", "_join_flag"):
            state.pop(key, None)
        if state.get("_tuner") is not None:  # a search not settled: the copy starts its own (autotune.restart)
            state["_tuner"] = True
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.process_group = self._primary = dist.group.WORLD
        self.reducer = self._make_reducer()
        if self._tuner is not None:
            from . import autotune

            autotune.restart(self)
        if self._comm_hook is not None:
            self.reducer.comm_hook, self.reducer.comm_state = self._comm_hook
        track(self)

    def release_groups(self) -> None:
        """Drop every reference this DDP holds to a process group, so that destroying the groups frees them
        (``ddp_impl.lifetime``, at exit); it cannot communicate afterwards."""
        self.process_group = self._primary = None
        self.__dict__.pop("_join_flag", None)  # a join context's pending allreduce
        reducer = getattr(self, "reducer", None)
        if reducer is not None:
            reducer.group = reducer.comm_state = reducer._used_work = None
            reducer._futures, reducer._bucket_groups = [], []
        if self._comm_hook is not None:
            self._comm_hook = (self._comm_hook[0], None)
