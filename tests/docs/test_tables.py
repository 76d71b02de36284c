"""The docs' tables of what options and models do are generated from the code
(docs/_ext/option_tables.py, run by the docs build), not typed (issue 28): the pages
include the generated files, the tables cover every option, format and model the code
has, and a rule of the code the generator has no words for stops the build."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshops.fitting.config import TrainConfig
from meshops.fitting.out_folder import RESUME_MAY_CHANGE
from meshops.inference.export import FIXED_MESH, REFUSED
from meshops.mesh.io import FIELD_FORMATS
from meshops.models import MODELS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import option_tables  # noqa: E402  (docs/_ext)

INCLUDES = {"trust.md": ["resume.md", "field-formats.md"],
            "training-and-deployment.md": ["export.md"]}
HEADERS = ["| option | under `--resume` |", "| format | components per point |",
           "| model | inputs of the program | sizes |"]


def test_the_pages_include_the_generated_tables_and_type_none_of_them(tmp_path):
    for page, tables in INCLUDES.items():
        text = (ROOT / "docs" / page).read_text()
        for t in tables:
            assert f"```{{include}} _generated/tables/{t}\n```" in text, (page, t)
        assert not any(h in text for h in HEADERS), page   # no typed copy left
    written = {p.name: p.read_text() for p in option_tables.generate(tmp_path)}
    assert set(written) == {t for ts in INCLUDES.values() for t in ts}
    assert all(HEADERS[i] in text for i, text in enumerate(
        [written["resume.md"], written["field-formats.md"], written["export.md"]]))


def test_the_resume_table_is_every_option_of_train():
    text = option_tables.resume_md()
    rows = [r for r in text.splitlines() if r.startswith("| `--") or r.startswith("| every")]
    may = [k for k in RESUME_MAY_CHANGE if option_tables.RESUME_WHY[k]]
    assert [r.split(" |")[0][2:] for r in rows[:len(may)]] == [f"`--{k}`" for k in may]
    refused = rows[-1]
    for key in TrainConfig.keys():
        flag = "`--" + key.replace("_", "-") + "`"
        assert (flag in refused) == (key not in RESUME_MAY_CHANGE), key


def test_the_field_formats_table_evaluates_the_rules_of_io():
    text = option_tables.field_formats_md()
    assert "| `.vtk` (legacy) | any but 2 (meshio pads 2-vectors to 3) |" in text
    assert "| `.xdmf` | 1, 2, 3, 6, 9 |" in text and "| `.msh` (Gmsh) | 1, 3, 9 |" in text
    suffixes = {s for s in FIELD_FORMATS.values()}
    assert all(f"`{s}`" in text for s in suffixes)


def test_the_export_table_is_every_registered_model():
    text = option_tables.export_md()
    for name in MODELS:
        if name.startswith("_"):   # models the tests register
            continue
        row = next(r for r in text.splitlines() if r.startswith(f"| `{name}` |"))
        if name in REFUSED:
            assert f"refused: {REFUSED[name]}" in row
        elif name in FIXED_MESH:
            assert FIXED_MESH[name] in row and "--dynamic" not in row
        else:
            assert "`pos [N, d]`" in row and "--dynamic" in row


def test_a_rule_the_generator_cannot_say_stops_the_build(monkeypatch):
    import meshops.fitting.out_folder as run_folder
    import meshops.mesh.io as io

    monkeypatch.setattr(run_folder, "RESUME_MAY_CHANGE", RESUME_MAY_CHANGE + ("seed",))
    with pytest.raises(ValueError, match=r"RESUME_MAY_CHANGE has \['seed'\], which RESUME_WHY"):
        option_tables.resume_md()
    monkeypatch.setattr(io, "_COMPONENTS", {**io._COMPONENTS, "ply": lambda c: c == 1})
    with pytest.raises(ValueError, match=r"formats \['ply'\] have no name"):
        option_tables.field_formats_md()
