"""``meshops build-kernels``: compile the fused CPU attention kernel ahead of time."""

from __future__ import annotations

import sys

from meshops.cli._common import wrap
from meshops.errors import UsageError


def cmd_build_kernels(args) -> int:
    """Compile the fused CPU attention kernel into its cache now, not at a first forward."""
    from meshops.kernels import (
        KernelBuildError,
        attention_kernel,
        build_attention_kernel,
        kernels_enabled,
    )
    from meshops.kernels.build import load_module

    try:
        built = build_attention_kernel(force=args.force)
        load_module(attention_kernel().name, built.path)  # one that will not load is no build
    except KernelBuildError as err:
        raise UsageError(f"cannot build the fused CPU attention kernel: {err}") from None
    how = "already built" if built.seconds is None else f"built in {built.seconds:.0f} s"
    print(f"fused CPU attention kernel: {built.path} ({how})")
    if not kernels_enabled():
        print("meshops: note: MESHOPS_KERNELS is off in this environment, so the layers will "
              "not use it", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "build-kernels", help="compile the fused CPU attention kernel ahead of time",
        description=wrap("Compile the fused CPU attention kernel (it takes minutes) into its "
        "cache, $TORCH_EXTENSIONS_DIR/meshops (default ~/.cache/torch_extensions/meshops), keyed "
        "by the source, torch version and Python ABI, so that no first forward pays for "
        "it. Prints the library's path and the time taken; exits 2 when it cannot be "
        "built. MESHOPS_KERNEL_TIMEOUT (seconds, default 600) bounds the wait for another "
        "process's build and the compile."))
    p.add_argument("--force", action="store_true",
                   help="compile again even if the cache has the kernel")
    p.set_defaults(func=cmd_build_kernels)
