"""Speed and memory benchmarks of meshops (``python -m benchmarks --help``).

One module per concern:

* :mod:`benchmarks.harness` - machine info, isolated measurements (a fresh
  forked process per measurement: median wall time after warm-up, peak memory as
  the RSS high-water mark above the process's baseline on CPU or
  ``torch.cuda.max_memory_allocated`` on GPU), budgets and series that stop when
  a run exceeds them;
* :mod:`benchmarks.layers` - every layer of :mod:`meshops.nn` against a plain dense
  implementation of the same formula, time and memory against ``N``;
* :mod:`benchmarks.search` - ``knn`` / ``fps`` / ``partition`` for every installed
  backend;
* :mod:`benchmarks.models` - every model of :mod:`meshops.models` (forward,
  forward+backward) and end-to-end training throughput with the
  :class:`~meshops.training.Trainer`;
* :mod:`benchmarks.gpu` - the fused-SDPA / FlexAttention TFLOP/s checks of continuum
  and position attention on CUDA (says "no GPU" elsewhere);
* :mod:`benchmarks.reporting` - tables, the JSON file and the log-log plot;
* :mod:`benchmarks.check` - the targets table (PASS/MISS) and the regression guard
  against a stored run of the same machine class.
"""

SCHEMA = "meshops-bench-1"
