"""Reading figures out of stage results by their labels, where judging and showing
need the same view of them (a curve, a table's rows). Pure selection: no
judgement, no thresholds; advice/ and render/ both import it, stages/ never need to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from starvecheck.core.metric import Metric, select
from starvecheck.core.model import StageResult
from starvecheck.core.schema.common import SAMPLES_PER_S

# The layout a loader report leads with, in this order of preference where measured.
HEADLINE_ORDER = ("mds", "shard", "files", "small_files")

Curve = tuple[str, dict[int, float]]  # (cache state, samples/s by num_workers)


def _metrics(loader: StageResult | Sequence[Metric]) -> Sequence[Metric]:
    return loader.metrics if isinstance(loader, StageResult) else loader


def loader_curve(loader: StageResult | Sequence[Metric], layout: str) -> Curve | None:
    """The cache state a layout is judged in and its samples/s by num_workers: cold
    where every cold point was measured (first epochs, datasets larger than memory),
    else warm. None when neither is complete."""
    metrics = _metrics(loader)
    for cache in ("cold", "warm"):
        points = [
            m
            for m in select(metrics, quantity=SAMPLES_PER_S, layout=layout, cache=cache)
            if "workers" in m.labels
        ]
        if points and all(m.value is not None for m in points):
            curve = {int(m.labels["workers"]): m.value for m in points if m.value is not None}
            return cache, dict(sorted(curve.items()))
    return None


def loader_rounds(
    loader: StageResult | Sequence[Metric], layout: str, cache: str
) -> dict[int, tuple[float, ...]]:
    """A layout's samples/s by num_workers in one cache state, each count's figures in
    run order: counts read in rounds pair run by run (stages/loader/epochs.py)."""
    metrics = _metrics(loader)
    return {
        int(m.labels["workers"]): tuple(m.values) if m.values else (m.value,)
        for m in select(metrics, quantity=SAMPLES_PER_S, layout=layout, cache=cache)
        if "workers" in m.labels and m.value is not None
    }


def loader_curves(loader: StageResult | Sequence[Metric]) -> dict[str, Curve]:
    """Every measured layout's curve (loader_curve), in the order they were measured."""
    metrics = _metrics(loader)
    layouts: list[str] = []
    for m in select(metrics, quantity=SAMPLES_PER_S):
        layout = str(m.labels.get("layout"))
        if "workers" in m.labels and layout not in layouts:
            layouts.append(layout)
    return {x: c for x in layouts if (c := loader_curve(metrics, x)) is not None}


def headline(recommended: Mapping[str, int]) -> str | None:
    """The layout a loader report leads with, among those with a recommendation."""
    return next((name for name in HEADLINE_ORDER if name in recommended), None)
