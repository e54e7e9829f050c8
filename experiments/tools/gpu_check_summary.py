"""``make gpu-check``'s ``summary.md``: each step's result as a markdown table, written after every step."""

from __future__ import annotations

from harness.launch import env


def _parity_lines(r: dict) -> list[str]:
    lines = ["| case | worst | bound |", "|---|---|---|"]
    lines += [f"| {c} | {v:.2e} | {r['bound'][c]:.0e} |" for c, v in r["worst"].items()]
    return lines + [
        "",
        "**" + ("all equal within bounds" if not r["failed"] else f"DIFFERENT: {', '.join(r['failed'])}") + "**",
    ]


def _bench_lines(bench: dict) -> list[str]:
    lines = [
        "| model | cap MiB | ours ms | torch ms | ours / torch | interval | A/A | timing on/off |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in bench["summary"].to_dict("records"):
        lines.append(
            f"| {r['model']} | {r['bucket_cap_mb']:g} | {r['ours_ms']:.1f} | {r['torch_ms']:.1f} | "
            f"{r['paired_both']:.3f} | [{r['paired_both_ci_lo']:.3f}, {r['paired_both_ci_hi']:.3f}] | "
            f"{r['aa_ratio']:.3f} | {1 + r['timing_overhead_pct'] / 100:.3f} |"
        )
    lines += ["", "| model | comparison | pooled | interval |", "|---|---|---|---|"]
    return lines + [
        f"| {r['model']} | {r['comparison']} | {r['pooled_ratio']:.3f} | [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}] |"
        for r in bench["pooled"].to_dict("records")
    ]


def _fig7_lines(fig7: dict) -> list[str]:
    lines = ["| point | median ms | forward ms |", "|---|---|---|"]
    return lines + [f"| {k} | {v:.1f} | {fig7['forward_ms'][k]:.1f} |" for k, v in fig7["median_ms"].items()]


def _predict_lines(predictions: list[dict]) -> list[str]:
    lines = [
        "| model | cap MiB | predicted ms | of which DDP's host work | measured ms | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in predictions:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['cap']:g} | failed: {r['error']} | | | |")
        else:
            measured = "-" if r["measured_ms"] is None else f"{r['measured_ms']:.1f}"
            error = "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
            lines.append(
                f"| {r['model']} | {r['cap']:g} | {r['predicted_ms']:.1f} | {r['host_ms']:.1f} | {measured} | {error} |"
            )
    return lines


def _autotune_lines(rows: list[dict]) -> list[str]:
    lines = [
        "| model | settled on (MiB, per repetition) | iterations, at most | settled / best fixed | 25 MiB / best |",
        "|---|---|---|---|---|",
    ]
    return lines + [
        f"| {r['model']} | {r['settled_caps']} | {r['iterations_max']} | {r['settled_vs_best']:.3f} "
        f"[{r['settled_vs_best_lo']:.3f}, {r['settled_vs_best_hi']:.3f}] ({r['best_fixed_mb']:g} MiB) | "
        f"{r['default_vs_best']:.3f} [{r['default_vs_best_lo']:.3f}, {r['default_vs_best_hi']:.3f}] |"
        for r in rows
    ]


SECTIONS = {
    "parity": ("1. Ours against torch's DDP (largest relative difference, gradients and final state)", _parity_lines),
    "bench": ("2. Bench: ours / torch per round (median, 95% interval); instrumentation cost", _bench_lines),
    "fig7": ("3. fig7 smoke (ours, one repetition: median of the slowest rank's iteration)", _fig7_lines),
    "predict": ("4. predict beside fig7's measurement", _predict_lines),
    "autotune": ("5. bucket_cap_mb='auto' beside every fixed cap (make autotune)", _autotune_lines),
}


def summary_markdown(cfg, p: dict, done: dict, seconds: float) -> str:
    """The summary of the steps in ``done`` (a step's result, or ``{"error": ...}`` where it raised); the steps not
    reached yet are named, so a summary written after each step says how far an interrupted check got."""
    import torch

    device = torch.cuda.get_device_name(0) if cfg.device == "cuda" else "CPU (a rehearsal: not a GPU result)"
    lines = [
        f"# gpu-check: {device}",
        "",
        f"torch {torch.__version__}, {env.cuda_devices() if cfg.device == 'cuda' else 0} GPU(s), "
        f"bench and fig7 on {p['backend']} x {p['world_size']}, comparison on {p['parity_backend']} x "
        f"{p['parity_world_size']}; {seconds:.0f} s.",
    ]
    for step, (title, body) in SECTIONS.items():  # every step, in the order they run
        lines += ["", f"## {title}", ""]
        result = done.get(step)
        if step not in cfg.steps:
            lines.append("(not run: not in --steps)")
        elif result is None:
            lines.append("(not reached)")
        elif isinstance(result, dict) and "error" in result:
            lines.append(f"**failed**: {result['error']}")
        else:
            lines += body(result)
    return "\n".join(lines) + "\n"
