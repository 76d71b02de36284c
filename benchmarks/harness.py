"""Measurement machinery: machine info, isolated runs, timing, peak memory, series.

Every measurement runs in a fresh process forked from a *forkserver* that has
already imported torch, torch_geometric and meshops (importing them takes 5-15 s
on a loaded 2-core machine; forking takes ~0.1 s).  A child is a new address
space, so its memory figures are its own:

* **CPU peak memory** = ``VmHWM - VmRSS`` around the measured call.  Before the
  call the child frees what it can (``gc``, glibc ``malloc_trim``) and resets its
  high-water mark (``echo 5 > /proc/self/clear_refs``), so the figure is the
  extra resident memory the operation needed on top of its inputs and parameters,
  as the kernel counts it (tracemalloc does not see torch's allocator).  Library
  initialisation is excluded by a warm-up on a small problem first.
* **GPU peak memory** = ``torch.cuda.max_memory_allocated()`` minus the memory
  allocated before the call.
* **Time** = the median of several runs after one warm-up run; when a case has a
  library path and a dense reference, their runs are *interleaved* in one child
  so that load changes hit both and their ratio stays meaningful on a noisy
  machine.

Budgets: each child runs under ``RLIMIT_DATA`` = its data size at start plus the
memory budget (an allocation beyond fails at once with "can't allocate memory"
instead of swapping or OOM-killing other work), and a wall-clock timeout.  A
series over ``N`` stops for a (case, implementation, mode) when one run exceeds
the time budget or the memory budget, or when the time predicted from the last
two sizes would exceed the time budget.

The load on the machine is recorded with every measurement: the 1-minute load
average when the child starts, and ``foreign_cpu``, the average number of cores
kept busy by *other* processes while it ran (``/proc/stat`` busy time minus the
child's own CPU time, divided by the wall time).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import math
import multiprocessing as mp
import os
import platform
import resource
import statistics
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

GB = 1 << 30
MB = 1 << 20

#: Modules imported once by the forkserver (every child inherits them).
PRELOAD = ["torch", "torch_geometric", "numpy", "scipy.spatial", "meshops", "meshops.nn",
           "meshops.models", "meshops.training", "benchmarks.harness", "benchmarks.layers",
           "benchmarks.search", "benchmarks.models", "benchmarks.gpu"]


# ============================================================ machine information
def _read_kv(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open(path) as fh:
            for line in fh:
                if ":" in line:
                    k, v = line.split(":", 1)
                    out.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return out


def cpu_model() -> str:
    info = _read_kv("/proc/cpuinfo")
    return info.get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the host's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def meminfo_gb(key: str) -> Optional[float]:
    v = _read_kv("/proc/meminfo").get(key)
    return round(int(v.split()[0]) / (1 << 20), 2) if v else None


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return [float("nan")] * 3


def _git(*args: str) -> Optional[str]:
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except Exception:  # noqa: BLE001 - git missing is fine
        return None


def commit() -> str:
    """The repository's short commit, with ``+`` when tracked files differ from it."""
    head = _git("rev-parse", "--short", "HEAD") or "?"
    return head + ("+" if _git("status", "--porcelain", "--untracked-files=no") else "")


