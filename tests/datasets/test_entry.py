"""The file of a cache entry (:mod:`meshops.datasets.entry`): what was written is read
back bit for bit, viewable in place as any dtype, and a file that is not whole (cut,
extended, any byte changed) is refused, never half-read."""

from __future__ import annotations

import pytest
import torch

from meshops.datasets.entry import MAGIC, EntryError, entry_bytes, read_entry


def _data() -> tuple[dict, torch.Tensor, torch.Tensor]:
    x = torch.linspace(-1, 1, 37, dtype=torch.float64)
    data = torch.cat([x.view(torch.uint8), torch.arange(16, dtype=torch.uint8)])
    return {"tensors": [["x", "float64", [37], 0]], "note": "é"}, data, x


def test_an_entry_reads_back_whole_and_in_place(tmp_path):
    header, data, x = _data()
    for text in ("", "a" * 13):   # header lengths on and off the 16-byte boundary
        h = {**header, "pad": text}
        path = tmp_path / f"e{len(text)}.entry"
        path.write_bytes(entry_bytes(h, data))
        got_header, got = read_entry(path)
        assert got_header == h and got.dtype == torch.uint8 and torch.equal(got, data)
        # the tensor's bytes viewed as float64 where they lie: aligned
        assert torch.equal(got[:37 * 8].view(torch.float64), x)
    path.write_bytes(entry_bytes({}, torch.empty(0, dtype=torch.uint8)))
    assert read_entry(path)[1].numel() == 0


@pytest.mark.parametrize("where", ["lengths", "crc", "zeros", "header", "padding", "data"])
def test_any_changed_byte_is_refused(tmp_path, where):
    header, data, _ = _data()
    raw = bytearray(entry_bytes(header, data))
    at = {"lengths": 16, "crc": 33, "zeros": 47, "header": 50, "data": len(raw) - 1}
    at["padding"] = 48 + len(raw) - 48 - data.numel() - 1   # the last byte before the data
    raw[at[where]] ^= 0x01
    path = tmp_path / "e.entry"
    path.write_bytes(bytes(raw))
    with pytest.raises(EntryError, match="fail their CRC-32 check"):
        read_entry(path)


def test_a_cut_or_extended_or_foreign_file_is_refused(tmp_path):
    header, data, _ = _data()
    raw = entry_bytes(header, data)
    path = tmp_path / "e.entry"
    for bad in (raw[:-1], raw[:len(raw) // 2], raw + b"\0"):
        path.write_bytes(bad)
        with pytest.raises(EntryError, match=r"bytes where the entry's lengths say \d+: the "
                                             r"file is truncated or was written over"):
            read_entry(path)
    for bad in (b"", b"PK\x03\x04" + raw[4:], MAGIC[:-1] + b"\x02" + raw[16:]):
        path.write_bytes(bad)
        with pytest.raises(EntryError, match="not a meshops cache entry"):
            read_entry(path)
    path.write_bytes(raw[:20])
    with pytest.raises(EntryError, match="20 bytes, fewer than an entry's first 48: the file "
                                         "is truncated"):
        read_entry(path)
    with pytest.raises(FileNotFoundError):
        read_entry(tmp_path / "none.entry")
