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


def loader_plot(result: StageResult, path: str) -> None:
    """Samples/s against num_workers, one line per layout and cache state, with the
    effective CPUs and each layout's recommended count marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from starvecheck.stages.loader import curves

    series: dict[tuple[str, str], dict[int, float]] = {}
    for m in result.metrics:
        match = re.fullmatch(r"throughput\.([a-z_]+)\.(cold|warm)\.w(\d+)", m.name)
        if match and m.value is not None:
            series.setdefault((match[1], match[2]), {})[int(match[3])] = m.value
    judged = curves(result.metrics)  # the cache state each recommendation was made in
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    colours: dict[str, str] = {}
    for (layout, temp), points in series.items():
        xs = sorted(points)
        (line,) = ax.plot(
            xs,
            [points[x] for x in xs],
            marker="o",
            linestyle="-" if temp == "cold" else "--",
            color=colours.get(layout),
            label=f"{layout} ({temp})",
        )
        colours[layout] = line.get_color()
        rec = result.metric(f"recommended_num_workers.{layout}")
        judged_in = judged.get(layout, ("",))[0]
        if rec is not None and rec.value in points and temp == judged_in:
            ax.plot(
                [rec.value],
                [points[int(rec.value)]],
                marker="*",
                markersize=14,
                color=line.get_color(),
                linestyle="none",
            )
    cpus = result.parameters.get("effective_cpus")
    if cpus:
        ax.axvline(cpus, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(
            f"{cpus} effective CPUs",
            (cpus, 0),
            xytext=(3, 3),
            textcoords="offset points",
            fontsize=8,
            color="grey",
        )
    ax.set_xticks(sorted({w for points in series.values() for w in points}))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"starvecheck loader: batch {result.parameters.get('batch_size')}, "
        f"{result.parameters.get('sample_size_bytes', 0) / 1024:g} KiB samples (★ recommended)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