def device_kind(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


def gpu_info(device: str) -> Optional[dict[str, Any]]:
    """Name, memory and capability of the CUDA device, or None without one."""
    import torch

    if device_kind(device) != "cuda" or not torch.cuda.is_available():
        return None
    idx = torch.device(device).index or 0
    p = torch.cuda.get_device_properties(idx)
    return {"name": p.name, "memory_gb": round(p.total_memory / GB, 1),
            "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
            "cuda": torch.version.cuda}


def machine_info(device: str) -> dict[str, Any]:
    import torch

    gpu = gpu_info(device)
    return {
        "cpu": cpu_model(),
        "cores": cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gb": meminfo_gb("MemTotal"),
        "memory_available_gb": meminfo_gb("MemAvailable"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
        "device_kind": device_kind(device),
        "gpu": gpu["name"] if gpu else "none",
        "gpu_info": gpu,
        "loadavg": loadavg(),
        "git_commit": _git("rev-parse", "HEAD"),
    }


def machine_class(info: dict[str, Any]) -> str:
    """``"cpu-2core"``: the device kind and core count, the key a baseline must match."""
    return f"{info['device_kind']}-{info['cores']}core"


def busy_cores(seconds: float = 5.0) -> float:
    """Average number of busy cores over the next ``seconds`` (``/proc/stat``)."""
    b0, t0 = cpu_busy_seconds(), time.monotonic()
    time.sleep(seconds)
    return round((cpu_busy_seconds() - b0) / (time.monotonic() - t0), 2)


#: seconds spent in :func:`wait_quiet` by this process (reported as ``waited_s``)
WAITED = [0.0]


def wait_quiet(max_busy: float, max_wait_s: float, log: Callable[[str], None]) -> float:
    """Wait until fewer than ``max_busy`` cores are busy (10 s average; nothing of ours
    runs meanwhile) or ``max_wait_s`` has passed; returns the last busy figure."""
    t0 = time.monotonic()
    try:
        while True:
            busy = busy_cores(10.0)
            if busy <= max_busy or time.monotonic() - t0 >= max_wait_s:
                return busy
            time.sleep(5.0)
    finally:
        WAITED[0] += time.monotonic() - t0


def wait_for_load(max_load: float, max_wait_s: float, log: Callable[[str], None]
                  ) -> dict[str, Any]:
    """Sleep until the machine is quiet: the 1-minute load average is below ``max_load``,
    or the cores busy over the last 10 s average below ``max_load / 5`` (the load
    average lags: it stays high for a minute after our own previous run).  Waits at most
    ``max_wait_s``; returns what it saw."""
    t0 = time.monotonic()
    while True:
        la = loadavg()
        busy = busy_cores(10.0)
        quiet = la[0] <= max_load or busy <= max_load / 5
        if quiet or time.monotonic() - t0 >= max_wait_s:
            return {"loadavg": la, "busy_cores_10s": busy, "quiet": quiet,
                    "waited_s": round(time.monotonic() - t0, 1)}
        log(f"load average {la}, {busy} cores busy: above {max_load}; waiting ...")
        time.sleep(20.0)


# ====================================================== process memory (in a child)
def _status_kb(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes() -> int:
    kb = _status_kb("VmRSS")
    if kb is None:  # pragma: no cover - non-Linux fallback (peak, not current)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return kb * 1024


def hwm_bytes() -> int:
    kb = _status_kb("VmHWM")
    if kb is None:  # pragma: no cover
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return kb * 1024


def reset_hwm() -> bool:
    """Reset this process's RSS high-water mark to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def malloc_trim() -> None:
    """Hand freed heap memory back to the OS (glibc), so RSS reflects live memory."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # pragma: no cover - not glibc
        pass


def cpu_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``)."""
    try:
        with open("/proc/stat") as fh:
            vals = [int(v) for v in fh.readline().split()[1:]]
    except OSError:  # pragma: no cover
        return 0.0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return (sum(vals[:8]) - idle) / os.sysconf("SC_CLK_TCK")


# ================================================================ timing primitives
def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    msg = str(exc).lower()
    return any(s in msg for s in ("can't allocate memory", "cannot allocate memory",
                                  "out of memory", "not enough memory", "error code 12"))


def sync(device: str) -> None:
    if device_kind(device) == "cuda":
        import torch
        torch.cuda.synchronize()


def _time_once(fn: Callable[[], Any], device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    dt = time.perf_counter() - t0
    del out
    return dt


def _failure(exc: BaseException) -> dict[str, Any]:
    gc.collect()
    malloc_trim()
    if is_oom(exc):
        return {"status": "oom", "error": str(exc).splitlines()[0][:300]}
    return {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500],
            "traceback": traceback.format_exc()[-2000:]}


def time_interleaved(jobs: dict[Any, Callable[[], Any]], device: str, *, reps: int,
                     rep_budget_s: float, max_run_s: float) -> dict[Any, dict[str, Any]]:
    """Median wall time of every job, runs interleaved (``a b a b ...``).

    Each job is run once as a warm-up (its time estimates the cost); a job whose
    warm-up exceeds ``max_run_s`` is reported with that single time
    (``status="over_time"``).  The others get ``min(reps, rep_budget_s / t_warmup)``
    (at least 1) timed runs, taken in round-robin order.
    """
    results: dict[Any, dict[str, Any]] = {}
    samples: dict[Any, list[float]] = {}
    target: dict[Any, int] = {}
    warm: dict[Any, float] = {}
    for key, fn in jobs.items():
        try:
            t = _time_once(fn, device)
        except Exception as exc:  # noqa: BLE001 - reported per job
            results[key] = _failure(exc)
            continue
        warm[key] = t
        if t > max_run_s:
            results[key] = {"status": "over_time", "median_s": t, "min_s": t, "reps": 1,
                            "warmup_only": True}
            continue
        samples[key] = []
        target[key] = max(1, min(reps, int(rep_budget_s / max(t, 1e-6))))
    pending = list(target)
    while pending:
        for key in list(pending):
            if len(samples[key]) >= target[key]:
                pending.remove(key)
                continue
            try:
                samples[key].append(_time_once(jobs[key], device))
            except Exception as exc:  # noqa: BLE001
                results[key] = _failure(exc)
                pending.remove(key)
    for key, s in samples.items():
        if key in results or not s:
            continue
        results[key] = {"status": "ok", "median_s": statistics.median(s), "min_s": min(s),
                        "max_s": max(s), "reps": len(s), "warmup_s": warm[key]}
    return results


def measure_peak(fn: Callable[[], Any], device: str) -> dict[str, Any]:
    """Extra peak memory of one call of ``fn`` (see the module docstring)."""
    gc.collect()
    if device_kind(device) == "cuda":
        import torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return {"status": "ok", "peak_bytes": int(peak), "method": "cuda.max_memory_allocated",
                "time_s": dt}
    malloc_trim()
    base = rss_bytes()
    exact = reset_hwm()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    peak = hwm_bytes() - base
    del out
    return {"status": "ok", "peak_bytes": int(max(peak, 0)), "time_s": dt,
            "method": "VmHWM-VmRSS" + ("" if exact else " (HWM not reset: upper bound)")}


# =========================================================================== runner
class Runner:
    """A benchmarkable computation: ``fwd()`` (no grad) and ``fwdbwd()`` (forward, then
    backward of the sum of the output into the parameters and ``grad_inputs``)."""

    def __init__(self, forward: Callable[[], Any], params=(), grad_inputs=(),
                 meta: Optional[dict[str, Any]] = None) -> None:
        self.forward = forward
        self.params = list(params)
        self.grad_inputs = list(grad_inputs)
        self.meta = dict(meta or {})

    def _zero(self) -> None:
        for t in self.params:
            t.grad = None
        for t in self.grad_inputs:
            t.grad = None

    def fwd(self):
        import torch

        self._zero()
        with torch.no_grad():
            return self.forward()

    def fwdbwd(self):
        self._zero()
        out = self.forward()
        out.float().sum().backward()
        return None

    def run(self, mode: str):
        return self.fwd() if mode == "fwd" else self.fwdbwd()


# ===================================================================== child side
def _set_data_limit(limit: Optional[int]) -> None:
    if not limit:
        return
    try:
        data = (_status_kb("VmData") or 0) * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        new = data + int(limit) + 256 * MB
        if hard != resource.RLIM_INFINITY:
            new = min(new, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (new, hard))
    except (ValueError, OSError):  # pragma: no cover
        pass


def _child_main(conn, target: str, spec: dict[str, Any], mem_limit: Optional[int],
                threads: Optional[int] = None) -> None:
    try:
        if threads:
            import torch
            torch.set_num_threads(threads)
        if device_kind(spec.get("device", "cpu")) != "cuda":
            _set_data_limit(mem_limit)
        mod_name, fn_name = target.split(":")
        fn = getattr(importlib.import_module(mod_name), fn_name)
        res = fn(spec)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        res = _failure(exc)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    res["cpu_s"] = ru.ru_utime + ru.ru_stime
    try:
        conn.send(res)
    finally:
        conn.close()


class Isolated:
    """Runs ``module:function(spec)`` in a fresh process forked from a forkserver."""

    def __init__(self, preload: Optional[list[str]] = None, threads: Optional[int] = None,
                 start_method: str = "forkserver") -> None:
        self.threads = threads
        # CUDA runs need "spawn": a preloaded module that asks torch (or the driver) whether
        # a GPU exists initialises the driver in the forkserver, and its forked children
        # then fail their first CUDA call with "initialization error" (seen on an H100).
        self.ctx = mp.get_context(start_method)
        if start_method != "forkserver":
            return
        mods = []
        for m in (PRELOAD if preload is None else preload):
            try:
                importlib.util.find_spec(m)
                mods.append(m)
            except (ImportError, ValueError):
                pass
        self.ctx.set_forkserver_preload(mods)

    def run(self, target: str, spec: dict[str, Any], timeout: float,
            mem_limit: Optional[int] = None) -> dict[str, Any]:
        if mem_limit:
            avail = meminfo_gb("MemAvailable")
            if avail is not None:  # never let a child push the machine into swapping/OOM
                mem_limit = int(min(mem_limit, max(avail - 2.0, 0.5) * GB))
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_child_main,
                                args=(send, target, spec, mem_limit, self.threads), daemon=True)
        la = loadavg()
        busy0 = cpu_busy_seconds()
        t0 = time.perf_counter()
        proc.start()
        send.close()
        res: Optional[dict[str, Any]] = None
        timed_out = False
        try:
            if recv.poll(timeout):
                res = recv.recv()
            else:
                timed_out = True
        except (EOFError, OSError):
            res = None
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
        wall = time.perf_counter() - t0
        busy = cpu_busy_seconds() - busy0
        if res is None:
            if timed_out:
                res = {"status": "timeout", "error": f"no result within {timeout:.0f} s"}
            else:
                code = proc.exitcode
                why = " (killed: out of memory?)" if code == -9 else ""
                res = {"status": "crashed", "error": f"child exited with code {code}{why}"}
        recv.close()
        res["load1"] = la[0]
        res["wall_s"] = round(wall, 3)
        if "cpu_s" in res and wall > 0:
            res["foreign_cpu"] = round(max(busy - res["cpu_s"], 0.0) / wall, 2)
        res["mem_limit"] = mem_limit
        return res


def selftest_alloc(spec: dict[str, Any]) -> dict[str, Any]:
    """Child used by the tests: peak memory of allocating and touching ``spec["mb"]`` MiB."""
    import numpy as np

    def work():
        a = np.ones(int(spec["mb"]) << 17)       # MiB of float64
        return float(a.sum())

    return measure_peak(work, "cpu")


# ========================================================================== series
@dataclass
class Case:
    """A benchmark case: a builder evaluated at sizes ``N`` for implementations/modes.

    ``builder`` is ``"module:function"``; the function is called in the child as
    ``function(n, impl, device, **params)`` and returns a :class:`Runner`.
    """

    suite: str
    name: str
    builder: str
    sizes: list[int]
    quick_sizes: list[int]
    impls: tuple[str, ...] = ("lib", "ref")
    modes: tuple[str, ...] = ("fwd", "fwdbwd")
    desc: str = ""
    ref_desc: str = ""
    batch: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    mem_budget: Optional[int] = None
    max_run_s: Optional[float] = None
    quick_max_run_s: Optional[float] = None
    warm_n: int = 256
    #: sizes a target needs: never skipped on a *predicted* time (only an actual run over
    #: a budget at a smaller size stops the series before them)
    must: tuple[int, ...] = ()
    must_impls: tuple[str, ...] = ("lib",)
    must_modes: tuple[str, ...] = ("fwd", "fwdbwd")

    def needs(self, n: int, impl: str, mode: str) -> bool:
        """Whether a target needs this size, implementation and mode."""
        return n in self.must and impl in self.must_impls and mode in self.must_modes


@dataclass
class Budget:
    max_run_s: float
    mem_budget: int
    reps: int
    rep_budget_s: float
    setup_timeout_s: float = 180.0
    #: re-measure a point when other processes kept more than this many cores busy
    #: during its timing run (None: never); at most ``retries`` times, each after
    #: waiting up to ``retry_wait_s`` for a quiet machine
    max_foreign: Optional[float] = None
    retries: int = 2
    retry_wait_s: float = 600.0


def case_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Child entry point: time (``kind="time"``) or memory (``kind="mem"``) of a case."""
    import torch

    torch.manual_seed(0)
    mod_name, fn_name = spec["builder"].split(":")
    build = getattr(importlib.import_module(mod_name), fn_name)
    device, params = spec["device"], spec.get("params", {})
    n = spec["n"]
    if spec["kind"] == "mem":
        impl, mode = spec["impl"], spec["mode"]
        warm_n = min(n, spec.get("warm_n", 256))
        try:  # initialise libraries (thread pools, kernels) on a small problem first
            r = build(warm_n, impl, device, **params)
            r.run(mode)
            del r
        except Exception:  # noqa: BLE001 - the real run reports errors
            pass
        try:
            runner = build(n, impl, device, **params)
            res = measure_peak(lambda: runner.run(mode), device)
            res["meta"] = runner.meta
            return res
        except Exception as exc:  # noqa: BLE001
            return _failure(exc)
    runners: dict[str, Runner] = {}
    out: dict[str, Any] = {"status": "ok", "results": {}, "meta": {}}
    for impl in sorted({k[0] for k in spec["keys"]}):
        try:
            runners[impl] = build(n, impl, device, **params)
            out["meta"][impl] = runners[impl].meta
        except Exception as exc:  # noqa: BLE001
            for k in spec["keys"]:
                if k[0] == impl:
                    out["results"]["/".join(k)] = _failure(exc)
    jobs = {tuple(k): (lambda r=runners[k[0]], m=k[1]: r.run(m))
            for k in spec["keys"] if k[0] in runners}
    res = time_interleaved(jobs, device, reps=spec["reps"], rep_budget_s=spec["rep_budget_s"],
                           max_run_s=spec["max_run_s"])
    for k, v in res.items():
        out["results"]["/".join(k)] = v
    return out


def predict_time(history: list[tuple[int, float]], n: int) -> Optional[float]:
    """Time at ``n`` extrapolated from the last two measured sizes (exponent clamped to
    [1, 3]); from one size, linear extrapolation (a lower bound for super-linear costs)."""
    pts = [(a, t) for a, t in history if t is not None and t > 0]
    if not pts:
        return None
    n2, t2 = pts[-1]
    if len(pts) >= 2 and t2 > 0.02:
        n1, t1 = pts[-2]
        p = math.log(t2 / t1) / math.log(n2 / n1) if n2 != n1 and t1 > 0 else 1.0
        p = min(max(p, 1.0), 3.0)
    else:
        p = 1.0
    return t2 * (n / n2) ** p


def run_series(iso: Isolated, case: Case, budget: Budget, device: str, quick: bool,
               log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Measure ``case`` over its sizes; one result row per (impl, N)."""
    sizes = case.quick_sizes if quick else case.sizes
    max_run_s = case.max_run_s if case.max_run_s is not None else budget.max_run_s
    if quick:
        max_run_s = max(budget.max_run_s, case.quick_max_run_s or 0.0)
    mem_budget = case.mem_budget if case.mem_budget is not None else budget.mem_budget
    keys = [(i, m) for i in case.impls for m in case.modes]
    alive = {k: True for k in keys}
    why_stopped: dict[tuple[str, str], str] = {}
    hist: dict[tuple[str, str], list[tuple[int, float]]] = {k: [] for k in keys}
    rows: list[dict[str, Any]] = []
    for n in sizes:
        rowmap: dict[str, dict[str, Any]] = {}

        def row(impl: str) -> dict[str, Any]:
            if impl not in rowmap:
                rowmap[impl] = {"suite": case.suite, "case": case.name, "impl": impl, "n": n,
                                "batch": case.batch, "desc": case.ref_desc if impl == "ref"
                                else case.desc, "notes": []}
            return rowmap[impl]

        def keep_rows() -> None:
            for impl in case.impls:
                if impl in rowmap:
                    log(format_progress(rowmap[impl]))
                    rows.append(rowmap[impl])

        skip_now = set()
        for k in keys:
            if alive[k]:
                pred = predict_time(hist[k], n)
                if pred is not None and pred > max_run_s and not case.needs(n, *k):
                    # Skip this size; keep the series alive if a size a target needs
                    # comes later (the prediction is no reason to give that one up).
                    skip_now.add(k)
                    if not any(case.needs(m, *k) for m in case.must if m > n):
                        alive[k] = False
                        why_stopped[k] = (f"skipped from N={n}: predicted {pred:.1f} s > "
                                          f"{max_run_s:g} s")
                    row(k[0])[f"{k[1]}_status"] = "skipped"
                    row(k[0])["notes"].append(f"{k[1]}: predicted {pred:.3g} s > budget")
        todo = [k for k in keys if alive[k] and k not in skip_now]
        if not todo:   # nothing to measure at this size: keep its "skipped" rows
            keep_rows()
            if not any(alive.values()):
                break
            continue
        spec = {"builder": case.builder, "n": n, "device": device, "params": case.params,
                "kind": "time", "keys": [list(k) for k in todo], "reps": budget.reps,
                "rep_budget_s": budget.rep_budget_s, "max_run_s": max_run_s,
                "warm_n": case.warm_n}
        timeout = budget.setup_timeout_s + len(todo) * max_run_s * (budget.reps + 2)
        for attempt in range(budget.retries + 1):
            res = iso.run("benchmarks.harness:case_child", spec, timeout, mem_budget)
            f = res.get("foreign_cpu")
            if budget.max_foreign is None or f is None or f <= budget.max_foreign \
                    or attempt == budget.retries:
                break
            log(f"    N={n}: {f} cores busy with other work during the run (> "
                f"{budget.max_foreign}); waiting for a quiet machine, then measuring again")
            wait_quiet(budget.max_foreign, budget.retry_wait_s, log)
        res["attempts"] = attempt + 1
        top_fail = res.get("status") != "ok"
        for k in todo:
            r = row(k[0])
            r["load1"] = res.get("load1")
            r["foreign_cpu"] = res.get("foreign_cpu")
            r["attempts"] = res.get("attempts", 1)
            r.setdefault("meta", (res.get("meta") or {}).get(k[0], {}))
            kr = res if top_fail else res["results"].get("/".join(k), {"status": "missing"})
            st = kr.get("status", "error")
            r[f"{k[1]}_status"] = st
            if kr.get("median_s") is not None:
                r[f"{k[1]}_s"] = kr["median_s"]
                r[f"{k[1]}_min_s"] = kr.get("min_s")
                r[f"{k[1]}_reps"] = kr.get("reps")
                hist[k].append((n, kr["median_s"]))
            if st not in ("ok",):
                alive[k] = False
                why_stopped[k] = f"stopped at N={n}: {st}"
                err = kr.get("error")
                r["notes"].append(f"{k[1]}: {st}" + (f" ({err})" if err else "")
                                  + (f" > {max_run_s:g} s" if st == "over_time" else ""))
            elif kr["median_s"] > max_run_s:
                alive[k] = False
                why_stopped[k] = f"stopped after N={n}: {kr['median_s']:.1f} s > {max_run_s:g} s"
        # memory: a fresh child per (impl, mode) that completed a timed run (in --quick
        # mode only when that run was within the time budget)
        for k in todo:
            r = row(k[0])
            if r.get(f"{k[1]}_s") is None:
                continue
            if quick and r.get(f"{k[1]}_status") != "ok":
                r["notes"].append(f"{k[1]} memory: not measured (over time, --quick)")
                continue
            mspec = {"builder": case.builder, "n": n, "device": device, "params": case.params,
                     "kind": "mem", "impl": k[0], "mode": k[1], "warm_n": case.warm_n}
            t_est = r[f"{k[1]}_s"]
            mres = iso.run("benchmarks.harness:case_child", mspec,
                           budget.setup_timeout_s + 3 * t_est + 30, mem_budget)
            if mres.get("status") == "ok":
                r[f"{k[1]}_mem"] = mres["peak_bytes"]
                r["mem_method"] = mres.get("method")
                if mres["peak_bytes"] > mem_budget:
                    alive[k] = False
                    why_stopped[k] = f"stopped after N={n}: memory over budget"
            else:
                r[f"{k[1]}_mem_status"] = mres.get("status")
                r["notes"].append(f"{k[1]} memory: {mres.get('status')} "
                                  f"({mres.get('error', '')[:120]})")
                if mres.get("status") == "oom":
                    alive[k] = False
                    why_stopped[k] = f"stopped at N={n}: memory > {mem_budget / GB:.1f} GB budget"
        keep_rows()
    for k, why in why_stopped.items():
        log(f"  [{case.name}/{k[0]}/{k[1]}] {why}")
    return rows


def format_progress(r: dict[str, Any]) -> str:
    def t(mode: str) -> str:
        v = r.get(f"{mode}_s")
        return f"{v * 1e3:9.1f} ms" if v is not None else f"{r.get(f'{mode}_status', '-'):>12}"

    def m(mode: str) -> str:
        v = r.get(f"{mode}_mem")
        return f"{v / MB:8.1f} MB" if v is not None else f"{'-':>11}"

    parts = [f"  {r['suite']:>8} {r['case']:<26} {r['impl']:<9} N={r['n']:<8}"]
    for mode, label in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
        if any(k.startswith(mode + "_") for k in r):
            parts.append(f"{label} {t(mode)} {m(mode)}")
    parts.append(f"load {r.get('load1')} foreign {r.get('foreign_cpu')}")
    return "  ".join(parts)
