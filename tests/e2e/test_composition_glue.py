"""The C code of the composition examples (examples/bundles/*/model.c) against
the numpy references of the whole pipelines, without a server.

Each bundle's model.so is loaded into this process with ctypes and driven
through the ABI of include/pjserve/model.h: a `pjserve_api` table whose
entries are Python functions, sub-model calls answered by the bundles' JAX
stages (what the server compiles). This checks the glue's arithmetic and its
data-dependent paths (zero boxes, several stage-2 chunks, the end token, the
length limit) and its errors quickly; test_composition.py checks the same
pipelines through the real server over gRPC and HTTP.
"""

import ctypes as C
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
import pjserve_export as pe  # noqa: E402
from pjserve_export import hooks as H  # noqa: E402
from pjserve_export import pipeline_reference as R  # noqa: E402
from pjserve_export import pipelines as P  # noqa: E402

OK, INVALID_ARGUMENT, NOT_FOUND, UNSUPPORTED, INTERNAL = 0, 1, 2, 6, 7
DTYPE = {"bool": 1, "u8": 2, "u16": 3, "u32": 4, "u64": 5, "i8": 6, "i16": 7, "i32": 8,
         "i64": 9, "f16": 10, "bf16": 11, "f32": 12, "f64": 13, "bytes": 14}
DTYPE_NAME = {v: k for k, v in DTYPE.items()}


class Tensor(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_int), ("rank", C.c_int),
                ("shape", C.c_int64 * 8), ("data", C.c_void_p), ("nbytes", C.c_size_t)]


ALLOC = C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_size_t)
SET_ERROR = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p)
LOG = C.CFUNCTYPE(None, C.c_void_p, C.c_int, C.c_char_p)
POINTER_OF = C.CFUNCTYPE(C.c_void_p, C.c_void_p)
NANOSECONDS = C.CFUNCTYPE(C.c_int64, C.c_void_p)
SCRATCH = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_size_t), C.c_size_t,
                      C.POINTER(C.c_void_p))
CALL_START = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_char_p, C.POINTER(Tensor), C.c_size_t,
                         C.POINTER(C.c_void_p))
CALL_WAIT = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p, C.POINTER(C.POINTER(Tensor)),
                        C.POINTER(C.c_size_t))
RESPOND = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(Tensor), C.c_size_t, C.c_bool)


class Api(C.Structure):
    _fields_ = [("abi_version", C.c_uint32), ("size", C.c_size_t), ("alloc", ALLOC),
                ("set_error", SET_ERROR), ("log", LOG), ("state", POINTER_OF),
                ("bundle_dir", POINTER_OF), ("model_name", POINTER_OF),
                ("request_id", POINTER_OF), ("remaining_ns", NANOSECONDS),
                ("scratch", SCRATCH), ("call_start", CALL_START), ("call_wait", CALL_WAIT),
                ("respond", RESPOND)]


class Ctx(C.Structure):
    _fields_ = [("api", C.POINTER(Api))]


def serialize_bytes(items) -> bytes:
    return b"".join(len(b).to_bytes(4, "little") + b for b in items)


def deserialize_bytes(buf: bytes, count: int):
    items, at = [], 0
    for _ in range(count):
        n = int.from_bytes(buf[at:at + 4], "little")
        items.append(buf[at + 4:at + 4 + n])
        at += 4 + n
    assert at == len(buf), "trailing bytes after the last element"
    return items


class HookError(Exception):
    def __init__(self, status, message):
        super().__init__(f"status {status}: {message}")
        self.status, self.message = status, message


class Request:
    """What one hook call may allocate and start; alive until it is dropped."""

    def __init__(self, bundle):
        self.bundle = bundle
        self.ctx = Ctx(C.pointer(bundle.api))
        self.buffers = []
        self.error = None
        self.scratch_taken = False
        self.calls = {}
        self.log = []

    def keep(self, nbytes: int) -> int:
        buf = C.create_string_buffer(max(int(nbytes), 1) + 64)
        self.buffers.append(buf)
        return (C.addressof(buf) + 63) // 64 * 64

    def tensor(self, name: str, dtype: str, array) -> Tensor:
        if dtype == "bytes":
            raw, shape = serialize_bytes(list(array)), (len(array),)
        else:
            a = np.ascontiguousarray(array, pe.dtypes.from_manifest(dtype))
            raw, shape = a.tobytes(), a.shape
        addr = self.keep(len(raw))
        C.memmove(addr, raw, len(raw))
        t = Tensor(name.encode(), DTYPE[dtype], len(shape))
        t.shape[:len(shape)] = shape
        t.data, t.nbytes = addr, len(raw)
        self.buffers.append(t.name)
        return t


