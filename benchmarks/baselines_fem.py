"""Does a model trained by ``meshops train`` beat the baselines that need no training?

Writes the convection-diffusion stand-in (one fixed 3,136-node mesh, parameters
``kappa, wind_x, wind_y`` as constant input fields, target ``u``;
:mod:`data_adapters.standins.convdiff`) as a folder of ``.vtu`` files, trains with
``meshops train`` (its defaults, which fit the epochs to ``--minutes``, or the
options after ``--``) under a wall-clock budget, and prints the test error of
``best.pt`` next to the training-mean and nearest-sample baselines on the same test
samples and metric (``meshops evaluate``)::

    python -m benchmarks.baselines_fem [--samples 200] [--test 30] [--minutes 10] \
        [--out benchmarks/results/baselines-fem.txt] [-- --model pit --epochs 30 ...]

The whole log (commands and their output) is written to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.paths import portable


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200, help="samples in all (default 200)")
    p.add_argument("--test", type=int, default=30, help="test samples (default 30)")
    p.add_argument("--minutes", type=float, default=10.0, help="training budget (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="log file")
    args = p.parse_args(argv)

    from data_adapters import export_to_folder
    from data_adapters.standins.convdiff import INPUTS, make_convection_diffusion_standin

    log = []
    roots = {}  # the stored log names the data and the run by the work folder

    def say(text: str) -> None:
        print(text, flush=True)
        log.append(portable(text, roots))

    with tempfile.TemporaryDirectory(prefix="meshops-fem-") as tmp:
        tmp = roots["$WORK"] = Path(tmp)
        t0 = time.perf_counter()
        samples = make_convection_diffusion_standin(args.samples, seed=args.seed)
        export_to_folder(samples[:-args.test], tmp / "train")
        export_to_folder(samples[-args.test:], tmp / "test")
        say(f"# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
        say(f"# convection-diffusion stand-in: {args.samples - args.test} training / "
            f"{args.test} test samples of {samples[0].num_nodes} nodes (seed {args.seed}), "
            f"written in {time.perf_counter() - t0:.1f} s")
        train = [sys.executable, "-m", "meshops", "train", "--data", str(tmp / "train"),
                 "--inputs", ",".join(INPUTS), "--targets", "u", "--out", str(tmp / "run"),
                 # the default epoch count fits this budget; options after -- win
                 "--minutes", f"{args.minutes:g}", *extra]
        evaluate = [sys.executable, "-m", "meshops", "evaluate", str(tmp / "run"), "--data",
                    str(tmp / "test")]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        say("$ " + " ".join(train[1:]))
        t0 = time.perf_counter()
        proc = subprocess.Popen(train, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        deadline = t0 + 60 * args.minutes
        timed_out = False
        for line in proc.stdout:
            say(line.rstrip())
            if time.perf_counter() > deadline and proc.poll() is None:
                proc.terminate()
                timed_out = True
                break
        proc.wait()
        minutes = (time.perf_counter() - t0) / 60
        say(f"# training: {minutes:.1f} min wall, load average {os.getloadavg()[0]:.1f} at "
            f"the end" +
            (f" (stopped at the {args.minutes:g}-minute budget; best.pt is the best "
             f"validated epoch so far)" if timed_out else ""))
        if not (tmp / "run" / "best.pt").is_file():
            say("# no best.pt: nothing to evaluate")
            return 1
        say("$ " + " ".join(evaluate[1:]))
        res = subprocess.run(evaluate, capture_output=True, text=True, env=env)
        for line in (res.stdout + res.stderr).splitlines():
            say(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(log) + "\n")
    return res.returncode


if __name__ == "__main__":
    raise SystemExit(main())
