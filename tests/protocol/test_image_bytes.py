"""image_bytes_classifier, the hooked model Triton's ensemble_image_client.py
calls: clients send each image file's bytes (a JPEG) as one BYTES element,
IMAGE [batch, 1], and get SCORES f32 [batch, 10], class probabilities
labelled by labels.txt. Exported by python/pjserve_export/pipelines.py as
`make models` exports it (C in examples/bundles/image_bytes_classifier/model.c,
linked with libjpeg through the manifest's hooks_libraries).

The JPEGs are written by the test with libturbojpeg through ctypes (the same
libjpeg-turbo decoder the hook uses), and decoded by it with the hook's
settings for the reference: the decoded pixels are then the hook's exactly,
so the only differences left are float ones. The reference is
pipeline_reference's numpy resize + normalization and the model's JAX
function; SCORES must agree within 1e-5 absolute (probabilities in [0, 1]:
f32 convolutions of a few hundred terms computed by the served executable
and by eager JAX in different orders differ by a few ulps, far below that,
and far below the ranking margins the class_count checks rely on, which are
asserted to exceed it).

Checked on gRPC and HTTP (binary): the metadata and configuration the example
client reads (one input, max_batch_size 8, the output's labels file); a
batch of two images of different sizes and kinds (4:2:0 colour baseline,
grayscale progressive); class_count 1 and 3 answering "score:index:label"
in the reference's order; empty, non-image, corrupt, truncated and oversized
files refused INVALID_ARGUMENT / 400 with a message naming the row; the
decoder's bounds: a progressive file of 64 scans (written marker by marker)
decoded, of 65 and 379 refused at once, one whose DCT coefficients push it
past the 64 MiB bound refused; a batch of large progressive files with a
100 ms timeout stopped by the hook at the deadline; the server answering
again afterwards; `pjserve build-hooks` linking the manifest's
hooks_libraries (-ljpeg) and refusing a name that is not a library.
Under PJSERVE_PROTOCOL_NODE_WORKERS the same runs
through a node's gateway.
"""
import ctypes
import ctypes.util
import shutil
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pjserve_export import hooks as H
from pjserve_export import pipelines as P
from pjserve_export.pipeline_reference import ImageClassifierReference
from protocol_util import ServerProcess, finish_checked, grpc_code, guard_alive, start_or_fail

MODEL = "image_bytes_classifier"
MAX_BATCH = max(P.CLS_BATCH_SIZES)
ATOL = 1e-5
LABELS = [line.encode() for line in
          (P.EXAMPLES_DIR / MODEL / "labels.txt").read_text().splitlines()]

# ---- JPEG files through libturbojpeg ----------------------------------------

TJPF_RGB, TJPF_GRAY = 0, 6
TJSAMP_420, TJSAMP_GRAY = 2, 3
TJFLAG_ACCURATEDCT, TJFLAG_STOPONWARNING, TJFLAG_PROGRESSIVE, TJFLAG_LIMITSCANS = (
    4096, 8192, 16384, 32768)
DECODE_FLAGS = TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS  # model.c's


def _turbojpeg():
    path = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    lib = ctypes.CDLL(path)
    lib.tjInitCompress.restype = lib.tjInitDecompress.restype = ctypes.c_void_p
    lib.tjDestroy.argtypes = [ctypes.c_void_p]
    lib.tjFree.argtypes = [ctypes.c_void_p]
    lib.tjGetErrorStr2.restype = ctypes.c_char_p
    lib.tjGetErrorStr2.argtypes = [ctypes.c_void_p]
    lib.tjCompress2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                ctypes.POINTER(ctypes.c_ulong), ctypes.c_int, ctypes.c_int,
                                ctypes.c_int]
    lib.tjDecompressHeader3.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong] + \
        [ctypes.POINTER(ctypes.c_int)] * 4
    lib.tjDecompress2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong,
                                  ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int]
    return lib


TJ = _turbojpeg()


