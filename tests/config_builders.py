"""Pipeline configs for unit tests, as dicts to change before ``parse_config``."""

from __future__ import annotations

import copy
from typing import Any

MINIMAL: dict[str, Any] = {
    "privacy": {"total_epsilon": 2.0},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 4}],
}

PRODUCTION: dict[str, Any] = {
    "app_id": "prod",
    "input": {"partitions": 2},
    "noise": {"mode": "keyed"},
    "privacy": {"total_epsilon": 2.0},
    "statistics": [{"name": "events", "kind": "count", "epsilon": 1.0, "tau": 8}],
}


def minimal(**changes: Any) -> dict[str, Any]:
    """``MINIMAL`` with each change at its path, parts joined by ``__`` (a number indexes a
    list): ``minimal(statistics__0__tau=0, input__partitions=3)``."""
    data = copy.deepcopy(MINIMAL)
    for path, value in changes.items():
        target = data
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        target[last] = value
    return data


def production(**changes: Any) -> dict[str, Any]:
    """``PRODUCTION`` with its statistic's ``epsilon``, ``tau`` or ``name`` changed, or a
    top-level section replaced."""
    data = copy.deepcopy(PRODUCTION)
    for name, value in changes.items():
        if name in ("epsilon", "tau", "name"):
            data["statistics"][0][name] = value
        else:
            data[name] = value
    return data
