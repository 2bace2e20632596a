"""Element types: numpy dtypes <-> manifest names <-> safetensors names.

The thirteen dtypes an executable (and its weights) may use. bfloat16 comes
from ml_dtypes (the same type jax uses), so numpy arrays of it round-trip
through the writer. The manifest name "bytes" (KServe BYTES, variable-length
strings) is for the client-facing tensors of hooked and meta bundles only;
numpy holds such tensors as object arrays of `bytes`.
"""

import ml_dtypes
import numpy as np

# (manifest name, safetensors name, numpy dtype), in the order docs list them.
_TABLE = [
    ("bool", "BOOL", np.dtype(np.bool_)),
    ("u8", "U8", np.dtype(np.uint8)),
    ("u16", "U16", np.dtype(np.uint16)),
    ("u32", "U32", np.dtype(np.uint32)),
    ("u64", "U64", np.dtype(np.uint64)),
    ("i8", "I8", np.dtype(np.int8)),
    ("i16", "I16", np.dtype(np.int16)),
    ("i32", "I32", np.dtype(np.int32)),
    ("i64", "I64", np.dtype(np.int64)),
    ("f16", "F16", np.dtype(np.float16)),
    ("bf16", "BF16", np.dtype(ml_dtypes.bfloat16)),
    ("f32", "F32", np.dtype(np.float32)),
    ("f64", "F64", np.dtype(np.float64)),
]

MANIFEST_NAMES = tuple(row[0] for row in _TABLE)
# Client tensors (client_inputs / client_outputs) may also be strings.
BYTES = "bytes"
CLIENT_MANIFEST_NAMES = MANIFEST_NAMES + (BYTES,)

_BY_NUMPY = {row[2]: row for row in _TABLE}
_BY_MANIFEST = {row[0]: row for row in _TABLE}
_BY_SAFETENSORS = {row[1]: row for row in _TABLE}


def _lookup_numpy(dtype):
    dt = np.dtype(dtype)
    if dt.byteorder in ("<", ">"):
        dt = dt.newbyteorder("=")  # the key is the type; data is written little-endian
    row = _BY_NUMPY.get(dt)
    if row is None:
        raise ValueError(
            f"dtype {dt} is not supported by pjserve bundles "
            f"(supported: {', '.join(MANIFEST_NAMES)})")
    return row


def manifest_name(dtype) -> str:
    """numpy/jax dtype -> manifest dtype name ("f32", "bf16", ...)."""
    return _lookup_numpy(dtype)[0]


def safetensors_name(dtype) -> str:
    """numpy/jax dtype -> safetensors dtype string ("F32", "BF16", ...)."""
    return _lookup_numpy(dtype)[1]


def from_manifest(name: str) -> np.dtype:
    """manifest dtype name -> numpy dtype (object for "bytes")."""
    if name == BYTES:
        return np.dtype(object)
    try:
        return _BY_MANIFEST[name][2]
    except KeyError:
        raise ValueError(f"unknown manifest dtype {name!r} "
                         f"(known: {', '.join(CLIENT_MANIFEST_NAMES)})") from None


def from_safetensors(name: str) -> np.dtype:
    """safetensors dtype string -> numpy dtype."""
    try:
        return _BY_SAFETENSORS[name][2]
    except KeyError:
        raise ValueError(f"unsupported safetensors dtype {name!r}") from None
