"""The vocabulary every layer speaks: the result model (model.py, report.py, metric.py), units,
exit statuses, the console context, the rules measuring and judging share (criteria),
the batching strategies' names, reading figures by label (figures), and signals as
exceptions. Nothing here imports any other part of starvecheck."""
