"""PNG plots (matplotlib, Agg backend, imported only here and only when asked)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starvecheck.core import outputs
from starvecheck.core.model import StageResult
from starvecheck.core.report import Report
from starvecheck.core.schema.figure import value_of
from starvecheck.core.schema.loader import LoaderFigures, Recommended, StarveParameters
from starvecheck.core.schema.loader import Parameters as LoaderParameters
from starvecheck.core.schema.pad import Cost, PaddedLayout, PaddedRun, PadFigures
from starvecheck.core.schema.pad import Parameters as PadParameters
from starvecheck.core.schema.samples import Cache, Layout
from starvecheck.core.schema.starve import Quantity, StarveFigures
from starvecheck.core.signals import importing

if TYPE_CHECKING:
    import numpy as np


def _share(cost: Cost | None) -> str:
    """A strategy's real tokens per computed position, as a share; n/a where unread."""
    eff = value_of(cost.efficiency if cost is not None else None)
    return "n/a" if eff is None else f"{eff:.1%}"


def _pyplot() -> Any:
    """matplotlib's pyplot on Agg (files, no display), imported with signals held.

    Where its configuration directory cannot be made (HOME a file, or read-only),
    matplotlib makes a temporary one, removed at exit, and says so in two warnings on
    stderr at import: for one PNG that is no news, so its warnings are held back then."""
    import logging

    log = logging.getLogger("matplotlib")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with importing("matplotlib"):
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
    finally:
        log.setLevel(level)
    return plt


def _save(fig: Any, path: str) -> None:
    """Render in memory, then write the file whole (core/outputs.py): Ctrl-C while
    drawing leaves no half-written PNG behind, and one during the short write waits for
    it to end."""
    import io

    plt = _pyplot()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png")
    finally:
        plt.close(fig)
    outputs.write("--plot", path, path, buf.getvalue())  # no link followed, never blocking


def sweep_plot(result: StageResult, path: str) -> None:
    """GPU idle share against num_workers: measured, and both models' predictions."""
    plt = _pyplot()

    g = float(result.parameters.step_ms or 0.0)
    series: dict[str, dict[int, float]] = {"measured": {}, "CPU-aware model": {}, "sleep model": {}}
    models = {
        Quantity.PREDICTED_WAIT_MS: "CPU-aware model",
        Quantity.SLEEP_MODEL_WAIT_MS: "sleep model",
    }
    for p in result.records(StarveFigures).points:
        idle = p.value(Quantity.IDLE_SHARE)
        if idle is not None:
            series["measured"][p.workers] = idle
        for quantity, label in models.items():
            wait = p.value(quantity)
            if wait is not None:
                share = wait / (wait + g) if wait + g > 0 else 0.0
                series[label][p.workers] = share
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
    cpus = result.parameters.effective_cpus
    if cpus:
        ax.axvline(cpus, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"{cpus} effective CPUs", (cpus, 0.95), fontsize=8, color="grey")
    ax.set_xticks(sorted(series["measured"]))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("GPU idle share")
    ax.set_ylim(0, 1)
    ax.set_title(
        f"starvecheck starve: D={result.parameters.read(StarveParameters).sample_cpu_ms} ms, "
        f"B={result.parameters.batch_size}, G={g:g} ms"
    )
    ax.legend()
    fig.tight_layout()
    _save(fig, path)


