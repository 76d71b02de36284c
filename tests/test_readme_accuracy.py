"""The README's accuracy table is the one generated from the stored benchmark result it
names (issue 19: figures in the README come from a stored result)."""

import json
import re
from pathlib import Path

from benchmarks.accuracy.report import readme_table

ROOT = Path(__file__).resolve().parents[1]


def test_readme_accuracy_table_is_generated_from_its_stored_result():
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- accuracy table -->\n(.*?)<!-- end of accuracy table -->", text,
                      re.S)
    assert found, "README.md has no accuracy table between its markers"
    table = found.group(1)
    source = re.search(r"from `(benchmarks/results/accuracy-[^`]+\.json)`", table).group(1)
    doc = json.loads((ROOT / source).read_text())
    assert table == readme_table(doc, source)
    # it says plainly where meshops loses, if it does
    for name, d in doc["datasets"].items():
        assert f"- {name}: meshops" in table
