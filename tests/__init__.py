"""The tests, one folder per package (ddp_impl, harness, simulator, experiments), plus the house's own checks
(layout, lint, documented commands) and ``make stress``; multi-process tests spawn Gloo ranks with timeouts."""