def read_tensor(t: Tensor):
    shape = tuple(t.shape[:t.rank])
    raw = C.string_at(t.data, t.nbytes) if t.nbytes else b""
    if DTYPE_NAME[t.dtype] == "bytes":
        return np.array(deserialize_bytes(raw, int(np.prod(shape))), dtype=object).reshape(shape)
    return np.frombuffer(raw, pe.dtypes.from_manifest(DTYPE_NAME[t.dtype])).reshape(shape).copy()


class LoadedBundle:
    """A bundle's model.so in this process. `submodels` answers sub-calls:
    {name: fn(list of arrays) -> list of arrays}."""

    def __init__(self, bundle_dir: Path, tmp: Path, submodels=None):
        self.dir = Path(bundle_dir)
        self.manifest = pe.read_manifest(self.dir)
        self.submodels = submodels or {}
        self.subcall_log = []       # (model, rows) of each call, in start order
        self.max_in_flight = 0
        self._in_flight = 0
        # A private copy: dlopen hands back a loaded object for a known path.
        lib = tmp / f"{self.manifest.name}-{id(self)}.so"
        shutil.copyfile(self.dir / H.HOOKS_LIBRARY, lib)
        self.lib = C.CDLL(str(lib))
        self._strings = {k: C.create_string_buffer(v.encode()) for k, v in
                         {"dir": str(self.dir), "name": self.manifest.name, "id": ""}.items()}
        self._requests = {}
        self._callbacks = self._make_api()
        self.state = C.c_void_p()
        if hasattr(self.lib, "pjserve_init"):
            req = self._request()
            rc = self.lib.pjserve_init(C.byref(req.ctx), C.byref(self.state))
            if rc != OK:
                raise HookError(rc, req.error)

    def _request(self) -> Request:
        r = Request(self)
        self._requests[C.addressof(r.ctx)] = r
        return r

    def _make_api(self):
        req = lambda ctx: self._requests[ctx]  # noqa: E731

        def alloc(ctx, n):
            return req(ctx).keep(n)

        def set_error(ctx, msg):
            req(ctx).error = msg.decode()

        def log(ctx, level, msg):
            req(ctx).log.append((level, msg.decode()))

        def scratch(ctx, sizes, n, out):
            r = req(ctx)
            if r.scratch_taken:
                r.error = "pjserve_scratch called twice"
                return INVALID_ARGUMENT
            r.scratch_taken = True
            for i in range(n):
                out[i] = r.keep(sizes[i])
            return OK

        def call_start(ctx, model, inputs, n, out):
            r, name = req(ctx), model.decode()
            if name not in (self.manifest.calls or []):
                r.error = f"{name} is not in meta.calls"
                return NOT_FOUND
            arrays = [read_tensor(inputs[i]) for i in range(n)]
            self.subcall_log.append((name, arrays[0].shape[0]))
            outs = self.submodels[name](arrays)
            tensors = (Tensor * len(outs))(*[r.tensor(f"out{i}", pe.dtypes.manifest_name(o.dtype),
                                                      o) for i, o in enumerate(outs)])
            r.buffers.append(tensors)
            handle = len(r.calls) + 1
            r.calls[handle] = tensors
            out[0] = handle
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            return OK

        def call_wait(ctx, call, outputs, n):
            tensors = req(ctx).calls.pop(call)
            self._in_flight -= 1
            outputs[0] = C.cast(tensors, C.POINTER(Tensor))
            n[0] = len(tensors)
            return OK

        callbacks = [ALLOC(alloc), SET_ERROR(set_error), LOG(log),
                     POINTER_OF(lambda ctx: self.state.value or 0),
                     POINTER_OF(lambda ctx: C.addressof(self._strings["dir"])),
                     POINTER_OF(lambda ctx: C.addressof(self._strings["name"])),
                     POINTER_OF(lambda ctx: C.addressof(self._strings["id"])),
                     NANOSECONDS(lambda ctx: 2**63 - 1), SCRATCH(scratch),
                     CALL_START(call_start), CALL_WAIT(call_wait),
                     RESPOND(lambda ctx, o, n, final: UNSUPPORTED)]
        self.api = Api(1, C.sizeof(Api), *callbacks)
        return callbacks

    def _slots(self, specs):
        slots = (Tensor * len(specs))()
        for slot, s in zip(slots, specs):
            shape = ((-1,) if s.batched else ()) + tuple(s.shape)
            slot.name, slot.dtype, slot.rank = s.name.encode(), DTYPE[s.dtype], len(shape)
            slot.shape[:len(shape)] = shape
        return slots

    def _call(self, fn, specs_in, inputs, specs_out):
        r = self._request()
        ins = (Tensor * len(specs_in))(*[r.tensor(s.name, s.dtype, inputs[s.name])
                                         for s in specs_in])
        outs = self._slots(specs_out)
        rc = fn(C.byref(r.ctx), ins, len(ins), outs, len(outs))
        if rc != OK:
            raise HookError(rc, r.error)
        assert not r.calls, "sub-calls started but never waited for"
        result = {}
        for s, t in zip(specs_out, outs):
            assert DTYPE_NAME[t.dtype] == s.dtype and t.rank == len(s.shape) + s.batched
            fixed = ((-1,) if s.batched else ()) + tuple(s.shape)
            for got, want in zip(t.shape[:t.rank], fixed):
                assert want == -1 or got == want, f"{s.name}: extent {got}, declared {want}"
            result[s.name] = read_tensor(t)
        return result

    def run(self, inputs):
        """kind meta: client inputs -> client outputs."""
        m = self.manifest
        return self._call(self.lib.pjserve_run, m.client_inputs, inputs, m.client_outputs)

    def hooked(self, inputs, executable):
        """kind model: preprocess, `executable` (list -> list of arrays), postprocess."""
        m = self.manifest
        x = self._call(self.lib.pjserve_preprocess, m.client_inputs, inputs, m.inputs)
        y = executable([x[s.name] for s in m.inputs])
        return self._call(self.lib.pjserve_postprocess, m.outputs,
                          {s.name: a for s, a in zip(m.outputs, y)}, m.client_outputs)


