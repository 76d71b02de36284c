"""Build and cache compiled extensions without ever waiting without bound.

:func:`torch.utils.cpp_extension.load` builds in one shared folder per extension
name, guarded by a ``lock`` file that a killed build leaves behind; every later
load then waits for it forever (its ``FileBaton`` cannot tell a dead builder from
a slow one).  Here instead:

* the finished library lives in a folder keyed by everything that decides its
  binary (the source, the flags, the torch version and C++ ABI, the Python ABI and
  the CPU capability through the flags), so venvs and torch versions never rebuild
  over each other;
* a build runs in a child process in a private temporary folder beside that
  folder, and the library is moved in with an atomic rename: the cache holds a
  whole library or none;
* builders exclude each other with an OS file lock (``flock``, through
  :mod:`filelock`), which the OS releases when its holder dies, so a killed build
  leaves no stale lock; a waiter gives up after ``MESHOPS_KERNEL_TIMEOUT`` seconds
  (default 600), and so does a compile that runs longer.

The cache is ``$TORCH_EXTENSIONS_DIR/meshops`` (by default
``~/.cache/torch_extensions/meshops``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional

__all__ = ["Built", "Extension", "KernelBuildError", "KernelBuildTimeout", "build_lock",
           "build_timeout", "cache_root", "ensure_built", "load_module"]

TIMEOUT_ENV = "MESHOPS_KERNEL_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
#: prefix of the private build folders (removed by the next builder if a build was killed)
TMP_PREFIX = ".build-"
LOCK_NAME = "build.lock"

_LOG = logging.getLogger("meshops.kernels")

# The child that compiles: cpp_extension.load into a private folder (it also imports
# the result, which checks that it loads).  On Linux it gets SIGTERM when its parent
# dies and passes it to its process group: ninja forwards it to the compilers, which
# it runs in process groups of their own, so a killed parent leaves no compile running.
_CHILD = """\
import json, os, signal, sys
args = json.loads(sys.argv[1])
parent = args.pop("parent")
def stop(*_):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.killpg(0, signal.SIGTERM)
if sys.platform.startswith("linux"):
    import ctypes
    signal.signal(signal.SIGTERM, stop)
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl
        stop()
from torch.utils.cpp_extension import load
try:
    load(**args)
except Exception as err:
    sys.stderr.write(f"{type(err).__name__}: {err}")
    sys.exit(1)
"""


class KernelBuildError(RuntimeError):
    """The extension could not be built or loaded; the message says why."""


class KernelBuildTimeout(KernelBuildError):
    """Another process held the build lock, or the compile ran, past the time limit."""


@dataclass(frozen=True)
class Extension:
    """A C++ extension: its module name (the ``PyInit_`` symbol), sources and flags.

    Args:
        name: module name compiled into the library.
        sources: C++ source files.
        cflags: extra compiler flags.
        ldflags: extra linker flags.
        title: what the notices call it, e.g. ``"the fused CPU attention kernel"``.
    """

    name: str
    sources: tuple[Path, ...]
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    title: str = "the compiled kernel"

    def key(self) -> str:
        """Hash of everything that decides the binary."""
        import torch

        h = hashlib.sha256()
        for src in self.sources:
            h.update(Path(src).read_bytes())
        abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", "")
        parts = (self.name, *self.cflags, "|", *self.ldflags, torch.__version__,
                 str(torch.version.git_version), str(abi), sys.implementation.cache_tag,
                 str(sysconfig.get_config_var("EXT_SUFFIX")), platform.machine(),
                 os.environ.get("CXX", "c++"))
        for part in parts:
            h.update(part.encode() + b"\0")
        return h.hexdigest()[:16]

    def folder(self) -> Path:
        """Cache folder of this build (readable prefix, then the hash)."""
        import torch

        return cache_root() / (f"{self.name}-torch{torch.__version__}-"
                               f"{sys.implementation.cache_tag}-{self.key()}")

    def library(self) -> Path:
        """Where the finished library is (or will be)."""
        ext = ".pyd" if os.name == "nt" else ".so"  # cpp_extension's LIB_EXT
        return self.folder() / f"{self.name}{ext}"


@dataclass(frozen=True)
class Built:
    """A library in the cache: its path, and the compile time (None: it was there)."""

    path: Path
    seconds: Optional[float]


def cache_root() -> Path:
    """``$TORCH_EXTENSIONS_DIR/meshops``, or the same under PyTorch's default root."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        from torch.utils.cpp_extension import get_default_build_root

        root = get_default_build_root()
    return Path(root) / "meshops"


