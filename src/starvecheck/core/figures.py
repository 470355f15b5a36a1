"""Reading figures out of stage results, where judging and showing need the same view
of them (a curve, the layout a report leads with). Pure selection: no judgement, no
thresholds; advice/ and render/ both import it, stages/ never need to. The curves
themselves are loader's record's (core/schema/loader.LoaderFigures)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.loader import Curve, LoaderFigures
from starvecheck.core.schema.samples import Cache, Layout, enum_of

# The layout a loader report leads with, in this order of preference where measured.
HEADLINE_ORDER = (Layout.MDS, Layout.SHARD, Layout.FILES, Layout.SMALL_FILES)


def _figures(loader: StageResult | Sequence[Metric]) -> LoaderFigures:
    if isinstance(loader, StageResult):
        return loader.records(LoaderFigures)
    return LoaderFigures.from_metrics(loader)


def loader_curve(loader: StageResult | Sequence[Metric], layout: str) -> Curve | None:
    """LoaderFigures.curve, for a result or its metrics."""
    known = enum_of(Layout, layout)
    return None if known is None else _figures(loader).curve(known)


def loader_rounds(
    loader: StageResult | Sequence[Metric], layout: str, cache: str
) -> dict[int, tuple[float, ...]]:
    """LoaderFigures.rounds, for a result or its metrics."""
    known, temp = enum_of(Layout, layout), enum_of(Cache, cache)
    return {} if known is None or temp is None else _figures(loader).rounds(known, temp)


def loader_curves(loader: StageResult | Sequence[Metric]) -> dict[Layout, Curve]:
    """Every measured layout's curve (LoaderFigures.curves), in the order measured."""
    return _figures(loader).curves()


def headline(recommended: Mapping[Layout, int] | Mapping[str, int]) -> Layout | None:
    """The layout a loader report leads with, among those with a recommendation."""
    return next((name for name in HEADLINE_ORDER if name in recommended), None)
