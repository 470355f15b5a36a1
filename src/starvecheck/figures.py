"""Reading figures out of stage results by their labels, where judging and showing
need the same view of them (a curve, a table's rows). Pure selection: no
judgement, no thresholds; advice/ and render/ both import it, stages/ never need to.
"""

from __future__ import annotations

from starvecheck.model import StageResult


def loader_curve(loader: StageResult, layout: str) -> tuple[str, dict[int, float]] | None:
    """The cache state a layout is judged in and its samples/s by num_workers: cold
    where every cold point was measured (first epochs, datasets larger than memory),
    else warm. None when neither is complete."""
    for cache in ("cold", "warm"):
        points = loader.select(quantity="samples_per_s", layout=layout, cache=cache)
        if points and all(m.value is not None for m in points):
            curve = {int(m.labels["workers"]): m.value for m in points if m.value is not None}
            return cache, dict(sorted(curve.items()))
    return None


def loader_layouts(loader: StageResult) -> list[str]:
    """The layouts a loader run measured, in the order it measured them."""
    seen: list[str] = []
    for m in loader.select(quantity="samples_per_s"):
        layout = str(m.labels.get("layout"))
        if layout not in seen:
            seen.append(layout)
    return seen
