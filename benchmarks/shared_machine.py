"""A training step of the default model with 1 and with 2 threads, alone and beside a
process that keeps one core busy (issue 38: on a 2-core machine a run on 2 threads
went from 18 s to 388 s per epoch when another process took a core, one on 1 thread
from 30 s to 90 s).

    python -m benchmarks.shared_machine [--data elasticity] [--samples 16] [--reps 5]
        [--spin-seconds 300] --out FILE

The model and batch are those ``meshops train`` picks for the data (the neural
default, :func:`meshops.fitting.defaults.choose_defaults`); a step is the forward and
backward pass that ``meshops train`` times to plan its epochs and threads
(:func:`meshops.fitting.defaults.time_training_step`), timed ``--reps`` times after a
warm-up for each thread count, the counts alternating so that a change of load hits
both. First alone, then while a second Python process spins on one core: started by
this script, it stops by itself after ``--spin-seconds`` and is killed (by its own
process id) as soon as the timing ends, also on an error. The output says which
count :func:`meshops.fitting.defaults.fewest_threads` keeps in each case, and the
load averages before, between and after; ``--out`` writes it, with the command line,
completely or not at all. Take it on an otherwise quiet machine: the busy process
must be the only other load.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.harness import commit, loadavg
from benchmarks.paths import command
from benchmarks.throughput import DATA, load_samples

THREADS = (1, 2)
#: The busy process: a loop of Python on one core, ending by itself at its deadline.
SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def one_busy_core(seconds: float):
    """A process spinning on one core for the ``with`` block (at most ``seconds``)."""
    proc = subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=float(seconds))])
    try:
        yield proc.pid
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def default_model(samples: list):
    """``(name, model, batch size)`` of the neural default for ``samples``."""
    from meshops.fitting.defaults import choose_defaults
    from meshops.fitting.training_run import build_model

    # The neural default: a parametric study would get a reduced basis, which is
    # fitted, not trained by steps.
    name, model_cfg, train_cfg, _ = choose_defaults(samples, model="pit")
    s = samples[0]
    model = build_model(name, model_cfg, s.x.shape[1], s.y.shape[1], s.pos.shape[1])
    return name, model, train_cfg["batch_size"]


def time_steps(model, samples: list, batch: int, reps: int) -> dict[int, list[float]]:
    """Seconds of a step with each of :data:`THREADS`, ``reps`` times after a warm-up,
    the counts alternating."""
    import torch

    from meshops.fitting.defaults import time_training_step

    times: dict[int, list[float]] = {n: [] for n in THREADS}
    for rep in range(reps + 1):
        for n in THREADS:
            torch.set_num_threads(n)
            t = time_training_step(model, samples, batch, repeats=1)
            if rep:  # the first is the warm-up
                times[n].append(t)
    return times


def _lines(label: str, times: dict[int, list[float]]) -> list[str]:
    from meshops.fitting.defaults import fewest_threads

    median = {n: statistics.median(ts) for n, ts in times.items()}
    out = [f"{label}: {_on(n)} {median[n]:.4f} s/step (median; "
           f"{', '.join(f'{t:.4f}' for t in ts)})" for n, ts in times.items()]
    return out + [f"{label}: fewest_threads keeps {_on(fewest_threads(median))}"]


def _on(n: int) -> str:
    return f"{n} thread" + ("s" if n > 1 else "")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in loadavg())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.shared_machine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=DATA, default="elasticity")
    p.add_argument("--samples", type=int, default=16, help="stand-in samples (default 16)")
    p.add_argument("--reps", type=int, default=5, help="timed steps per count (default 5)")
    p.add_argument("--spin-seconds", type=float, default=300.0,
                   help="the busy process's own deadline (default 300)")
    p.add_argument("--out", type=Path, required=True,
                   help="write the output, with the command line, to this file")
    args = p.parse_args(argv)
    if args.samples < 1 or args.reps < 1 or args.spin_seconds <= 0:
        p.error("--samples and --reps must be >= 1, --spin-seconds > 0")
    import torch

    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    log(f"# {command('benchmarks.shared_machine', argv)}")
    log(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}, meshops {commit()}")
    log(f"# load before: {_load()} (1, 5, 15 min)")
    samples = load_samples(args.data, args.samples, None)
    name, model, batch = default_model(samples)
    log(f"{args.data} stand-in, {name} ({sum(q.numel() for q in model.parameters()):,} "
        f"parameters), batch {batch}")
    lines += _lines("alone", time_steps(model, samples, batch, args.reps))
    print("\n".join(lines[-len(THREADS) - 1:]), flush=True)
    log(f"# load before the busy process: {_load()}")
    with one_busy_core(args.spin_seconds) as pid:
        log(f"# busy process: pid {pid}")
        lines += _lines("one core busy", time_steps(model, samples, batch, args.reps))
    print("\n".join(lines[-len(THREADS) - 1:]), flush=True)
    log(f"# load after: {_load()}")
    from meshops.utils.atomic import atomic_write

    text = "\n".join(lines) + "\n"
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(text))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
