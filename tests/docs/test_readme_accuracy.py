"""The README's accuracy table is the one generated from the stored benchmark result it
names (issue 19: figures in the README come from a stored result), and each data set's
verdict says what the stored numbers say: behind every model more than 0.1 % below
meshops' mean error, level with those within 0.1 %, ahead otherwise (issue 29)."""

import json
import re
from pathlib import Path

from benchmarks.accuracy.report import OTHERS, did_not_learn, readme_table, rows
from benchmarks.accuracy.run import LABELS
from meshops.runs.comparison import LEVEL_RTOL

ROOT = Path(__file__).resolve().parents[2]


def _table() -> tuple[str, dict, str]:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- accuracy table -->\n(.*?)<!-- end of accuracy table -->", text,
                      re.S)
    assert found, "README.md has no accuracy table between its markers"
    table = found.group(1)
    source = re.search(r"from `(benchmarks/results/accuracy-[^`]+\.json)`", table).group(1)
    return table, json.loads((ROOT / source).read_text()), source


def test_readme_accuracy_table_is_generated_from_its_stored_result():
    table, doc, source = _table()
    assert table == readme_table(doc, source)


def test_each_verdict_says_behind_level_or_ahead_as_the_numbers_do():
    table, doc, _ = _table()
    said_of = {line[2:line.index(": meshops")]: line[line.index(": meshops") + 2:]
               for line in table.splitlines() if line.startswith("- ")}
    labels = [(label, models) for name, d in doc["datasets"].items()
              for label, models in rows(name, d)]
    assert sorted(said_of) == sorted(label for label, _ in labels)
    for label, models in labels:
        ours = models["meshops"]["mean"]
        # a model that did not learn is said apart, not compared with
        others = {LABELS[m]: models[m]["mean"] for m in OTHERS
                  if models.get(m, {}).get("mean") is not None
                  and not did_not_learn(m, models)}
        level = [k for k, v in others.items() if abs(v - ours) <= LEVEL_RTOL * min(v, ours)]
        behind = [k for k, v in others.items() if v < ours and k not in level]
        said = said_of[label]
        for k in others:
            assert (f"behind {k} by" in said or f", {k} by" in said) == (k in behind), said
            assert (f"level with {k} (" in said) == (k in level), said
        start = "behind" if behind else "level with" if level else "ahead"
        assert said.startswith(f"meshops is {start}"), said
        if start == "ahead":
            closest = min(others, key=others.get)
            assert f"the closest, {closest}, is" in said


def test_readme_mesh_independence_table_is_generated_from_its_stored_results():
    """The README's zero-shot table is the one :mod:`benchmarks.accuracy.zero_shot` makes
    of the stored results it names, and the plot beside it is stored too."""
    from benchmarks.accuracy.zero_shot import markdown_table

    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- mesh independence table -->\n(.*?)"
                      r"<!-- end of mesh independence table -->", text, re.S)
    assert found, "README.md has no mesh independence table between its markers"
    table = found.group(1)
    caption = next(line for line in table.splitlines() if line.startswith("Mean relative L2"))
    sources = re.findall(r"`(benchmarks/results/[^`]+\.json)`", caption)
    assert sources, "the table names no stored result"
    docs = [json.loads((ROOT / s).read_text()) for s in sources]
    assert table == markdown_table(docs, sources)
    image = re.search(r"!\[[^\]]*\]\((benchmarks/results/[^)]+\.png)\)", text).group(1)
    assert (ROOT / image).is_file()
