"""A small safetensors writer and reader (no dependency on the safetensors package).

File layout: 8-byte little-endian header length N, N bytes of JSON, then the
data region. The JSON maps each tensor name to
``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}`` (offsets
relative to the data region) plus an optional ``"__metadata__"`` object whose
values are strings. Like the reference implementation, the header is padded
with spaces to a multiple of 8 bytes so that the data region is 8-aligned.

Tensors are written in the order given (pjserve bundles pass them in
argument order), contiguous, little-endian, C order.
"""

import json
import os
import struct
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from . import dtypes

METADATA_KEY = "__metadata__"


def _le_bytes(array: np.ndarray) -> bytes:
    a = np.ascontiguousarray(array)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.tobytes(order="C")


def encode_header(tensors: Mapping[str, np.ndarray],
                  metadata: Optional[Mapping[str, str]] = None) -> Tuple[bytes, list]:
    """Returns (8-byte length + padded JSON header, list of data blobs in order)."""
    header = {}
    if metadata is not None:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError(f"safetensors metadata must map strings to strings, got {k!r}: {v!r}")
        header[METADATA_KEY] = dict(metadata)
    blobs = []
    offset = 0
    for name, array in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor names must be non-empty strings, got {name!r}")
        if name == METADATA_KEY:
            raise ValueError(f"a tensor may not be called {METADATA_KEY!r}")
        array = np.asarray(array)
        blob = _le_bytes(array)
        header[name] = {
            "dtype": dtypes.safetensors_name(array.dtype),
            "shape": [int(d) for d in array.shape],
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text, blobs


def write_safetensors(path, tensors: Mapping[str, np.ndarray],
                      metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes `tensors` (name -> array, in that order) to `path`."""
    head, blobs = encode_header(tensors, metadata)
    with open(path, "wb") as f:
        f.write(head)
        for blob in blobs:
            f.write(blob)
        f.flush()
        os.fsync(f.fileno())


def read_header(path) -> Tuple[dict, int]:
    """Returns (decoded JSON header, byte offset of the data region)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        text = f.read(n)
        if len(text) != n:
            raise ValueError(f"{path}: header length {n} runs past the end of the file")
    return json.loads(text.decode("utf-8")), 8 + n


def read_safetensors(path) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Returns ({name: array} in header order, metadata). Arrays are copies."""
    header, data_start = read_header(path)
    metadata = header.pop(METADATA_KEY, {}) or {}
    with open(path, "rb") as f:
        f.seek(data_start)
        data = f.read()
    out = {}
    for name, info in header.items():
        dt = dtypes.from_safetensors(info["dtype"]).newbyteorder("<")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        arr = np.frombuffer(data[begin:end], dtype=dt).reshape(shape)
        out[name] = arr.astype(dt.newbyteorder("="), copy=True)
    return out, metadata


def rewrite_metadata(path, metadata: Mapping[str, str]) -> None:
    """Replaces the file's __metadata__ in place, keeping every tensor's bytes.

    Used to build test fixtures (e.g. a tampered argument_order)."""
    header, data_start = read_header(path)
    with open(path, "rb") as f:
        f.seek(data_start)
        data = f.read()
    header[METADATA_KEY] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