def jpeg_encode(pixels: np.ndarray, quality: int = 90, progressive: bool = False) -> bytes:
    """u8 [H, W, 3] (RGB, 4:2:0) or [H, W] (grayscale) -> JPEG file bytes."""
    gray = pixels.ndim == 2
    pixels = np.ascontiguousarray(pixels, np.uint8)
    h, w = pixels.shape[:2]
    tj = TJ.tjInitCompress()
    buf, size = ctypes.c_void_p(), ctypes.c_ulong(0)
    try:
        rc = TJ.tjCompress2(tj, pixels.ctypes.data, w, 0, h, TJPF_GRAY if gray else TJPF_RGB,
                            ctypes.byref(buf), ctypes.byref(size),
                            TJSAMP_GRAY if gray else TJSAMP_420, quality,
                            TJFLAG_PROGRESSIVE if progressive else 0)
        assert rc == 0, TJ.tjGetErrorStr2(tj)
        return ctypes.string_at(buf, size.value)
    finally:
        TJ.tjFree(buf)
        TJ.tjDestroy(tj)


def jpeg_decode(data: bytes) -> np.ndarray:
    """JPEG file bytes -> u8 [H, W, 3] RGB, decoded as the hook decodes."""
    tj = TJ.tjInitDecompress()
    try:
        w, h, sub, cs = (ctypes.c_int() for _ in range(4))
        assert TJ.tjDecompressHeader3(tj, data, len(data), ctypes.byref(w), ctypes.byref(h),
                                      ctypes.byref(sub), ctypes.byref(cs)) == 0
        out = np.empty((h.value, w.value, 3), np.uint8)
        assert TJ.tjDecompress2(tj, data, len(data), out.ctypes.data, w.value, 0, h.value,
                                TJPF_RGB, DECODE_FLAGS) == 0, TJ.tjGetErrorStr2(tj)
        return out
    finally:
        TJ.tjDestroy(tj)


