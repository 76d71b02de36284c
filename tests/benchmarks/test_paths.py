"""Stored results name no folder of the machine that wrote them (issue 39): the rule of
``benchmarks/paths.py``, checked on generated paths, and every file in
``benchmarks/results/``."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest

from benchmarks.paths import REPO, absolute_paths, command, portable, portable_path

RESULTS = REPO / "benchmarks" / "results"
NAME = "abcdefghijklmnopqrstuvwxyz0123456789_-."


def _names(rng: random.Random, k: int) -> list[str]:
    """``k`` path names of 1 to 12 characters, none of them only dots."""
    out = []
    while len(out) < k:
        name = "".join(rng.choice(NAME) for _ in range(rng.randint(1, 12)))
        if name.strip("."):
            out.append(name)
    return out


def _rest(seed: int) -> str:
    rng = random.Random(seed)
    return "/".join(_names(rng, rng.randint(1, 5)))


SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_path_under_the_repository_becomes_relative_to_it(seed):
    rest = _rest(seed)
    assert portable_path(REPO / rest) == rest
    assert portable(f"File \"{REPO / rest}\", line 3") == f"File \"{rest}\", line 3"
    assert portable_path(REPO) == "."


@pytest.mark.parametrize("seed", SEEDS)
def test_a_path_under_a_named_root_is_written_against_it(seed, tmp_path):
    rest = _rest(seed)
    data, work = tmp_path / "cache" / "accuracy", tmp_path / "cache" / "accuracy" / "runs"
    roots = {"$DATA_ROOT": data, "$WORK": work}
    assert portable_path(data / rest, roots) == f"$DATA_ROOT/{rest}"
    # the longest root wins: the work folder lies inside the data root here
    assert portable_path(work / rest, roots) == f"$WORK/{rest}"
    line = f"--data {data / rest} --out {work / rest}/"
    assert portable(line, roots) == f"--data $DATA_ROOT/{rest} --out $WORK/{rest}/"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_site_packages_path_is_shortened(seed):
    rest, env = _rest(seed), _rest(seed + 1000)
    for kind in ("site-packages", "dist-packages"):
        path = f"/{env}/lib/python3.12/{kind}/{rest}"
        assert portable_path(path) == f"<site-packages>/{rest}"
    assert portable_path(f"/{env}/lib/python3.12/{rest}") == f"<stdlib>/{rest}"
    assert portable_path(f"/{env}/bin/python3.12") == "<env>/bin/python3.12"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_path_elsewhere_keeps_its_last_name(seed):
    """Outside every named folder, the repository, home and the temporary folder only
    the last name stays: home and the temporary folder become ``~`` and ``$TMPDIR``."""
    rest = _rest(seed)
    elsewhere = f"/nonexistent-{seed}/{rest}"
    assert portable_path(elsewhere) == "<elsewhere>/" + rest.rsplit("/", 1)[-1]
    assert portable_path(Path.home() / rest) == f"~/{rest}"
    assert portable_path(Path(tempfile.gettempdir()) / rest) == f"$TMPDIR/{rest}"


@pytest.mark.parametrize("seed", SEEDS)
def test_what_portable_writes_holds_no_absolute_path_and_keeps_the_rest(seed, tmp_path):
    rng = random.Random(seed)
    paths = [REPO / _rest(seed), tmp_path / _rest(seed + 1), f"/x{seed}/{_rest(seed + 2)}",
             f"/venv/lib/python3.11/site-packages/{_rest(seed + 3)}"]
    words = _names(rng, len(paths) + 1)
    text = " ".join(w + " " + str(p) for w, p in zip(words, paths)) + " " + words[-1]
    out = portable(text, {"$WORK": tmp_path})
    assert absolute_paths(text) == [str(p) for p in paths]
    assert absolute_paths(out) == []
    assert out.split(" ")[::2] == words     # only the paths changed
    assert portable(out, {"$WORK": tmp_path}) == out


def test_what_is_not_an_absolute_path_is_left_alone():
    text = ("https://github.com/a/b fwd/bwd 3/4 ./a/b ../a/b ~/a/b $WORK/a/b <env>/bin/x "
            "samples/s a/b/c /single file:///opt/x/y")
    assert absolute_paths(text) == []
    assert portable(text) == text


def test_a_result_document_is_rewritten_value_by_value(tmp_path):
    doc = {"argv": ["--out", str(tmp_path / "r.json")], "n": 3, "x": 1.5,
           "nested": {"traceback": f'File "{REPO / "meshops" / "x.py"}", line 2'}}
    out = portable(doc, {"$WORK": tmp_path})
    assert out == {"argv": ["--out", "$WORK/r.json"], "n": 3, "x": 1.5,
                   "nested": {"traceback": 'File "meshops/x.py", line 2'}}


def test_the_command_line_quotes_its_arguments_and_writes_paths_portably(tmp_path):
    line = command("benchmarks.x", ["--data", str(tmp_path / "a b"), "--inputs", ""],
                   {"$DATA_ROOT": tmp_path})
    assert line == "python -m benchmarks.x --data '$DATA_ROOT/a b' --inputs ''"


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _stored_texts(path: Path) -> list[str]:
    """The text of a stored file, and for JSON every decoded string too (a path right
    after an escaped newline, ``\\n/root/...``, hides from the raw text's pattern)."""
    text = path.read_text()
    if path.suffix == ".json":
        return [text, *_strings(json.loads(text))]
    if path.suffix == ".jsonl":
        return [text] + [s for line in text.splitlines() if line.strip()
                         for s in _strings(json.loads(line))]
    return [text]


def test_no_stored_result_holds_an_absolute_machine_path():
    files = [p for p in sorted(RESULTS.iterdir()) if p.suffix != ".png"]
    assert len(files) > 50
    found = {p.name: sorted({a for t in _stored_texts(p) for a in absolute_paths(t)})
             for p in files}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_stored_result_check_finds_a_path_after_an_escaped_newline(tmp_path):
    """Control for the test above: the decoded strings of a JSON file are checked."""
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"config": "model: pit\n/root/.cache/meshops/x"}))
    assert absolute_paths(f.read_text()) == []
    assert [a for t in _stored_texts(f) for a in absolute_paths(t)] == [
        "/root/.cache/meshops/x"]
