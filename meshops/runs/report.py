"""What an evaluation, a prediction or an export of a run reports: one object with the
numbers (``report["fields"]``, ...), the JSON ``meshops evaluate --json`` prints and the
table the command prints otherwise."""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping


def json_number(v):
    """JSON has no NaN or infinity: ``None`` (also inside dicts and lists)."""
    if isinstance(v, dict):
        return {k: json_number(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_number(x) for x in v]
    return None if isinstance(v, float) and not math.isfinite(v) else v


class Report(Mapping):
    """A read-only mapping of a report's entries, with its two renderings.

    Args:
        data: The entries (``checkpoint``, ``fields``, ``baselines``, ... for an
            evaluation; see the function that made it).
        lines: The lines of the table of ``data``: what the command prints.
        jsonable: ``data`` rearranged for JSON (e.g. notes on what ``null`` marks);
            default ``data`` itself. Non-finite numbers become ``null`` in any case
            (:func:`json_number`): ``to_json`` writes standard JSON, which has no
            ``Infinity`` or ``NaN``.
    """

    def __init__(self, data: dict, lines: Callable[[dict], list[str]],
                 jsonable: Callable[[dict], Any] | None = None) -> None:
        self._data, self._lines = data, lines
        self._jsonable = jsonable or (lambda d: d)

    def __getitem__(self, key: str):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict:
        """The entries as JSON allows them (what :meth:`to_json` writes)."""
        return json_number(self._jsonable(self._data))

    def to_json(self) -> str:
        """One JSON object: what ``--json`` prints."""
        return json.dumps(self.to_dict(), allow_nan=False)

    def table(self) -> str:
        """The text the command prints, lines joined (no trailing newline)."""
        return "\n".join(self._lines(self._data))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self._data)})"

    def _repr_pretty_(self, p, cycle) -> None:  # IPython shows the table
        p.text(self.table())
