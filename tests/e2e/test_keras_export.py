"""Keras 3 models exported with export_keras: Keras's own predict and the server agree.

Twelve models with random weights from a fixed seed (nothing is
downloaded), built as users build them: functional models (an MLP; a CNN
with batch normalization; Conv1D; LSTM; a bidirectional GRU returning
sequences; an embedding of int32 ids; two inputs and two outputs; a
transformer block with multi-head attention and layer normalization;
separable and depthwise convolutions), keras.applications' MobileNetV3Small
(weights=None), a Sequential model with an Input, and a subclassed model
given example_inputs. Each is exported at batch sizes 1 and 4, all are
served by one `pjserve serve`, and each answer (3 rows over gRPC, padded to
4 by the server; 1 row over HTTP) is compared with model.predict on the same
inputs, within 1e-4 relative to the output's scale. Also: the weights are
the model's variables by path, and what export_keras refuses (another
backend, a model that does not say its inputs, an open extent) it refuses
with words saying what to do.
"""

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
from e2e_util import check_served, serving  # noqa: E402

keras = pytest.importorskip("keras")

from pjserve_export import export_keras, read_manifest, read_safetensors  # noqa: E402

BATCH_SIZES = (1, 4)
TOLERANCE = 1e-4



def functional(name, inputs, outputs):
    return keras.Model(inputs, outputs, name=name)


def mlp():
    x = keras.Input((16,), name="x")
    h = keras.layers.Dense(32, activation="relu")(x)
    return functional("keras_mlp", x, keras.layers.Dense(4, name="y")(h))


def cnn():
    x = keras.Input((32, 32, 3), name="image")
    h = keras.layers.Conv2D(8, 3, padding="same")(x)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(16, 3, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return functional("keras_cnn", x, keras.layers.Dense(10, name="logits")(h))


def conv1d():
    x = keras.Input((64, 8), name="signal")
    h = keras.layers.Conv1D(12, 5, activation="tanh")(x)
    h = keras.layers.GlobalMaxPooling1D()(h)
    return functional("keras_conv1d", x, keras.layers.Dense(3, name="scores")(h))


def lstm():
    x = keras.Input((12, 8), name="steps")
    h = keras.layers.LSTM(16)(x)
    return functional("keras_lstm", x, keras.layers.Dense(2, name="out")(h))


def gru():
    x = keras.Input((12, 8), name="steps")
    h = keras.layers.Bidirectional(keras.layers.GRU(8, return_sequences=True), name="seq")(x)
    return functional("keras_gru", x, h)


def embedding():
    x = keras.Input((20,), dtype="int32", name="ids")
    h = keras.layers.Embedding(100, 16)(x)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return functional("keras_embedding", x, keras.layers.Dense(5, name="probs",
                                                               activation="softmax")(h))


def two_in_two_out():
    a = keras.Input((8,), name="a")
    b = keras.Input((4,), name="b")
    h = keras.layers.Concatenate()([a, b])
    h = keras.layers.Dense(16, activation="gelu")(h)
    return functional("keras_two_io", [a, b],
                      [keras.layers.Dense(3, name="cls")(h),
                       keras.layers.Dense(1, activation="sigmoid", name="score")(h)])


def transformer_block():
    x = keras.Input((10, 32), name="tokens")
    att = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)
    h = keras.layers.LayerNormalization()(x + att)
    ff = keras.layers.Dense(64, activation="relu")(h)
    ff = keras.layers.Dense(32)(ff)
    return functional("keras_transformer", x,
                      keras.layers.LayerNormalization(name="encoded")(h + ff))


def separable():
    x = keras.Input((16, 16, 4), name="x")
    h = keras.layers.SeparableConv2D(8, 3, activation="relu")(x)
    h = keras.layers.DepthwiseConv2D(3)(h)
    h = keras.layers.AveragePooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    return functional("keras_separable", x, keras.layers.Dense(6, name="y")(h))


def mobilenet():
    return keras.applications.MobileNetV3Small(input_shape=(64, 64, 3), weights=None,
                                               classes=10, name="keras_mobilenet_v3")


def sequential():
    return keras.Sequential([keras.Input((6,), name="features"), keras.layers.Dense(5),
                             keras.layers.Softmax(name="dist")], name="keras_sequential")