def jax_stage(fn, params):
    f = jax.jit(fn)

    def run(arrays):
        out = f(params, *arrays)
        return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]
    return run


# ---- fixtures -----------------------------------------------------------------

@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("composition")
    return P.export_pipelines(out, build=H.hooks_builder())


@pytest.fixture(scope="module")
def libdir(tmp_path_factory):
    return tmp_path_factory.mktemp("libs")


@pytest.fixture(scope="module")
def classifier(bundles, libdir):
    return LoadedBundle(bundles["image_classifier"], libdir)


@pytest.fixture(scope="module")
def classifier_ref(bundles):
    return R.ImageClassifierReference(bundles["image_classifier"])


@pytest.fixture
def detector(bundles, libdir):
    return LoadedBundle(bundles["detector"], libdir, {
        "detector_stage1": jax_stage(P.stage1_fn, P.stage1_params()),
        "detector_stage2": jax_stage(P.stage2_fn, P.stage2_params())})


@pytest.fixture(scope="module")
def detector_ref(bundles):
    return R.DetectorReference(bundles["detector_stage1"], bundles["detector_stage2"])


@pytest.fixture
def decoder(bundles, libdir):
    return LoadedBundle(bundles["greedy_decoder"], libdir,
                        {"decoder_step": jax_stage(P.decoder_step_fn, P.decoder_params())})


@pytest.fixture(scope="module")
def decoder_ref(bundles):
    return R.GreedyDecoderReference(bundles["decoder_step"])


# ---- image_classifier ----------------------------------------------------------

def test_classifier_hooks_match_reference(classifier, classifier_ref):
    fn = jax_stage(P.classifier_fn, P.classifier_params())
    worst = 0.0
    for img in R.classifier_cases(classifier_ref):
        want = classifier_ref(img)
        x = classifier._call(classifier.lib.pjserve_preprocess, classifier.manifest.client_inputs,
                             {"IMAGE": img}, classifier.manifest.inputs)["x"]
        assert x.shape == (1, 3, 32, 32)
        worst = max(worst, float(np.abs(x[0] - classifier_ref.preprocess(img)).max()))
        got = classifier.hooked({"IMAGE": img}, fn)
        assert list(got["CLASSES"]) == want.classes, img.shape
        worst = max(worst, float(np.abs(got["SCORES"] - want.scores).max()))
    print(f"image_classifier (hooks without a server): max abs error {worst:.2e}")
    assert worst < 1e-4


