"""Network emulation for spawned CPU ranks: each rank in its own network namespace behind a shaped link (tc netem
and tbf), the root helper that builds them, the wire checks, and ``net=auto``'s rate. Imports harness.launch and
harness.workloads (the models and the clock ``net=auto`` times backward with)."""