class Residual(keras.Model):
    def __init__(self):
        super().__init__(name="keras_subclassed")
        self.a = keras.layers.Dense(8, activation="relu")
        self.b = keras.layers.Dense(8)

    def call(self, x):
        return x + self.b(self.a(x))


MODELS = [mlp, cnn, conv1d, lstm, gru, embedding, two_in_two_out, transformer_block, separable,
          mobilenet, sequential]


def rows(model_inputs, n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in model_inputs:
        if dtype == np.int32:
            out.append(rng.integers(0, 100, (n,) + shape, dtype=np.int32))
        else:
            out.append(rng.standard_normal((n,) + shape).astype(np.float32))
    return out


class Exported:
    """An exported model as e2e_util.check_served takes it."""

    def __init__(self, model, path, input_names, output_names, inputs):
        self.model, self.path, self.name = model, path, model.name
        self.input_names, self.output_names = input_names, output_names
        self.inputs = inputs  # [(per-example shape, dtype)]

    def make_inputs(self, n, seed):
        return rows(self.inputs, n, seed)

    def reference(self, xs):
        y = self.model.predict(xs[0] if len(xs) == 1 else xs, verbose=0)
        ys = y if isinstance(y, (list, tuple)) else [y]
        return [np.asarray(v) for v in ys]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("keras")
    keras.utils.set_random_seed(0)
    result = []
    for build in MODELS:
        m = build()
        path = export_keras(m, out, name=m.name, batch_sizes=BATCH_SIZES)
        inputs = [(tuple(t.shape[1:]), np.dtype(t.dtype)) for t in m.inputs]
        manifest = read_manifest(path)
        result.append(Exported(m, path, [t.name for t in manifest.inputs],
                               [t.name for t in manifest.outputs], inputs))
    sub = Residual()
    example = np.zeros((1, 8), np.float32)
    sub(example)  # builds its variables
    path = export_keras(sub, out, name=sub.name, batch_sizes=BATCH_SIZES,
                        example_inputs=[example], input_names=["x"], output_names=["y"])
    result.append(Exported(sub, path, ["x"], ["y"], [((8,), np.dtype(np.float32))]))
    return result


def test_every_model_served_as_keras_predicts(exported, pjserve_bin, plugin_path, tmp_path):
    assert len(exported) >= 10
    with serving(pjserve_bin, plugin_path, [e.path for e in exported], tmp_path) as server:
        check_served(server, exported, TOLERANCE)


def test_weights_are_the_models_variables_by_path(exported):
    e = next(x for x in exported if x.model.name == "keras_cnn")
    weights, _ = read_safetensors(e.path / "weights.safetensors")
    names = set(weights)
    assert {f"trainable.{v.path.replace('/', '.')}" for v in e.model.trainable_variables} <= names
    moving = [v for v in e.model.non_trainable_variables if "moving_mean" in v.path]
    assert moving and all(f"non_trainable.{v.path.replace('/', '.')}" in names for v in moving)
    v = e.model.trainable_variables[0]
    assert np.array_equal(weights[f"trainable.{v.path.replace('/', '.')}"], np.asarray(v.value))


def test_refusals_say_what_to_do(tmp_path):
    sub = Residual()
    sub(np.zeros((1, 8), np.float32))
    with pytest.raises(ValueError, match="give example_inputs"):
        export_keras(sub, tmp_path, name="s", batch_sizes=[1])
    x = keras.Input((None, 4), name="open")
    model = keras.Model(x, keras.layers.Dense(2)(x))
    with pytest.raises(ValueError, match="open at axis 1: give example_inputs"):
        export_keras(model, tmp_path, name="o", batch_sizes=[1])
    # another backend: refused before anything is traced
    script = ("import os; os.environ['KERAS_BACKEND'] = 'numpy'\n"
              "import keras\n"
              "from pjserve_export import export_keras\n"
              "x = keras.Input((4,)); m = keras.Model(x, keras.layers.Dense(2)(x))\n"
              f"export_keras(m, {str(tmp_path)!r}, name='n', batch_sizes=[1])\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(common.REPO / "python")})
    assert r.returncode != 0
    assert "needs Keras's JAX backend" in r.stderr and "KERAS_BACKEND=jax" in r.stderr
