"""PNG plots (matplotlib, Agg backend, imported only here and only when asked)."""

from __future__ import annotations

import re

from starvecheck.model import StageResult


def sweep_plot(result: StageResult, path: str) -> None:
    """GPU idle share against num_workers: measured, and both models' predictions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = float(result.parameters.get("step_ms", 0.0))
    series: dict[str, dict[int, float]] = {"measured": {}, "CPU-aware model": {}, "sleep model": {}}
    for m in result.metrics:
        match = re.fullmatch(r"(idle_share|predicted_wait_ms|sleep_model_wait_ms)\.w(\d+)", m.name)
        if match is None or m.value is None:
            continue
        w = int(match.group(2))
        if match.group(1) == "idle_share":
            series["measured"][w] = m.value
        else:
            share = m.value / (m.value + g) if m.value + g > 0 else 0.0
            key = "CPU-aware model" if match.group(1) == "predicted_wait_ms" else "sleep model"
            series[key][w] = share
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, points in series.items():
        xs = sorted(points)
        ax.plot(
            xs,
            [points[x] for x in xs],
            marker="o" if label == "measured" else None,
            linestyle="-" if label == "measured" else "--",
            label=label,
        )
    cpus = result.parameters.get("effective_cpus")
    if cpus:
        ax.axvline(cpus, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"{cpus} effective CPUs", (cpus, 0.95), fontsize=8, color="grey")
    ax.set_xticks(sorted(series["measured"]))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("GPU idle share")
    ax.set_ylim(0, 1)
    ax.set_title(
        f"starvecheck starve: D={result.parameters.get('sample_cpu_ms')} ms, "
        f"B={result.parameters.get('batch_size')}, G={g:g} ms"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
