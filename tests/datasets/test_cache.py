"""The on-disk cache of parsed meshes and mesh structures (meshops.datasets.cache) and lazy
training (``meshops train --lazy / --cache``): keys follow the file content, bad
entries are detected and rebuilt or refused, interrupted builds resume, two processes
share a cache, and training through the cache is training in memory."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import square_mesh
from _tiny_run import one_line_error

from meshops import cli
from meshops.datasets.cache import (
    CACHE_VERSION,
    SAMPLE,
    STRUCTURED,
    CachedMeshDataset,
    CacheError,
    MeshCache,
)
from meshops.datasets.entry import MAGIC, entry_bytes, read_entry
from meshops.datasets.lazy import FolderReader
from meshops.fitting.defaults import data_facts
from meshops.mesh.io import mesh_from_arrays, write_mesh
from meshops.training.dataset import fit_normalizers

SETTINGS = {"test": 1}
SMALL_PIT = ["--model", "pit", "--model-config", "width=16", "blocks=1", "num_latent=16"]


def _mesh(k: int, scale: float = 1.0):
    n = 3 + k % 3
    pts, cells = square_mesh(n, ("quad", "triangle")[k % 2], amount=0.2, seed=k)
    x, y = pts[:, 0], pts[:, 1]
    f = np.sin((1 + 0.3 * k) * np.pi * x) * np.cos(np.pi * y)
    return mesh_from_arrays(pts, cells, {"f": f, "u": scale * (f * y + 0.5 * x ** 2 + 1)})


def _folder(root: Path, n: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        write_mesh(root / f"s{k:02d}.vtu", _mesh(k))
    return root


class CountingReader(FolderReader):
    """The CLI's reader, counting the files it parses (in this process: workers=0) and
    optionally stopping after ``stop`` of them (an interrupted build)."""

    def __init__(self, root, stop=None):
        super().__init__(root, ["f"], ["u"], torch.float64)
        self.calls, self.stop = [], stop

    def __call__(self, path):
        if self.stop is not None and len(self.calls) == self.stop:
            raise KeyboardInterrupt
        self.calls.append(Path(path).name)
        return super().__call__(path)


def _reference(reader: FolderReader, i: int):
    return reader(reader.files[i])[0]


def _equal(a, b) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("pos", "weight", "x", "y"))


@pytest.fixture
def folder(tmp_path):
    return _folder(tmp_path / "data", 6)


def test_entries_hold_the_parsed_samples_and_a_second_run_parses_nothing(folder, tmp_path):
    reader = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    assert len(reader.calls) == 6 and len(ds) == 6
    for i in range(6):
        assert _equal(ds[i], _reference(reader, i))
    again = CountingReader(folder)
    ds2 = MeshCache(tmp_path / "c").dataset(again.files, again, SETTINGS, progress=False)
    assert again.calls == []
    assert _equal(ds2[3], ds[3])
    # other settings are other entries
    other = CountingReader(folder)
    MeshCache(tmp_path / "c").dataset(other.files, other, {"test": 2}, progress=False)
    assert len(other.calls) == 6


def test_a_changed_file_is_parsed_again_even_with_its_old_size_and_times(tmp_path):
    # legacy binary VTK: uncompressed, so other values keep the file's size
    folder = tmp_path / "data"
    folder.mkdir()
    for k in range(4):
        write_mesh(folder / f"s{k}.vtk", _mesh(k))
    reader = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    old = ds[2].y
    path = folder / "s2.vtk"
    st = os.stat(path)
    write_mesh(path, _mesh(2, scale=3.0))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))   # the modification time set back
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    again = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(again.files, again, SETTINGS, progress=False)
    assert again.calls == ["s2.vtk"]
    assert _equal(ds[2], _reference(again, 2))
    torch.testing.assert_close(ds[2].y, 3 * old, rtol=1e-12, atol=0)


def test_an_interrupted_build_continues_where_it_stopped(folder, tmp_path):
    first = CountingReader(folder, stop=4)
    with pytest.raises(KeyboardInterrupt):
        MeshCache(tmp_path / "c").dataset(first.files, first, SETTINGS, progress=False)
    assert len(first.calls) == 4
    rest = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(rest.files, rest, SETTINGS, progress=False)
    assert rest.calls == ["s04.vtu", "s05.vtu"]
    assert all(_equal(ds[i], _reference(rest, i)) for i in range(6))


def test_a_bad_file_stops_the_build_naming_it_and_keeps_the_entries_before(folder, tmp_path):
    (folder / "s03.vtu").write_text("<VTKFile> not a mesh")
    reader = CountingReader(folder)
    with pytest.raises(Exception, match="s03.vtu"):
        MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    write_mesh(folder / "s03.vtu", _mesh(3))
    again = CountingReader(folder)
    MeshCache(tmp_path / "c").dataset(again.files, again, SETTINGS, progress=False)
    assert again.calls == ["s03.vtu", "s04.vtu", "s05.vtu"]


def _entry_path(ds: CachedMeshDataset, i: int, kind=SAMPLE) -> Path:
    rec = ds.records[i]
    return ds.cache.path(kind, rec.key if kind == SAMPLE else rec.structured)


def test_a_torn_entry_is_detected_and_rebuilt_from_its_file(folder, tmp_path):
    reader = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    path = _entry_path(ds, 1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])           # half an entry
    with pytest.raises(CacheError, match="the file is truncated or was written over"):
        ds.cache.read(SAMPLE, ds.records[1].key)
    want = _reference(reader, 1)
    reader.calls.clear()
    assert _equal(ds[1], want)
    assert reader.calls == ["s01.vtu"]
    ds.cache.read(SAMPLE, ds.records[1].key)             # whole again


def test_a_damaged_tensor_is_never_read(folder, tmp_path):
    reader = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    path = _entry_path(ds, 0)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF                                     # one flipped byte in the last tensor
    path.write_bytes(bytes(raw))
    with pytest.raises(CacheError, match="fail their CRC-32 check"):
        ds.cache.read(SAMPLE, ds.records[0].key)
    assert _equal(ds[0], _reference(reader, 0))


def test_an_entry_of_another_version_or_key_is_not_used(folder, tmp_path):
    reader = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    path = _entry_path(ds, 2)
    header, data = read_entry(path)
    path.write_bytes(entry_bytes({**header, "cache_version": CACHE_VERSION + 1}, data))
    with pytest.raises(CacheError, match=rf"cache_version {CACHE_VERSION + 1} \(expected "
                                         rf"{CACHE_VERSION}\)"):
        ds.cache.read(SAMPLE, ds.records[2].key)
    # another file's entry copied into its place
    path.write_bytes(_entry_path(ds, 4).read_bytes())
    with pytest.raises(CacheError, match="key '"):
        ds.cache.read(SAMPLE, ds.records[2].key)
    want = _reference(reader, 2)
    reader.calls.clear()
    assert _equal(ds[2], want) and reader.calls == ["s02.vtu"]


def test_a_bad_entry_of_a_file_changed_since_the_run_began_is_refused(folder, tmp_path):
    reader = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    _entry_path(ds, 5).write_bytes(MAGIC + b" torn")
    write_mesh(folder / "s05.vtu", _mesh(5, scale=2.0))
    with pytest.raises(CacheError, match=r"s05.vtu: changed since this run checked the cache"):
        ds[5]


def test_a_cache_folder_of_another_layout_is_refused(tmp_path, capsys, folder):
    root = tmp_path / "c"
    MeshCache(root)
    (root / "meshops-cache.json").write_text(json.dumps({"format": "meshops-mesh-cache",
                                                          "layout": 99}))
    with pytest.raises(CacheError, match="layout 99, written by another meshops version"):
        MeshCache(root)
    code = cli.main(["train", "--data", str(folder), "--inputs", "f", "--targets", "u",
                     "--cache", str(root), "--epochs", "1", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "layout 99" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    with pytest.raises(CacheError, match="not a meshops cache folder"):
        MeshCache(other)


def test_workers_error_reaches_the_command_as_one_line():
    wrapped = ("Caught CacheError in DataLoader worker process 0.\nOriginal Traceback (most "
               "recent call last):\n  File \"x.py\", line 1, in f\n    raise CacheError(msg)\n"
               "meshops.datasets.cache.CacheError: a.vtu: changed since this run checked the "
               "cache\n")
    assert str(CacheError(wrapped)) == "a.vtu: changed since this run checked the cache"


def test_normalizers_and_facts_from_the_cache_equal_those_of_the_samples(folder, tmp_path):
    reader = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    samples = [ds[i] for i in range(len(ds))]
    for sub in ([0, 2, 3, 5], range(6)):
        part = ds.subset(list(sub))
        got = fit_normalizers(part)
        want = fit_normalizers([samples[i] for i in sub])
        assert len(got) == len(want) == 2   # inputs and targets
        for g, w in zip(got, want):
            torch.testing.assert_close(g.mean, w.mean, rtol=1e-13, atol=0)
            torch.testing.assert_close(g.std, w.std, rtol=1e-13, atol=0)
        assert data_facts(part) == data_facts([samples[i] for i in sub])
    one = _folder(tmp_path / "one", 0)
    pts, cells = square_mesh(3)
    for k in range(3):
        write_mesh(one / f"p{k}.vtu", mesh_from_arrays(pts, cells, {
            "f": np.full(len(pts), 1.0 + k), "u": pts[:, 0] * (1 + k)}))
    r1 = CountingReader(one)
    ds1 = MeshCache(tmp_path / "c").dataset(r1.files, r1, SETTINGS, progress=False)
    facts = data_facts(ds1)
    assert facts == data_facts([ds1[i] for i in range(3)])
    assert facts["one_mesh"] and facts["constant"]


def test_structures_are_cached_and_equal_the_models_own(folder, tmp_path):
    from meshops.models import PiT

    model = PiT(1, 1, width=8, blocks=1, num_latent=8).double()
    reader = CountingReader(folder)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False,
                                           transform=model.mesh_transform())
    got = ds[4]
    want = model.mesh_transform()(_reference(reader, 4))
    for k in ("mesh_latent", "mesh_enc", "mesh_dec", "mesh_latent_weight"):
        assert torch.equal(getattr(got, k), getattr(want, k)), k
    assert got.mesh_key == want.mesh_key
    # a damaged structured entry is rebuilt from the sample entry, not from the file
    _entry_path(ds, 4, STRUCTURED).write_bytes(b"garbage")
    reader.calls.clear()
    assert torch.equal(ds[4].mesh_enc, want.mesh_enc) and reader.calls == []
    # another model setting: other entries
    other = PiT(1, 1, width=8, blocks=1, num_latent=4).double()
    ds2 = ds.with_structures(other.mesh_transform(), progress=False)
    assert ds2.records[0].structured != ds.records[0].structured
    assert ds2[0].mesh_latent.numel() == 4


def _build_in_child(data, cache, start, out):
    reader = FolderReader(data, ["f"], ["u"], torch.float64)
    start.wait()                                        # both processes build at once
    ds = MeshCache(cache).dataset(reader.files, reader, SETTINGS, progress=False)
    out.put(sum(float(ds[i].y.sum()) for i in range(len(ds))))


def test_two_processes_building_one_cache_at_once(tmp_path):
    import multiprocessing as mp

    data = _folder(tmp_path / "data", 16)
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_build_in_child, args=(data, tmp_path / "c", start, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    sums = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    reader = FolderReader(data, ["f"], ["u"], torch.float64)
    want = sum(float(reader(f)[0].y.sum()) for f in reader.files)
    assert sums == [want, want]
    entries = list((tmp_path / "c" / SAMPLE).rglob("*"))
    assert len([p for p in entries if p.suffix == ".entry"]) == 16
    assert not [p for p in entries if p.name.startswith(".")]      # no temporary left
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    assert all(_equal(ds[i], reader(reader.files[i])[0]) for i in range(16))


# --------------------------------------------------------------------------- CLI
def _train(data, out, *extra):
    return cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u",
                     *SMALL_PIT, "--epochs", "2", "--batch-size", "3", "--dtype", "float64",
                     "--val-fraction", "0.25", "--seed", "1", "--out", str(out), *extra])


def test_lazy_training_in_worker_processes_is_training_in_memory(tmp_path, capsys):
    data = _folder(tmp_path / "data", 8)
    assert _train(data, tmp_path / "mem", "--no-lazy") == 0
    assert _train(data, tmp_path / "lazy", "--cache", str(tmp_path / "c"), "--workers",
                  "2") == 0
    out = capsys.readouterr().out
    assert f"reading the data lazily through the cache {tmp_path / 'c'}/ with 2 worker" in out
    mem = json.loads((tmp_path / "mem" / "history.json").read_text())
    lazy = json.loads((tmp_path / "lazy" / "history.json").read_text())
    assert len(mem) == len(lazy) == 2   # both ran their 2 epochs: zip compares them all
    for a, b in zip(mem, lazy):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-12, abs=0)
        assert a["val_l2"] == pytest.approx(b["val_l2"], rel=1e-12, abs=0)
    assert len(list((tmp_path / "c" / STRUCTURED).rglob("*.entry"))) == 8
    cfg = (tmp_path / "lazy" / "config.yaml").read_text()
    assert f"cache: {tmp_path / 'c'}" in cfg and "workers: 2" in cfg


def test_lazy_mode_is_chosen_when_the_data_would_not_fit(tmp_path, capsys, monkeypatch):
    from meshops.fitting import data as fit_data

    data = _folder(tmp_path / "data", 4)
    monkeypatch.setenv("MESHOPS_CACHE_DIR", str(tmp_path / "auto"))
    monkeypatch.setattr(fit_data, "available_memory", lambda: 1000)
    code = cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u",
                     *SMALL_PIT, "--epochs", "1", "--dry-run", "--workers", "0"])
    err = capsys.readouterr().err
    assert code == 0
    assert f"through the cache {tmp_path / 'auto'}/" in err
    assert "of the 0.0 GB of available memory (--no-lazy reads it into memory anyway)" in err
    assert len(list((tmp_path / "auto" / SAMPLE).rglob("*.entry"))) == 4
    monkeypatch.setattr(fit_data, "available_memory", lambda: 10 ** 12)
    code = cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u",
                     *SMALL_PIT, "--epochs", "1", "--dry-run"])
    assert code == 0 and "lazily" not in capsys.readouterr().err


def test_cache_with_no_lazy_and_shape_mismatch_are_one_line_errors(tmp_path, capsys):
    data = _folder(tmp_path / "data", 4)
    code = cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u",
                     "--cache", str(tmp_path / "c"), "--no-lazy", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot be combined with --no-lazy" in err
    pts, cells = square_mesh(3)
    write_mesh(data / "s03.vtu", mesh_from_arrays(pts, cells, {
        "f": np.stack([pts[:, 0]] * 2, 1), "u": pts[:, 0] + 1}))
    code = cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u",
                     "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "s03.vtu: inputs/targets have 2/1 channels but s00.vtu has 1/1" in err
    assert len(err.strip().splitlines()) == 1


class _PidLog(torch.utils.data.Dataset):
    """Samples that note which process read them (a file per reading process)."""

    def __init__(self, folder: Path, n: int = 8):
        self.folder, self.n = folder, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from meshops.mesh.data import MeshData

        (self.folder / str(os.getpid())).touch()
        pos = torch.rand(5, 2)
        return MeshData(pos=pos, weight=torch.full((5,), 0.2), x=pos[:, :1], y=pos[:, 1:] + 1)


def test_an_epoch_reads_in_exactly_num_workers_processes(tmp_path):
    """tqdm.auto's bar called iter() on the loader itself once more: a second set of
    workers started and read batches that nobody used."""
    from meshops.models import TransformerNO
    from meshops.training import Trainer

    log = tmp_path / "pids"
    log.mkdir()
    model = TransformerNO(1, 1, width=8, layers=1, heads=2)
    trainer = Trainer(model, _PidLog(log), epochs=1, batch_size=2, num_workers=1, log=None,
                      progress=True, normalize=False)
    trainer.fit()
    workers = {p.name for p in log.iterdir()} - {str(os.getpid())}   # (the Trainer
    assert len(workers) == 1                            # checks sample 0 itself)


def test_a_full_disk_while_caching_is_one_line_and_leaves_no_entry(tmp_path):
    """Issue 28: writing an entry on a full disk ended in torch.save's "basic_ios::clear:
    iostream error" traceback. The file-size limit (``ulimit -f``) makes every write
    past 1 KB fail as a full disk does (EFBIG; Python ignores SIGXFSZ); the entries
    (larger, as the end checks) cannot be written."""
    import resource
    import subprocess
    import sys

    data = _folder(tmp_path / "data", 4)
    cache, out = tmp_path / "cache", tmp_path / "run"
    argv = [sys.executable, "-m", "meshops", "train", "--data", str(data), "--inputs", "f",
            "--targets", "u", "--model", "transformer_no", "--model-config", "width=8",
            "layers=1", "heads=2", "--epochs", "1", "--cache", str(cache), "--workers", "0",
            "--logger", "none", "--out", str(out)]

    most = 1024

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (most, most))

    done = subprocess.run(argv, preexec_fn=limit, capture_output=True, text=True, timeout=300)
    err = done.stderr
    assert done.returncode == 2 and one_line_error(err), err
    assert f"meshops: error: {cache}: cannot write the cache entry of " in err
    assert "File too large" in err and "nothing half-written is kept" in err
    left = [p for p in cache.rglob("*") if p.is_file()]
    assert [p.name for p in left] == ["meshops-cache.json"], left  # the folder's marker
    # the same command with room to write builds the cache and trains
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    entries = list((cache / SAMPLE).rglob("*.entry"))
    assert len(entries) == 4 and all(p.stat().st_size > most for p in entries)


def test_lazy_reading_workers_leave_the_training_step_two_cores():
    from meshops.fitting.data import default_workers

    assert [default_workers(c) for c in (None, 1, 2, 3, 4, 16)] == [0, 0, 0, 1, 2, 2]


def test_a_cache_finds_a_load_and_fits_per_unit_normalisers_from_its_moments(tmp_path):
    """Meshes whose target is linear in a load c (an input constant over each mesh): the
    cache says so from its recorded moments, as the samples do, and its output
    normaliser per unit load equals the one fitted on the samples."""
    root = tmp_path / "loaded"
    root.mkdir()
    for k, c in enumerate(np.linspace(0.5, 3.0, 6)):
        mesh = _mesh(k, scale=c)
        mesh.fields["c"] = torch.full((mesh.pos.shape[0],), float(c), dtype=torch.float64)
        write_mesh(root / f"s{k:02d}.vtu", mesh)

    class LoadReader(FolderReader):
        def __init__(self, root):
            super().__init__(root, ["f", "c"], ["u"], torch.float64)

    reader = LoadReader(root)
    ds = MeshCache(tmp_path / "c").dataset(reader.files, reader, SETTINGS, progress=False)
    samples = [ds[i] for i in range(len(ds))]
    facts = data_facts(ds)
    assert facts == data_facts(samples) and facts["proportional"][0] == 1
    got = fit_normalizers(ds, scale_by=1)[1]
    want = fit_normalizers(samples, scale_by=1)[1]
    assert got.scale_channel == want.scale_channel == 1
    torch.testing.assert_close(got.mean, want.mean, rtol=1e-12, atol=0)
    torch.testing.assert_close(got.std, want.std, rtol=1e-12, atol=0)
