"""Is a file what its suffix says, before meshio reads all of it?

meshio reads a file whole before it can say that it is not a mesh: a 1 GB file of
junk named ``x.vtu`` took 1.4-2.5 GB of memory to refuse. :func:`check_mesh_file`
looks at the first 64 KiB (the signature every format starts with) and at the size
(a file larger than the free memory cannot be read), and refuses with one line
naming what is wrong.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Callable, Sequence

from meshops.errors import MeshError

HEAD_BYTES = 64 * 1024

_HDF5 = b"\x89HDF\r\n\x1a\n"


def _text(head: bytes) -> bool:
    return b"\0" not in head


# The statements of an OBJ file (its reader skips others, so a large text file of
# anything else would be read whole to find no points).
_OBJ = (b"#", b"v", b"vt", b"vn", b"vp", b"f", b"l", b"p", b"o", b"g", b"s", b"mtllib",
        b"usemtl", b"cstype", b"deg", b"curv", b"surf", b"parm", b"end")


def _obj(head: bytes, size: int) -> bool:
    if not _text(head):
        return False
    lines = head.split(b"\n")
    lines = lines[:-1] if len(head) == HEAD_BYTES else lines  # the last may be cut
    for line in lines:
        word = line.split(None, 1)[0] if line.strip() else b""
        if word and not (word.startswith(b"#") or word in _OBJ):
            return False
    return True


def _stl(head: bytes, size: int) -> bool:
    if head[:5].lower() == b"solid" and _text(head):
        return True  # ASCII STL
    # binary STL: an 80-byte header, the triangle count, 50 bytes per triangle
    return size >= 84 and size == 84 + 50 * struct.unpack("<I", head[80:84])[0]


# meshio format name -> test of (head without leading whitespace/BOM, size). Formats
# not listed are not sniffed (their readers are quick to fail, or have no signature).
_SIGNATURES: dict[str, Callable[[bytes, int], bool]] = {
    "vtu": lambda h, n: h.startswith(b"<") and b"<VTKFile" in h,
    "xdmf": lambda h, n: h.startswith(b"<") and b"<Xdmf" in h,
    "vtk": lambda h, n: h[:14].lower() == b"# vtk datafile",
    # every Gmsh format meshio reads (2.2, 4.0, 4.1) begins with its $MeshFormat
    # section; "$" alone let one random binary file in 256 through
    "gmsh": lambda h, n: h.startswith(b"$MeshFormat"),
    "ansys": lambda h, n: h.startswith(b"(") and _text(h),
    "ply": lambda h, n: h.startswith(b"ply"),
    "off": lambda h, n: h.split(b"\n", 1)[0].strip().endswith(b"OFF"),
    "stl": _stl,
    "obj": _obj,
    "h5m": lambda h, n: h.startswith(_HDF5),
    "med": lambda h, n: h.startswith(_HDF5),
    "hmf": lambda h, n: h.startswith(_HDF5),
    "exodus": lambda h, n: h.startswith(_HDF5) or h.startswith(b"CDF"),
    **{fmt: (lambda h, n: _text(h)) for fmt in (
        "abaqus", "nastran", "su2", "tecplot", "mdpa", "avsucd", "dolfin-xml",
        "tetgen", "flac3d")},
}

# What each signature is, for the message.
_EXPECTED = {"vtu": "an XML <VTKFile>", "xdmf": "an XML <Xdmf>",
             "vtk": "'# vtk DataFile'", "gmsh": "'$MeshFormat'", "ansys": "'('",
             "ply": "'ply'", "off": "'OFF'", "stl": "'solid' or a binary STL header",
             "obj": "OBJ statements (v, f, ...)",
             "h5m": "an HDF5 signature", "med": "an HDF5 signature",
             "hmf": "an HDF5 signature", "exodus": "a netCDF or HDF5 signature"}


def check_mesh_file(path: Path, formats: Sequence[str]) -> None:
    """Refuse ``path`` unless it is non-empty, fits in the free memory, and begins like
    one of the meshio ``formats`` its suffix names.

    Raises:
        MeshError: naming the file and what it begins with.
    """
    from meshops.utils.memory import available_bytes, format_bytes

    size = os.path.getsize(path)
    if size == 0:
        raise MeshError(f"{path}: cannot read mesh: the file is empty")
    free = available_bytes()
    if free is not None and size > free:
        raise MeshError(f"{path}: cannot read mesh: the file is {format_bytes(size)}, more "
                        f"than the {format_bytes(free)} of free memory (meshio reads a file "
                        f"whole)")
    tests = [fmt for fmt in formats if fmt in _SIGNATURES]
    if not tests or len(tests) < len(formats):
        return
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    stripped = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if any(_SIGNATURES[fmt](stripped if fmt != "stl" else head, size) for fmt in tests):
        return
    expected = " or ".join(_EXPECTED.get(fmt, "text") for fmt in tests)
    what = "binary data" if not _text(head[:512]) else repr(stripped[:24].decode(
        "utf-8", "replace"))
    raise MeshError(f"{path}: cannot read mesh: it begins with {what}, but a "
                    f"{Path(path).suffix} file begins with {expected}")
