"""Our own bucketed DistributedDataParallel, after Li et al. (VLDB 2020) and today's torch DDP.

Depends on torch only. ``buckets`` assigns parameters to buckets (pure functions); ``reducer`` owns the hooks and
readiness, over ``bucket_store`` (the flat buckets, their views, and filling them), ``bucket_launch`` (the
collectives, in bucket order) and ``write_back`` (the wait and copy back into ``.grad``); ``distributed`` is the
module front-end, with ``construction`` (what it checks and settles first), ``outputs`` (what a forward returns),
``broadcast`` (parameter and buffer syncs) and ``join`` (uneven inputs); ``comm_hooks`` and ``process_groups`` are
the pluggable communication pieces, ``timing`` the per-iteration instrumentation, ``lifetime`` what makes the
process exit cleanly whatever the script does at its end (and what pickling drops); ``options`` the settings as one
object (:class:`DDPOptions`) and the constants they default to.
"""

from . import comm_hooks
from .buckets import Bucket, ParamSpec, assign_buckets, initial_buckets
from .comm_hooks import GradBucket
from .distributed import DistributedDataParallel
from .options import DEFAULT_BUCKET_CAP_MB, MIB, DDPOptions
from .process_groups import RoundRobinProcessGroup
from .timing import IterationTiming

__all__ = [
    "DistributedDataParallel",
    "DDPOptions",
    "DEFAULT_BUCKET_CAP_MB",
    "MIB",
    "RoundRobinProcessGroup",
    "IterationTiming",
    "Bucket",
    "ParamSpec",
    "assign_buckets",
    "initial_buckets",
    "comm_hooks",
    "GradBucket",
]
