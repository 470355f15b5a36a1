"""JSON export: the Report as `Report.to_dict()` (see core/report.py for the schema versions)."""

from __future__ import annotations

import json

from starvecheck.core.report import Report


def serialize(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"