def loader_plot(result: StageResult, path: str) -> None:
    """Samples/s against num_workers, one line per layout and cache state, with the
    effective CPUs and each layout's recommended count marked."""
    plt = _pyplot()

    figures = result.records(LoaderFigures)
    recommended = Recommended.from_metrics(result.figures).layouts
    series: dict[tuple[Layout, Cache], dict[int, float]] = {}
    for p in figures.points:
        if p.rate is not None and p.rate.value is not None:
            series.setdefault((p.layout, p.cache), {})[p.workers] = p.rate.value
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    colours: dict[str, str] = {}
    for (layout, temp), points in series.items():
        xs = sorted(points)
        (line,) = ax.plot(
            xs,
            [points[x] for x in xs],
            marker="o",
            linestyle="-" if temp is Cache.COLD else "--",
            color=colours.get(layout),
            label=f"{layout} ({temp})",
        )
        colours[layout] = line.get_color()
        rec = recommended.get(layout)
        # The cache state the recommendation was made in.
        judged_in = (figures.curve(layout) or ("",))[0]
        if rec is not None and rec in points and temp == judged_in:
            ax.plot(
                [rec],
                [points[rec]],
                marker="*",
                markersize=14,
                color=line.get_color(),
                linestyle="none",
            )
    cpus = result.parameters.effective_cpus
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
        f"starvecheck loader: batch {result.parameters.batch_size}, "
        f"{result.parameters.read(LoaderParameters).sample_size_bytes / 1024:g} KiB samples "
        "(★ recommended)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


MAX_PLOT_ROWS = 64
MAX_PLOT_COLUMNS = 8192
_NOT_COMPUTED, _PADDING, _TOKEN_A, _TOKEN_B = 0, 1, 2, 3


