"""The side-by-side benchmark's reference modes, batch size, profiler summary and
report (benchmarks.reference), without the reference's repository or a GPU."""

import json
import math

import pytest
import torch
from test_reference import FAKE

from benchmarks.reference import CASES, PAPER_TRAIN, patch_script
from benchmarks.reference.__main__ import main, summarize, table
from benchmarks.reference.profiling import Event, profile_steps
from benchmarks.reference.profiling import summarize as profile_summary


def test_batch_size_replaces_the_scripts_only():
    out = patch_script(CASES["airfoil"], FAKE, "/d", 200, 40, batch_size=8)
    assert "batch_size  = 8" in out and "= 20" not in out
    assert "model = torch.compile(model)" in out
    # eager mode and batch size together
    out = patch_script(CASES["airfoil"], FAKE, "/d", 200, 40, compile=False, batch_size=8)
    assert "model = torch.compile(model)" not in out and "batch_size  = 8" in out


def _ev(name, kind, us, self_us=None):
    return Event(name, kind, float(us), float(us if self_us is None else self_us))


def test_profile_summary_counts_syncs_copies_and_kernels_per_step():
    """Two steps: per step one device synchronise (the harness), one stream synchronise
    (loss.item()), one blocking cudaMemcpy; 2 ms of sort and 1 ms of GEMM kernels, a
    host-to-device copy; the async memcpy and kernel launches are not syncs."""
    ev = []
    for _ in range(2):
        ev += [_ev("cudaDeviceSynchronize", "runtime", 100), _ev("cudaStreamSynchronize",
               "runtime", 50), _ev("cudaMemcpy", "runtime", 10),
               _ev("cudaMemcpyAsync", "runtime", 5), _ev("cudaLaunchKernel", "runtime", 3),
               _ev("void at::native::bitonicSortKVInPlace<float>", "device", 2000),
               _ev("sm90_xmma_gemm_f32", "device", 1000),
               _ev("Memcpy HtoD (Pageable -> Device)", "device", 300),
               _ev("aten::sort", "op", 2100, 40), _ev("aten::mm", "op", 1100, 20)]
    s = profile_summary(ev, steps=2, wall_s=0.02, counters={"frames": 1, "graph_breaks": 0})
    assert s["syncs"] == 3 and s["sync_calls"] == {
        "cudaDeviceSynchronize": 1, "cudaMemcpy": 1, "cudaStreamSynchronize": 1}
    assert s["sync_wait_s"] == pytest.approx(160e-6)
    assert s["copies"] == {"HtoD": {"n": 1, "s": pytest.approx(300e-6)}}
    assert s["device_s"] == pytest.approx(3300e-6) and s["wall_s"] == pytest.approx(0.01)
    assert s["device_busy"] == pytest.approx(0.33)
    assert s["sort_s"] == pytest.approx(2e-3) and s["kernels"] == 2
    assert [k["name"][:20] for k in s["top_kernels"]] == ["void at::native::bit",
                                                          "sm90_xmma_gemm_f32"]
    assert s["top_kernels"][0]["share"] == pytest.approx(2 / 3)
    assert s["top_ops"][0] == {"name": "aten::sort", "calls": 1, "self_s": pytest.approx(40e-6)}
    assert s["compiled_frames"] == 1


def test_profile_steps_on_the_cpu_writes_a_trace_and_sees_recompiles(tmp_path):
    """A real profile of CPU steps: the matrix product dominates the host operators
    and the Chrome trace is a complete JSON file; a torch.compile'd function that meets
    a new shape inside the profiled steps is counted as a compiled frame."""
    # large enough (about 1 GFLOP a product) that a preemption of the process during
    # the sum, on a loaded machine, cannot give the sum more self time than the product
    a = torch.randn(800, 800)
    trace = tmp_path / "t.json"
    s = profile_steps(lambda i: (a @ a).sum(), 2, "cpu", str(trace))
    assert s["steps"] == 2 and s["device_s"] == 0 and s["syncs"] == 0
    assert s["top_ops"][0]["name"] == "aten::mm" and s["top_ops"][0]["calls"] == 1
    assert s["compiled_frames"] == 0
    assert "traceEvents" in json.loads(trace.read_text())
    assert not list(tmp_path.glob("*.part"))
    f = torch.compile(lambda x: (x * 2).sum(), backend="eager", dynamic=False)
    s = profile_steps(lambda i: f(torch.ones(i + 3)), 2, "cpu", str(trace))
    assert s["compiled_frames"] == 2     # a new shape every step: two recompilations


def _result(sides, batch=20, cuda=True, failed=None):
    runs = {}
    for side, t in sides.items():
        runs[side] = [{"step_s": [t, t], "parameters": 1000, "threads": 8,
                       "dtype": "torch.float32", "matmul_precision": "high",
                       "compiled": side != "meshops" and side != "ref-eager",
                       "batch_size": batch}]
    return {"runs": runs, "failed": failed or {}, "batch": batch, "cuda": cuda}


def test_summary_compares_every_reference_mode_and_the_papers_epoch():
    r = summarize("airfoil", _result({"ref-compiled": 5.2, "ref-eager": 0.2, "meshops": 0.1}))
    assert r["ratio"] == {"ref-compiled": pytest.approx(52), "ref-eager": pytest.approx(2)}
    assert r["ref-eager"]["epoch_s"] == pytest.approx(0.2 * math.ceil(PAPER_TRAIN / 20))
    lines = "\n".join(table({"airfoil": r}))
    # 5.2 s/step x 50 steps = 260 s per epoch against the paper's 15.3 s: flagged
    assert "ref-compiled per 1,000-sample epoch 260.0 s vs the PiT paper's 15.3 s" in lines
    assert "16.99x  <- far slower than published: suspect the harness" in lines
    assert "ref-eager per 1,000-sample epoch 10.0 s" in lines and "0.65x\n" in lines + "\n"
    # on the CPU the GPU figure is not compared
    cpu = table({"airfoil": summarize("airfoil", _result({"ref-eager": 5, "meshops": 1},
                                                         cuda=False))})
    assert any("RTX 3090 figure: not compared on the CPU" in ln for ln in cpu)
    assert not any("suspect" in ln for ln in cpu)


def test_a_failed_mode_is_reported_and_the_others_still_compared():
    r = summarize("elasticity", _result({"ref-compiled": 2.0, "ref-eager": 1.0, "meshops": 0.5},
                                        failed={"ref-static": "exit 1:\nquantile symbolic"}))
    lines = table({"elasticity": r})
    assert any("ref-static   failed: exit 1:" in ln for ln in lines)
    assert r["ratio"] == {"ref-compiled": 4.0, "ref-eager": 2.0}
    gone = summarize("elasticity", _result({"ref-compiled": 2.0},
                                           failed={"meshops": "killed"}))
    assert gone["ratio"] == {} and gone["failed"] == {"meshops": "killed"}


@pytest.mark.parametrize("argv, message", [
    (["--reference-modes", "compiled,jit"], "--reference-modes: a comma-separated list"),
    (["--reference-modes", "eager,eager"], "--reference-modes: a comma-separated list"),
    (["--reference-modes", "eager", "--no-compile"], "--reference-modes replaces --no-compile"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--profile-steps", "0", "--profile", "x"], "--profile-steps must be >= 1"),
])
def test_cli_rejects_bad_modes_and_sizes(tmp_path, capsys, argv, message):
    (tmp_path / "train_elasticity.py").write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["--reference-dir", str(tmp_path), "--cases", "elasticity",
              "--work", str(tmp_path / "w")] + argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
