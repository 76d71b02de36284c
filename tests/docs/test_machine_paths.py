"""The docs build fails under ``-W`` when a page shows an absolute machine path (issue 39):
``docs/_ext/machine_paths.py`` finds them, a page with one warns naming its file and
line, and the pages made from the stored results show none."""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

import pytest

# the extension is a Sphinx one: the docs extra (.ci/run installs it; the README's test
# command alone does not)
pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]'")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import bench_tables  # noqa: E402  (docs/_ext)
import machine_paths  # noqa: E402

STORED = ("[hole] meshops: 0.0188\n"
          "  $ python -m benchmarks.accuracy --keep /work/scratch/final/keep-meshops\n"
          "  File \"/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/module.py\"\n")


def test_the_checker_names_each_absolute_path_and_its_line():
    assert machine_paths.machine_paths(STORED) == [
        (2, "/work/scratch/final/keep-meshops"),
        (3, "/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/module.py")]
    written = ("  $ python -m benchmarks.accuracy --keep $WORK\n  File "
               "\"<site-packages>/torch/nn/module.py\" in ~/.cache and benchmarks/results/x\n")
    assert machine_paths.machine_paths(written) == []


def test_example_folders_pass_and_only_cell_outputs_may_show_their_scratch_folder():
    text = "--cache /scratch/cache\n#!/bin/bash\n"
    assert machine_paths.machine_paths(text) == [(1, "/scratch/cache"), (2, "/bin/bash")]
    assert machine_paths.machine_paths(text, ("/scratch/", "/bin/bash")) == []
    ran_in = f"{tempfile.gettempdir()}/tmpab_cd123/study/train"
    assert machine_paths.machine_paths(f"of {ran_in}", scratch=True) == []
    assert machine_paths.machine_paths(f"of {ran_in}") == [(1, ran_in)]
    other = f"{tempfile.gettempdir()}/meshops-fem-ab12cd/run"
    assert machine_paths.machine_paths(other, scratch=True) == [(1, other)]


def _build(src: Path, page: str, out: Path) -> tuple[int, str]:
    """A one-page Sphinx build with the checker (and -W): its status and warnings."""
    from sphinx.application import Sphinx
    from sphinx.util.docutils import docutils_namespace

    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'docs' / '_ext')!r}]\n"
        "extensions = ['machine_paths']\nmachine_paths_examples = ('/scratch/',)\n")
    (src / "index.rst").write_text(page)
    warnings = io.StringIO()
    with docutils_namespace():     # a fresh registry of nodes and roles for each build
        app = Sphinx(str(src), str(src), str(out), str(out / ".doctrees"), "text",
                     status=None, warning=warnings, warningiserror=True, keep_going=True)
        app.build()
    return app.statuscode, warnings.getvalue()


def test_a_page_that_shows_a_machine_path_fails_the_build_naming_file_and_line(tmp_path):
    page = ("Title\n=====\n\nCache in /scratch/cache.\n\n::\n\n    $ meshops train\n"
            "    writing /work/scratch/final/keep/run/\n")
    status, warnings = _build(tmp_path / "src", page, tmp_path / "out")
    assert status != 0
    assert "index.rst:9" in warnings and "/work/scratch/final/keep/run/" in warnings
    assert "/scratch/cache" not in warnings            # an example folder passes
    clean, none = _build(tmp_path / "src2", page.replace("/work/scratch/final/keep",
                                                         "$WORK"), tmp_path / "out2")
    assert (clean, none) == (0, "")


def test_the_pages_made_from_the_stored_results_show_no_machine_path(tmp_path):
    pages = bench_tables.generate(tmp_path)
    assert any(p.name == "stored-outputs.md" for p in pages)
    found = {p.name: machine_paths.machine_paths(p.read_text()) for p in pages}
    assert {k: v for k, v in found.items() if v} == {}