def _median_batch(layout: PaddedLayout, lengths: np.ndarray) -> int:
    """The batch whose share of real tokens is the median one: a typical batch, not
    the first (length grouping puts the longest sample first on purpose)."""
    import numpy as np

    per_row = layout.row_tokens(lengths)
    starts = np.arange(0, layout.rows, layout.rows_per_batch)
    tokens = np.add.reduceat(per_row, starts)
    positions = np.add.reduceat(layout.row_len, starts)
    share = tokens / np.maximum(positions, 1)
    full = share[:-1] if share.size > 1 and layout.rows % layout.rows_per_batch else share
    ranked = np.argsort(full, kind="stable")
    return int(ranked[(ranked.size - 1) // 2])


def _batch_image(layout: PaddedLayout, lengths: Any, batch: int, width: int) -> Any:
    """Rows of one batch as cells: not computed, padding, or a sample's tokens. Past
    MAX_PLOT_COLUMNS positions a cell stands for several (a long context stays small
    in memory); a sample or padding run covers every cell it touches."""
    import numpy as np

    scale = -(-width // MAX_PLOT_COLUMNS)
    r0 = batch * layout.rows_per_batch
    r1 = min(layout.rows, r0 + min(layout.rows_per_batch, MAX_PLOT_ROWS))
    image = np.full((r1 - r0, -(-width // scale)), _NOT_COMPUTED, np.int8)
    for r in range(r0, r1):
        image[r - r0, : -(-int(layout.row_len[r]) // scale)] = _PADDING
    i0, i1 = np.searchsorted(layout.row, [r0, r1])
    used: dict[int, int] = {}
    for k, (sample, row) in enumerate(
        zip(layout.order[i0:i1].tolist(), layout.row[i0:i1].tolist(), strict=True)
    ):
        at = used.get(row, 0)
        end = at + int(lengths[sample])
        image[row - r0, at // scale : -(-end // scale)] = _TOKEN_A if k % 2 == 0 else _TOKEN_B
        used[row] = end
    return image


def pad_plot(run: PaddedRun, path: str) -> None:
    """One heatmap per strategy: a typical batch, rows by positions, real tokens (two
    shades, so packed samples show their boundaries) against padding."""
    plt = _pyplot()
    with importing("matplotlib"):
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch

    from starvecheck.core.strategies import LABELS

    params = run.result.parameters.read(PadParameters)
    figures = run.result.records(PadFigures)
    layouts = run.layouts
    context = params.context
    width = max([context] + [int(lay.row_len.max()) for lay in layouts.values() if lay.rows])
    colors = ["#ffffff", "#e4572e", "#1f5f8b", "#7cb8de"]
    cmap = ListedColormap(colors)
    fig, axes = plt.subplots(
        len(layouts),
        1,
        figsize=(12, 1.25 * len(layouts) + 1.0),
        dpi=110,
        sharex=True,
        squeeze=False,
    )
    for ax, (name, lay) in zip(axes[:, 0], layouts.items(), strict=True):
        batch = _median_batch(lay, run.lengths) if lay.rows else 0
        image = _batch_image(lay, run.lengths, batch, width)
        ax.imshow(
            image,
            cmap=cmap,
            vmin=0,
            vmax=3,
            aspect="auto",
            interpolation="nearest",
            extent=(0, width, image.shape[0], 0),  # x in tokens, whatever the cell size
        )
        eff = figures.cost(name)
        shown = image.shape[0]
        rows = f"{shown} rows" + (
            f" of {lay.rows_per_batch}" if shown < min(lay.rows_per_batch, lay.rows) else ""
        )
        current = " (current)" if name == params.current else ""
        ax.set_title(
            f"{name}{current}: {LABELS[name]}, {_share(eff)} real tokens over the epoch"
            f"  ·  batch {batch + 1:,} of {lay.batches:,} (median), {rows}",
            loc="left",
            fontsize=9,
        )
        ax.set_yticks([])
        ax.set_ylabel("rows", fontsize=8)
    axes[-1, 0].set_xlabel("position in row (tokens)")
    axes[-1, 0].set_xlim(0, width)
    fig.legend(
        handles=[
            Patch(color=colors[2], label="real tokens (shades alternate per sample)"),
            Patch(color=colors[1], label="padding (computed, wasted)"),
            Patch(facecolor=colors[0], edgecolor="#999999", label="not computed"),
        ],
        loc="upper right",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(
        f"starvecheck pad: {value_of(figures.lengths.samples) or 0:,.0f} samples, "
        f"context {context:,}, batch {params.batch_size}",
        x=0.01,
        ha="left",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    _save(fig, path)


def chain_plot(report: Report, path: str) -> None:
    """doctor's chain at a glance: each link's capacity as a multiple of what the GPU
    consumes (a log scale: links differ by orders of magnitude), the demand as the line
    at 1x, the weakest link marked, the sentence on its fix as the title. A link not
    measured is drawn hatched, with why."""
    plt = _pyplot()

    links = list(report.chain)
    demand = next((x.demand for x in links if x.demand), None)
    scale = demand or 1.0

    def height(capacity: float) -> float:
        return capacity / scale

    values = [height(x.capacity) for x in links if x.capacity is not None and x.capacity > 0]
    lo = min([*values, 1.0]) / 3
    hi = max([*values, 1.0]) * 6
    fig, ax = plt.subplots(figsize=(7.2, 4.4), dpi=120)
    ax.set_yscale("log")
    for i, x in enumerate(links):
        if x.capacity is None or x.capacity <= 0:
            ax.bar(i, hi, bottom=lo, color="none", edgecolor="#bbbbbb", hatch="//", linewidth=0.8)
            why = _wrap(x.reason or "not measured", 18)
            middle = (lo * hi) ** 0.5 * 3  # above the demand line, clear of it
            ax.annotate(why, (i, middle), ha="center", va="bottom", fontsize=7, color="grey")
            continue
        v = height(x.capacity)
        weakest = x.link == report.weakest_link
        color = "#d62728" if weakest else ("#ff7f0e" if demand and v < 1 else "#1f77b4")
        ax.bar(i, v - lo, bottom=lo, color=color, edgecolor="black", linewidth=0.6)
        label = f"{x.capacity:,.0f}/s" + (f"\n{v:,.2f}x" if demand else "")
        ax.annotate(label, (i, v), ha="center", va="bottom", fontsize=8)
    if demand:
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1.0)
        ax.annotate(
            f"GPU demand: {demand:,.0f} samples/s",
            (-0.45, 1.0),
            ha="left",
            va="bottom",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
        ax.set_ylabel("capacity / GPU demand (log)")
    else:
        ax.set_ylabel("samples/s (log)")
    names = [f"{x.link}\n(weakest)" if x.link == report.weakest_link else x.link for x in links]
    ax.set_xticks(range(len(links)), names)
    ax.set_ylim(lo, hi)
    title = "starvecheck doctor: each link of the chain against the GPU's demand"
    if report.weakest_summary:
        title += "\n" + _wrap(report.weakest_summary, 95)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    _save(fig, path)


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)[:3])