def with_size(jpeg: bytes, width: int, height: int) -> bytes:
    """The file with its frame header (SOF0 or SOF2) claiming another size."""
    for marker in (b"\xff\xc0", b"\xff\xc2"):
        i = jpeg.find(marker)
        if i >= 0:
            return (jpeg[:i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") +
                    jpeg[i + 9:])
    raise AssertionError("no SOF0/SOF2 marker")


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def _entropy_coded(bits: str) -> bytes:
    """A scan's bits ('0'/'1'), padded with 1s, each 0xFF byte stuffed."""
    bits += "1" * (-len(bits) % 8)
    out = bytearray()
    for i in range(0, len(bits), 8):
        out.append(int(bits[i:i + 8], 2))
        if out[-1] == 0xFF:
            out.append(0)
    return bytes(out)


def many_scans_jpeg(width: int, height: int, scans: int) -> bytes:
    """A valid progressive grayscale JPEG of `scans` scans (mid-gray: every
    coefficient 0), written marker by marker: a DC scan, then for each AC
    coefficient k a first scan (Ss = Se = k, Al = 13) and its 13 refinements
    (Ah = Al + 1), each coded as one end-of-band run over every block. One
    Huffman code per table ("0"), so each scan is a few bytes."""
    blocks = -(-width // 8) * -(-height // 8)
    assert 1 <= blocks <= 32767 and 1 <= scans <= 1 + 63 * 14
    r = blocks.bit_length() - 1                      # EOBr: a run of 2^r + r extra bits
    eob_run = "0" + (format(blocks - (1 << r), f"0{r}b") if r else "")
    out = b"\xff\xd8" + _segment(0xDB, b"\x00" + b"\x01" * 64)
    out += _segment(0xC2, b"\x08" + height.to_bytes(2, "big") + width.to_bytes(2, "big") +
                    b"\x01\x01\x11\x00")
    out += _segment(0xC4, b"\x00" + b"\x01" + bytes(15) + b"\x00")          # DC: category 0
    out += _segment(0xC4, b"\x10" + b"\x01" + bytes(15) + bytes([r << 4]))  # AC: EOBr
    plan = [(0, 0, 0, 0)]
    for k in range(1, 64):
        plan += [(k, k, 0, 13)] + [(k, k, ah, ah - 1) for ah in range(13, 0, -1)]
    for ss, se, ah, al in plan[:scans]:
        out += _segment(0xDA, bytes([1, 1, 0x00, ss, se, ah << 4 | al]))
        out += _entropy_coded("0" * blocks if ss == 0 else eob_run)
    return out + b"\xff\xd9"


def smooth_image(h: int, w: int, seed: int) -> np.ndarray:
    """Gradients and a blob: JPEG-friendly, different per seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    chans = []
    for _ in range(3):
        a, b, c = rng.uniform(-1, 1, 3)
        chans.append(128 + 60 * np.sin(a * x / 9 + b * y / 7 + c * 3) +
                     50 * np.exp(-((x - w * rng.random()) ** 2 + (y - h * rng.random()) ** 2)
                                 / (0.1 * h * w)))
    return np.clip(np.stack(chans, axis=-1), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def images():
    """Two JPEG files of different sizes and kinds."""
    colour = jpeg_encode(smooth_image(48, 64, 1))
    gray = jpeg_encode(smooth_image(100, 30, 2)[..., 1], progressive=True)
    return [colour, gray]


# ---- the reference -----------------------------------------------------------

@pytest.fixture(scope="module")
def reference(bundle):
    pre = ImageClassifierReference(bundle)
    params = P.classifier_params()
    fn = jax.jit(P.classifier_probabilities_fn)

    def scores(files):
        x = np.stack([pre.preprocess(jpeg_decode(f)) for f in files]).astype(np.float32)
        return np.asarray(fn(params, jnp.asarray(x)))
    return scores


# ---- the server ----------------------------------------------------------------

@pytest.fixture(scope="module")
def bundle(pjserve_bin, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-image-bytes")
    return P.export_pipeline(MODEL, repo, build=H.hooks_builder(pjserve_bin))[MODEL]


@pytest.fixture(scope="module")
def image_server(bundle, pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    s = ServerProcess(pjserve_bin, plugin_path, bundle.parent, cache_dir,
                      tmp_path_factory.mktemp("server-image-bytes"), [], "image-bytes")
    start_or_fail(s)
    yield s
    finish_checked(s)


@pytest.fixture
def server(image_server):
    yield from guard_alive(image_server)


def files_array(files):
    """What ensemble_image_client.py sends: [n, 1] BYTES, a file per row."""
    return np.stack([np.array([f], dtype=bytes) for f in files], axis=0)


def infer(server, protocol, files, class_count=0):
    data = files_array(files)
    if protocol == "grpc":
        client = grpcclient.InferenceServerClient(server.grpc_url)
        t = grpcclient.InferInput("IMAGE", list(data.shape), "BYTES")
        t.set_data_from_numpy(data)
        out = grpcclient.InferRequestedOutput("SCORES", class_count=class_count)
    else:
        client = httpclient.InferenceServerClient(server.http_url)
        t = httpclient.InferInput("IMAGE", list(data.shape), "BYTES")
        t.set_data_from_numpy(data, binary_data=True)
        out = httpclient.InferRequestedOutput("SCORES", binary_data=True,
                                              class_count=class_count)
    return client.infer(MODEL, [t], outputs=[out]).as_numpy("SCORES")


def refusal(server, protocol, files) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        infer(server, protocol, files)
    if protocol == "grpc":
        assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value
    else:
        assert "400" in str(e.value.status()), e.value
    return e.value


PROTOCOLS = ["grpc", "http"]


# ---- tests ---------------------------------------------------------------------

def test_metadata_and_config_as_the_example_reads_them(server):
    g = grpcclient.InferenceServerClient(server.grpc_url)
    meta, config = g.get_model_metadata(MODEL), g.get_model_config(MODEL).config
    assert [(i.name, i.datatype, list(i.shape)) for i in meta.inputs] == \
        [("IMAGE", "BYTES", [-1, 1])]
    assert [(o.name, o.datatype, list(o.shape)) for o in meta.outputs] == \
        [("SCORES", "FP32", [-1, 10])]
    assert len(config.input) == 1 and config.max_batch_size == MAX_BATCH
    assert [(o.name, o.label_filename) for o in config.output] == [("SCORES", "labels.txt")]
    h = httpclient.InferenceServerClient(server.http_url)
    hmeta, hconfig = h.get_model_metadata(MODEL), h.get_model_config(MODEL)
    assert [i["name"] for i in hmeta["inputs"]] == ["IMAGE"]
    assert len(hconfig["input"]) == 1 and hconfig["max_batch_size"] == MAX_BATCH
    assert [o.get("label_filename") for o in hconfig["output"]] == ["labels.txt"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batch_of_two_matches_reference(server, protocol, images, reference):
    want = reference(images)
    got = infer(server, protocol, images)
    assert got.shape == (2, len(LABELS)) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-5)
    # One image alone gets the same scores as in the batch.
    np.testing.assert_allclose(infer(server, protocol, images[1:]), want[1:], rtol=0, atol=ATOL)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("k", [1, 3])
def test_class_count_with_labels(server, protocol, k, images, reference):
    want = reference(images)
    got = infer(server, protocol, images, class_count=k)
    assert got.shape == (2, k)
    for row, probs in enumerate(want):
        order = np.argsort(-probs, kind="stable")
        # The ranking the server reports is the reference's when no two
        # ranked scores are within the tolerance of each other.
        gaps = -np.diff(probs[order[:k + 1]])
        assert (gaps > 2 * ATOL).all(), f"row {row}: ranking margins {gaps} too small"
        for j, entry in enumerate(got[row]):
            score, index, label = entry.split(b":")
            assert int(index) == order[j], (row, j, entry)
            assert label == LABELS[order[j]]
            assert abs(float(score) - probs[order[j]]) <= ATOL


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_files_refused_naming_the_row(server, protocol, images):
    good = images[0]
    scan_cut = good[:len(good) - 120]
    header_cut = good[:300]
    scan = good.index(b"\xff\xda") + 20                  # into the entropy-coded data
    corrupt = good[:scan] + bytes([0xFF, 0x00, 0xFF, 0xD0]) * 8 + good[scan + 32:]
    png = b"\x89PNG\r\n\x1a\n" + bytes(64)
    too_wide = with_size(good, 9000, 48)
    too_large = with_size(good, 8000, 3000)   # 72 MB as RGB, each side within 8192
    cases = [
        ([good, b""], "IMAGE row 1 is empty"),
        ([b"hello, not an image", good], "IMAGE row 0 is not a JPEG file"),
        ([good, png], "IMAGE row 1 is not a JPEG file"),
        ([good, good, scan_cut], "IMAGE row 2 is a corrupt or truncated JPEG file"),
        ([header_cut, good], "IMAGE row 0 is not a JPEG file, or its header is cut short"),
        ([corrupt], "IMAGE row 0 is a corrupt or truncated JPEG file"),
        ([good, too_wide], "IMAGE row 1 is a 9000x48 image; at most 8192 pixels a side"),
        ([too_large], "IMAGE row 0 is a 8000x3000 image; at most 8192 pixels a side and 64 MiB"),
    ]
    for files, message in cases:
        e = refusal(server, protocol, files)
        assert f"model {MODEL}: preprocess: {message}" in str(e), (message, str(e))
    # Still serving, and the same answers as before.
    assert infer(server, protocol, images).shape == (2, len(LABELS))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_more_rows_than_the_largest_batch_refused(server, protocol, images):
    e = refusal(server, protocol, [images[0]] * (MAX_BATCH + 1))
    assert str(MAX_BATCH) in str(e)
    assert infer(server, protocol, [images[0]] * MAX_BATCH).shape == (MAX_BATCH, len(LABELS))


MAX_SCANS = 64  # model.c's


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_many_scans_refused_before_decoding(server, protocol, images):
    """A progressive file may have MAX_SCANS scans: each is another pass over
    every coefficient of the image. 379 scans (libturbojpeg's own limit is
    500) of a 1448x1448 image are refused at scan 65, in milliseconds."""
    limit = many_scans_jpeg(64, 64, MAX_SCANS)
    assert infer(server, protocol, [limit, images[0]]).shape == (2, len(LABELS))
    for scans, size in ((MAX_SCANS + 1, 64), (379, 1448)):
        started = time.monotonic()
        e = refusal(server, protocol, [images[0], many_scans_jpeg(size, size, scans)])
        assert (f"model {MODEL}: preprocess: IMAGE row 1 has more than {MAX_SCANS} scans; at "
                f"most {MAX_SCANS} are accepted") in str(e), str(e)
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_progressive_coefficients_count_against_the_decoded_bound(server, protocol, images):
    """A progressive 4096x4096 grayscale file: 48 MiB of RGB pixels fit the
    64 MiB bound, its 32 MiB of coefficients on top do not."""
    e = refusal(server, protocol, [with_size(images[1], 4096, 4096)])
    assert ("IMAGE row 0 is a 4096x4096 image; at most 8192 pixels a side and 64 MiB decoded are "
            "accepted (it needs 80 MiB: 48 of RGB pixels, 32 of the DCT coefficients") in str(e), \
        str(e)


@pytest.fixture(scope="module")
def slow_batch():
    """MAX_BATCH large progressive files of noise (the slowest kind to
    decode), and how long decoding them takes here, as the hook decodes."""
    noise = np.random.default_rng(7).integers(0, 256, (1600, 1600, 3), np.uint8)
    jpeg = jpeg_encode(noise, quality=100, progressive=True)
    started = time.monotonic()
    jpeg_decode(jpeg)
    return [jpeg] * MAX_BATCH, MAX_BATCH * (time.monotonic() - started)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_decoding_stops_at_the_deadline(server, protocol, slow_batch):
    """A batch whose decoding takes about a second, with a 100 ms timeout:
    the hook gives up at the deadline, between rows or inside one, and says
    so (DEADLINE_EXCEEDED; HTTP's status for it); the server answers on."""
    files, decoding_s = slow_batch
    assert decoding_s > 0.3, f"decoding the batch took {decoding_s:.2f} s: too fast to test with"
    data = files_array(files)
    with pytest.raises(InferenceServerException) as e:
        if protocol == "grpc":
            t = grpcclient.InferInput("IMAGE", list(data.shape), "BYTES")
            t.set_data_from_numpy(data)
            grpcclient.InferenceServerClient(server.grpc_url).infer(MODEL, [t], timeout=100_000)
        else:
            t = httpclient.InferInput("IMAGE", list(data.shape), "BYTES")
            t.set_data_from_numpy(data, binary_data=True)
            httpclient.InferenceServerClient(server.http_url).infer(MODEL, [t], timeout=100_000)
    if protocol == "grpc":
        assert grpc_code(e.value) == "DEADLINE_EXCEEDED", e.value
    # The hook's message: the scheduler's, had the hook decoded every row.
    assert f"model {MODEL}: preprocess: " in str(e.value), str(e.value)
    assert "the request's deadline passed or its client went away" in str(e.value), str(e.value)
    assert infer(server, protocol, files[:1]).shape == (1, len(LABELS))


# ---- building: the manifest's hooks_libraries ------------------------------------

def needed_libraries(library) -> str:
    return subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True,
                          check=True).stdout


def test_build_hooks_links_the_manifests_libraries(bundle, pjserve_bin, tmp_path):
    copy = tmp_path / MODEL
    shutil.copytree(bundle, copy)
    (copy / "model.so").unlink()
    r = subprocess.run([str(pjserve_bin), "build-hooks", str(copy)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert f"{copy / 'model.c'} -ljpeg -lm" in r.stdout
    assert "libjpeg.so" in needed_libraries(copy / "model.so")
    # Arguments after -- come before the manifest's libraries.
    r = subprocess.run([str(pjserve_bin), "build-hooks", str(copy), "--", "-DX=1"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "-DX=1 -ljpeg -lm" in r.stdout, r.stdout + r.stderr
    # A manifest naming something other than a library is refused, nothing built.
    manifest = copy / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace('hooks_libraries: ["jpeg"]',
                                                     'hooks_libraries: ["-shared"]'))
    before = (copy / "model.so").stat().st_mtime_ns
    r = subprocess.run([str(pjserve_bin), "build-hooks", str(copy)], capture_output=True,
                       text=True)
    assert r.returncode != 0
    assert "hooks_libraries[0]" in r.stderr and "not starting with '-'" in r.stderr, r.stderr
    assert (copy / "model.so").stat().st_mtime_ns == before
    # Hooks written before any export (no manifest yet) build without libraries.
    manifest.unlink()
    r = subprocess.run([str(pjserve_bin), "build-hooks", str(copy)], capture_output=True,
                       text=True)
    assert r.returncode == 0 and f"{copy / 'model.c'} -lm" in r.stdout, r.stdout + r.stderr