def build_timeout() -> float:
    """Seconds to wait for another builder, and for a compile (``MESHOPS_KERNEL_TIMEOUT``)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise KernelBuildError(f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds")
    return value


@contextmanager
def build_lock(path: Path, timeout: float, title: str = "a kernel") -> Iterator[None]:
    """Hold the OS lock ``path`` (created if missing), waiting at most ``timeout`` s.

    The OS drops the lock when its holder dies, so a lock left by a killed build is
    free at once.  Raises :class:`KernelBuildTimeout` past ``timeout``.
    """
    from filelock import FileLock, Timeout

    lock = FileLock(str(path))
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            _LOG.warning("meshops: another process is compiling %s (lock %s); waiting for it "
                         "at most %g s (%s sets the limit)", title, path, timeout, TIMEOUT_ENV)
            lock.acquire(timeout=timeout)
    except Timeout:
        raise KernelBuildTimeout(
            f"another process held the build lock {path} for more than {timeout:g} s "
            f"({TIMEOUT_ENV} sets the limit)") from None
    except OSError as err:
        raise KernelBuildError(f"cannot take the build lock {path}: "
                               f"{err.strerror or err}") from None
    try:
        yield
    finally:
        lock.release()


def ensure_built(ext: Extension, *, force: bool = False,
                 timeout: Optional[float] = None) -> Built:
    """The cached library of ``ext``, compiled first if it is not there (or ``force``).

    A compile prints a notice before it starts and its duration when done.  Raises
    :class:`KernelBuildError` (or :class:`KernelBuildTimeout`) when it cannot be built.
    """
    timeout = build_timeout() if timeout is None else timeout
    lib = ext.library()
    if lib.exists() and not force:
        return Built(lib, None)
    folder = lib.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KernelBuildError(f"cannot create the kernel cache folder {folder}: "
                               f"{err.strerror or err} (TORCH_EXTENSIONS_DIR sets where it "
                               f"goes)") from None
    with build_lock(folder / LOCK_NAME, timeout, ext.title):
        if lib.exists() and not force:
            return Built(lib, None)  # the process we waited for built it
        for old in folder.glob(TMP_PREFIX + "*"):  # left by a killed build
            shutil.rmtree(old, ignore_errors=True)
        env = _toolchain()
        _LOG.warning("meshops: compiling %s (takes one to three minutes, once per machine "
                     "and torch version; 'meshops build-kernels' does it ahead of time, "
                     "MESHOPS_KERNELS=0 skips it) into %s", ext.title, folder)
        start = time.perf_counter()
        _compile(ext, lib, timeout, env)
        seconds = time.perf_counter() - start
        _LOG.warning("meshops: compiled %s in %.0f s: %s", ext.title, seconds, lib)
        return Built(lib, seconds)


def _toolchain() -> dict[str, str]:
    """The environment of the compile, once ninja and the compiler are found on its PATH."""
    env = dict(os.environ)
    if shutil.which("ninja", path=env.get("PATH")) is None:
        # the ninja wheel's binary is not on PATH when the venv is not activated
        with suppress(ImportError):
            import ninja

            env["PATH"] = ninja.BIN_DIR + os.pathsep + env.get("PATH", "")
    if shutil.which("ninja", path=env.get("PATH")) is None:
        raise KernelBuildError("ninja is not installed (pip install ninja)")
    cxx = env.get("CXX", "c++")
    if shutil.which(cxx, path=env.get("PATH")) is None:
        raise KernelBuildError(f"no C++ compiler: {cxx!r} is not on PATH (install g++, or "
                               f"set CXX)")
    return env


def _compile(ext: Extension, lib: Path, timeout: float, env: dict[str, str]) -> None:
    """Compile ``ext`` in a private folder beside ``lib``, then rename it to ``lib``."""
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=lib.parent))
    try:
        args = {"name": ext.name, "sources": [str(s) for s in ext.sources],
                "extra_cflags": list(ext.cflags), "extra_ldflags": list(ext.ldflags),
                "build_directory": str(tmp), "verbose": False, "parent": os.getpid()}
        with subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(args)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise KernelBuildTimeout(f"compiling {ext.title} took more than {timeout:g} "
                                         f"s ({TIMEOUT_ENV} sets the limit)") from None
            except BaseException:  # Ctrl-C: stop the compiler too
                _kill_group(proc)
                raise
        if proc.returncode != 0:
            raise KernelBuildError(f"compiling failed: {_tail(err + out)}")
        built = tmp / lib.name
        if not built.exists():
            raise KernelBuildError(f"the build reported success but wrote no {built.name}")
        os.replace(built, lib)  # atomic: the cache holds a whole library or none
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop the compile child and its process group.

    SIGTERM first: ninja passes it on to the compilers, which it runs in process
    groups of their own (a SIGKILL would leave them running); SIGKILL if that fails.
    """
    if os.name == "nt":
        proc.kill()
        proc.wait()
        return
    with suppress(OSError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(text: str, chars: int = 600) -> str:
    """The compiler's diagnostics (``error:`` lines), else the last lines, on one line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]  # gcc/clang: "file:line:col: error: ..."
    return " | ".join(errors[:3] or lines[-3:])[:chars] or "no output"


def load_module(name: str, path: Path) -> ModuleType:
    """Import the extension module ``name`` from the library ``path``."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise KernelBuildError(f"{path} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (ImportError, OSError) as err:
        raise KernelBuildError(f"cannot load {path}: {err} (delete it, or run "
                               f"'meshops build-kernels --force', to rebuild)") from None
    return module