def test_classifier_refuses_empty_image(classifier):
    with pytest.raises(HookError) as e:
        classifier.hooked({"IMAGE": np.zeros((0, 4, 3), np.uint8)}, None)
    assert e.value.status == INVALID_ARGUMENT
    assert "1 to 8192 pixels a side" in e.value.message


def test_classifier_init_refuses_bad_labels(bundles, tmp_path, libdir):
    broken = tmp_path / "image_classifier"
    shutil.copytree(bundles["image_classifier"], broken)
    (broken / "labels.txt").write_text("just\nthree\nlabels\n")
    with pytest.raises(HookError) as e:
        LoadedBundle(broken, libdir)
    assert e.value.status == INTERNAL and "expected 10 labels, found 3" in e.value.message


# ---- detector ------------------------------------------------------------------

def assert_detections(got, want, what):
    n = len(want.boxes)
    assert got["BOXES"].shape == (n, 4) and got["SCORES"].shape == (n,), what
    np.testing.assert_array_equal(got["LABELS"], want.labels, err_msg=what)
    err = max([0.0] + [float(np.abs(got[k] - w).max()) for k, w in
                       (("BOXES", want.boxes), ("SCORES", want.scores)) if n])
    assert err < 1e-3, f"{what}: max abs error {err}"
    return err


def test_detector_glue_matches_reference(detector, detector_ref):
    worst = 0.0
    for image, t, what in R.detector_cases(detector_ref):
        detector.subcall_log.clear()
        want = detector_ref(image, t)
        got = detector.run({"IMAGE": image, "SCORE_THRESHOLD": np.array([t], np.float32)})
        worst = max(worst, assert_detections(got, want, what))
        n = len(want.boxes)
        chunks = [min(P.DET_CHUNK, n - i) for i in range(0, n, P.DET_CHUNK)]
        assert detector.subcall_log == [("detector_stage1", 1)] + [
            ("detector_stage2", c) for c in chunks], what
        print(f"detector {what}: {n} boxes, stage-2 calls {chunks}")
    assert detector.max_in_flight == 2, "the second chunk starts before the first is waited for"
    print(f"detector (glue without a server): max abs error {worst:.2e}")


def test_detector_refuses_nan_threshold(detector):
    with pytest.raises(HookError) as e:
        detector.run({"IMAGE": np.zeros((3, 64, 64), np.float32),
                      "SCORE_THRESHOLD": np.array([np.nan], np.float32)})
    assert e.value.status == INVALID_ARGUMENT and "SCORE_THRESHOLD is NaN" in e.value.message


# ---- greedy_decoder ------------------------------------------------------------

def test_decoder_glue_matches_reference(decoder, decoder_ref):
    for prompt, max_tokens, what in R.decoder_cases(decoder_ref):
        decoder.subcall_log.clear()
        want = decoder_ref(prompt, max_tokens)
        got = decoder.run({"PROMPT": np.array(prompt, np.int32),
                           "MAX_TOKENS": np.array([max_tokens], np.int32)})
        np.testing.assert_array_equal(got["TOKENS"], want.tokens, err_msg=what)
        assert decoder.subcall_log == [("decoder_step", 1)] * want.steps, what
        print(f"greedy_decoder {what}: prompt {prompt} -> {want.tokens.tolist()} "
              f"({want.steps} steps)")


@pytest.mark.parametrize("prompt,max_tokens,message", [
    ([], 4, "PROMPT must hold 1 to 15 tokens, got 0"),
    (list(range(2, 18)), 4, "PROMPT must hold 1 to 15 tokens, got 16"),
    ([3, 32], 4, "PROMPT[1] is 32; token ids are 0 to 31"),
    ([3, -1], 4, "PROMPT[1] is -1"),
    ([3], -2, "MAX_TOKENS must be 0 or more, got -2"),
])
def test_decoder_refuses_bad_input(decoder, prompt, max_tokens, message):
    with pytest.raises(HookError) as e:
        decoder.run({"PROMPT": np.array(prompt, np.int32),
                     "MAX_TOKENS": np.array([max_tokens], np.int32)})
    assert e.value.status == INVALID_ARGUMENT and message in e.value.message
    assert decoder.subcall_log == []
