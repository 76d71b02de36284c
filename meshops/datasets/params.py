"""Parameter vectors: per-sample scalars (angle of attack, Reynolds number, material
constants) read from a mesh file's ``field_data`` or from a sidecar file beside it.

A parametric study gives every sample a few numbers besides its mesh. They are read,
by name, from:

* the file's ``field_data`` (VTK ``FieldData`` arrays of one value each, as VTK and
  ParaView write them; meshio reads them into ``mesh.field_data``), or
* ``params.csv`` or ``params.json`` in the sample's folder, keyed by file name::

      file,alpha,Re                      {"case_01.vtu": {"alpha": 2.0, "Re": 1e5},
      case_01.vtu,2.0,1e5                 "case_02.vtu": {"alpha": 4.5, "Re": 2e5}}
      case_02.vtu,4.5,2e5

The sample carries them as ``params [1, K]`` (a batch: ``[B, K]``), in the order
asked for; their names travel in the run's config, not in the sample. Every value is
checked: a missing sample, column or value, a non-numeric or non-finite one, a name
found in both places, a column, key or file entry given twice, or a folder with both
sidecar files is refused with the file and the column named.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from meshops.errors import MeshError

__all__ = ["PARAM_FILES", "ParamTable", "read_param_table", "sample_params",
           "write_param_table"]

#: Sidecar parameter files looked for in a sample's folder.
PARAM_FILES = ("params.csv", "params.json")
#: The CSV column that names the sample's file.
KEY_COLUMN = "file"


def _number(text, where: str) -> float:
    """A finite float from a CSV cell or a JSON value; ``where`` names it."""
    if isinstance(text, bool) or text is None or (isinstance(text, str) and not text.strip()):
        raise MeshError(f"{where}: no value (parameters must be finite numbers)")
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise MeshError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(v):
        raise MeshError(f"{where}: {text!r} is not finite (parameters must be finite numbers)")
    return v


class _Pairs(list):
    """A JSON object as its ``(key, value)`` pairs in file order, duplicates kept (to be
    refused: a plain dict keeps the last value of a key)."""


class ParamTable:
    """The sidecar parameter file of one folder: ``{file name: {column: text}}``.

    Values are kept as read and converted (and checked) when a sample asks for
    them, so that an unused bad column does not stop anything.

    Args:
        path: ``params.csv`` (a header row with a ``file`` column) or ``params.json``
            (``{file name: {name: number}}``).

    Raises:
        MeshError: unreadable or malformed file, no ``file`` column, a file listed twice,
            a column (or a JSON entry's key) given twice.
    """

    def __init__(self, path) -> None:
        self.path = Path(path)
        try:
            text = self.path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as e:
            raise MeshError(f"{self.path}: cannot read the parameter file ({e})") from None
        self.rows: dict[str, dict] = {}
        if self.path.suffix.lower() == ".csv":
            self._read_csv(text)
        else:
            self._read_json(text)

    def _add(self, name: str, row: dict, where: str) -> None:
        if name in self.rows:
            raise MeshError(f"{self.path}: {where}: {name!r} is listed twice (the last "
                            f"values would silently win); keep one")
        self.rows[name] = row

    def _read_csv(self, text: str) -> None:
        reader = csv.DictReader(text.splitlines())
        fields = [f.strip() for f in (reader.fieldnames or [])]
        twice = next((f for i, f in enumerate(fields) if f in fields[:i]), None)
        if twice is not None:  # DictReader would keep the last column of the name
            raise MeshError(f"{self.path}: column {twice!r} appears twice in the header "
                            f"(the last one would silently win); keep one")
        if KEY_COLUMN not in fields:
            raise MeshError(f"{self.path}: the first row must name the columns, one of them "
                            f"{KEY_COLUMN!r} (the sample's file name); got {fields or 'none'}")
        self.columns = [f for f in fields if f != KEY_COLUMN]
        for line, row in enumerate(reader, start=2):
            row = {(k or "").strip(): v for k, v in row.items()}
            if None in row or "" in row:  # more cells than columns
                raise MeshError(f"{self.path}: line {line} has more values than the header "
                                f"has columns")
            name = (row.pop(KEY_COLUMN) or "").strip()
            if not name:
                raise MeshError(f"{self.path}: line {line} has no file name in column "
                                f"{KEY_COLUMN!r}")
            self._add(name, row, f"line {line}")

    def _read_json(self, text: str) -> None:
        try:  # objects as their (key, value) pairs: json.loads keeps the last of a key
            data = json.loads(text, object_pairs_hook=_Pairs)
        except json.JSONDecodeError as e:
            raise MeshError(f"{self.path}: not valid JSON ({e})") from None
        if not isinstance(data, _Pairs) or not all(isinstance(v, _Pairs) for _, v in data):
            raise MeshError(f"{self.path}: expected an object {{file name: {{parameter: "
                            f"number}}}}")
        cols: list[str] = []
        for name, pairs in data:
            row = {}
            for key, value in pairs:
                if key in row:
                    raise MeshError(f"{self.path}: entry {name!r}: parameter {key!r} is given "
                                    f"twice (the last value would silently win); keep one")
                row[key] = value
            if str(name) in self.rows:
                raise MeshError(f"{self.path}: entry {name!r} is listed twice (the last "
                                f"values would silently win); keep one")
            self.rows[str(name)] = row
            cols += [c for c in row if c not in cols]
        self.columns = cols

    def value(self, file_name: str, column: str) -> float:
        """The parameter ``column`` of the sample file ``file_name``.

        Raises:
            MeshError: no row for the file, no such column, or a value that is
                missing, not a number or not finite.
        """
        if file_name not in self.rows:
            listed = ", ".join(list(self.rows)[:3]) + (", ..." if len(self.rows) > 3 else "")
            raise MeshError(f"{self.path}: no entry for the sample {file_name!r} (entries are "
                            f"keyed by file name, e.g. {listed or 'none'}); every sample needs "
                            f"its parameters")
        row = self.rows[file_name]
        if column not in row:
            raise MeshError(f"{self.path}: {file_name}: no column {column!r} (columns: "
                            f"{', '.join(self.columns) or 'none'})")
        return _number(row[column], f"{self.path}: {file_name}, column {column!r}")


def read_param_table(folder) -> ParamTable | None:
    """The sidecar parameter file of ``folder`` (``params.csv`` or ``params.json``), or
    ``None`` when it has neither.

    Raises:
        MeshError: both files are present (which one holds the parameters would be a
            guess), or the file is malformed (see :class:`ParamTable`).
    """
    found = [Path(folder) / n for n in PARAM_FILES if (Path(folder) / n).is_file()]
    if len(found) > 1:
        raise MeshError(f"{folder}: holds both {PARAM_FILES[0]} and {PARAM_FILES[1]}; keep one")
    return ParamTable(found[0]) if found else None


def sample_params(names: Sequence[str], path, field_data: Mapping | None,
                  table: ParamTable | None) -> torch.Tensor:
    """The parameter vector of one sample file: each name from its ``field_data`` or
    from the sidecar ``table`` of its folder.

    Args:
        names: Parameter names, in the order of the vector.
        path: The sample's file (its name keys the table; named in messages).
        field_data: The file's ``field_data`` (``{name: array}``).
        table: :func:`read_param_table` of the file's folder, or ``None``.

    Returns:
        ``params [1, K]`` float64.

    Raises:
        MeshError: a name in neither place or in both, a ``field_data`` entry that is
            not one finite number, and the table's errors (:meth:`ParamTable.value`).

    Shapes:
        ``[1, K]`` with ``K = len(names)``
    """
    path = Path(path)
    field_data = field_data or {}
    values = []
    for name in names:
        in_fd = name in field_data
        in_table = table is not None and name in table.columns
        if in_fd and in_table:
            raise MeshError(f"{path}: parameter {name!r} is given both in the file's field_data "
                            f"and in {table.path}; keep one")
        if in_fd:
            a = np.asarray(field_data[name])
            if a.size != 1:
                raise MeshError(f"{path}: field_data {name!r} holds {a.size} values; a parameter "
                                f"is one number")
            values.append(_number(a.reshape(-1)[0].item(), f"{path}: field_data {name!r}"))
        elif table is not None:
            values.append(table.value(path.name, name))
        else:
            have = ", ".join(sorted(field_data)) or "none"
            raise MeshError(f"{path}: parameter {name!r} not found: not in the file's field_data "
                            f"(it has: {have}) and no {' or '.join(PARAM_FILES)} in {path.parent}")
    return torch.tensor([values], dtype=torch.float64).reshape(1, len(names))


def write_param_table(folder, names: Sequence[str], rows: Mapping[str, Sequence[float]]) -> Path:
    """Write ``folder/params.csv`` (atomically): a ``file`` column and one column per
    name, a row per ``{file name: values}``; values are written with full precision
    (``repr``), so they read back bit for bit.

    Raises:
        MeshError: a row whose length is not ``len(names)``, or a non-finite value.
    """
    import io

    from meshops.utils.atomic import atomic_write

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([KEY_COLUMN, *names])
    for name, values in rows.items():
        values = [float(v) for v in values]
        if len(values) != len(names):
            raise MeshError(f"{name}: {len(values)} parameter values for the {len(names)} "
                            f"names {list(names)}")
        bad = [n for n, v in zip(names, values) if not math.isfinite(v)]
        if bad:
            raise MeshError(f"{name}: parameter {bad[0]!r} is not finite")
        w.writerow([name, *map(repr, values)])
    path = Path(folder) / PARAM_FILES[0]
    return atomic_write(path, lambda tmp: Path(tmp).write_text(buf.getvalue(), encoding="utf-8"))
