"""Triton's example models, as pjserve bundles.

Triton's example clients call models by name; these are they, with the
names, tensors, datatypes and shapes those clients use:

    simple           plain model: INPUT0, INPUT1 i32 [batch, 16] -> OUTPUT0 =
                     INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, i32 [batch,
                     16]; batch sizes up to 16 (Triton's simple says 8; its
                     model control example reloads it with max_batch_size 16).
                     The model most of the clients call (simple_*_infer,
                     async, aio, shared memory, model control, keepalive,
                     custom args, health and metadata, explicit int content).
    simple_int8      the same in i8 (grpc_explicit_int8_content_client.py).
    custom_identity_int32
                     INPUT0 i32 [batch, 16] -> OUTPUT0, the same values
                     (memory_growth_test.py); batch sizes up to 16.

    simple_string    hooked model. Client: INPUT0, INPUT1 bytes [batch, 16]
                     (decimal numerals) -> OUTPUT0 = INPUT0 + INPUT1,
                     OUTPUT1 = INPUT0 - INPUT1, bytes [batch, 16] (numerals);
                     batch sizes up to 8, as Triton's max_batch_size. The
                     executable adds and subtracts i32 [batch, 16]; its hooks
                     (C) parse the numerals, refuse what is not one or leaves
                     the 32-bit range, and write the results back as text.
    simple_identity  compute-only meta (no executable, no calls): INPUT0
                     bytes [batch, -1] -> OUTPUT0, the same strings, byte for
                     byte.
    repeat_int32     compute-only decoupled meta (gRPC ModelStreamInfer only):
                     IN i32 [n], DELAY u32 [n], WAIT u32 [1] -> for each i,
                     after DELAY[i] ms, one response OUT i32 [1] = IN[i], IDX
                     u32 [1] = i; then WAIT ms and the final response. Each
                     delay at most 10 s, all of them at most 1 min
                     (simple_grpc_custom_repeat.py).

    simple_sequence  sequence model with the control inputs START and READY
                     (the server fills them; clients send sequence_id,
                     sequence_start, sequence_end): INPUT i32 [batch, 1] ->
                     OUTPUT = INPUT + START, as Triton's (its
                     simple_*_sequence_* clients: 1 + the first value, then
                     each value as sent).
    simple_dyna_sequence
                     as simple_sequence, plus the sequence id (CORRID, u32) on
                     the last request: OUTPUT = INPUT + START + END * CORRID
                     (the clients' -d mode with integer ids).
    simple_string_dyna_sequence
                     keeps a running sum per sequence (state) and adds the id
                     on the last request: OUTPUT = sum of the inputs so far +
                     END * CORRID (the clients' -d mode with a string id, which
                     must be decimal digits).

simple_string is a hooked model rather than a meta because its arithmetic
is a tensor program: the scheduler batches concurrent requests into one
execution, and the model configuration reports max_batch_size 8 as Triton's
does. simple_identity has nothing to execute, so its C run is all of it.
The C code is examples/bundles/<name>/model.c.
"""

from pathlib import Path
from typing import Dict, Optional

import jax.numpy as jnp
import numpy as np

from . import hooks as H
from .jax_export import export_jax

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples" / "bundles"
SEQUENCE_EXAMPLE_NAMES = ("simple_sequence", "simple_dyna_sequence", "simple_string_dyna_sequence")
TRITON_EXAMPLE_NAMES = ("simple", "simple_int8", "custom_identity_int32", "simple_string",
                        "simple_identity", "repeat_int32") + SEQUENCE_EXAMPLE_NAMES
STRING_WIDTH = 16                # numerals per row
STRING_BATCH_SIZES = (1, 2, 4, 8)  # the largest is MAX_ROWS in its model.c: change both
SIMPLE_BATCH_SIZES = (1, 2, 4, 8, 16)
SEQUENCE_BATCH_SIZES = (1, 2, 4, 8)  # Triton's max_batch_size 8: steps of 8 sequences at once


def sequence_step(params, value, start, ready):
    """simple_sequence: INPUT + START in the rows that hold a request."""
    del params
    return (value + start) * ready


def dyna_sequence_step(params, value, start, end, ready, corrid):
    """simple_dyna_sequence: INPUT + START, plus the id on the last request."""
    del params
    return (value + start + end * corrid.astype(jnp.int32)) * ready


def running_sum_step(params, value, total, end, corrid):
    """simple_string_dyna_sequence: (the sum so far + END * CORRID, the sum)."""
    del params
    total = total + value
    return total + end * corrid.astype(jnp.int32), total


def _export_sequence_example(name: str, out_dir, target_stablehlo_version) -> Path:
    col = np.zeros((1, 1), np.int32)
    ids = np.zeros((1, 1), np.uint32)  # JAX without x64 has no u64
    common = dict(batch_sizes=SEQUENCE_BATCH_SIZES, output_names=["OUTPUT"],
                  target_stablehlo_version=target_stablehlo_version)
    if name == "simple_sequence":
        return export_jax(
            sequence_step, {}, [col, col, col], out_dir, name=name,
            input_names=["INPUT", "START", "READY"],
            sequence_controls={"start": "START", "ready": "READY"},
            description="OUTPUT = INPUT + START (Triton's simple_sequence)", **common)
    if name == "simple_dyna_sequence":
        return export_jax(
            dyna_sequence_step, {}, [col, col, col, col, ids], out_dir, name=name,
            input_names=["INPUT", "START", "END", "READY", "CORRID"],
            sequence_controls={"start": "START", "end": "END", "ready": "READY",
                               "corrid": "CORRID"},
            description="OUTPUT = INPUT + START + END * CORRID (Triton's simple_dyna_sequence)",
            **common)
    return export_jax(
        running_sum_step, {}, [col, col, col, ids], out_dir, name=name,
        input_names=["INPUT", "TOTAL", "END", "CORRID"], output_names=["OUTPUT", "TOTAL_NEXT"],
        sequence_state=[("TOTAL", "TOTAL_NEXT")],
        sequence_controls={"end": "END", "corrid": "CORRID"},
        batch_sizes=SEQUENCE_BATCH_SIZES, target_stablehlo_version=target_stablehlo_version,
        description="running sum of INPUT per sequence, plus END * CORRID "
                    "(Triton's simple_string_dyna_sequence)")


def add_and_subtract(params, a, b):
    """simple_string's executable: the element-wise sum and difference."""
    del params  # no weights
    return jnp.add(a, b), jnp.subtract(a, b)


def export_triton_example(name: str, out_dir, build: Optional[H.Builder] = None,
                          target_stablehlo_version: Optional[str] = None) -> Dict[str, Path]:
    """Exports example `name` (TRITON_EXAMPLE_NAMES) into out_dir; returns
    {bundle name: path}. `build` builds model.so (`hooks.hooks_builder`);
    None leaves it to `pjserve build-hooks`."""
    if name == "custom_identity_int32":
        return {name: export_jax(
            lambda params, x: x, {}, [np.zeros((1, STRING_WIDTH), np.int32)], out_dir,
            name=name, batch_sizes=SIMPLE_BATCH_SIZES, input_names=["INPUT0"],
            output_names=["OUTPUT0"],
            description="OUTPUT0 = INPUT0, i32 (Triton's custom_identity_int32)",
            target_stablehlo_version=target_stablehlo_version)}
    if name in ("simple", "simple_int8"):
        dtype = np.int8 if name == "simple_int8" else np.int32
        row = np.zeros((1, STRING_WIDTH), dtype)
        return {name: export_jax(
            add_and_subtract, {}, [row, row], out_dir, name=name,
            batch_sizes=SIMPLE_BATCH_SIZES, input_names=["INPUT0", "INPUT1"],
            output_names=["OUTPUT0", "OUTPUT1"],
            description=f"OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, "
                        f"{np.dtype(dtype).name} (Triton's {name})",
            target_stablehlo_version=target_stablehlo_version)}
    if name in SEQUENCE_EXAMPLE_NAMES:
        return {name: _export_sequence_example(name, out_dir, target_stablehlo_version)}
    source = EXAMPLES_DIR / name / H.HOOKS_SOURCE
    if name == "simple_string":
        row = np.zeros((1, STRING_WIDTH), np.int32)
        strings = [(f"INPUT{i}", "bytes", ["batch", STRING_WIDTH]) for i in range(2)]
        results = [(f"OUTPUT{i}", "bytes", ["batch", STRING_WIDTH]) for i in range(2)]
        return {name: export_jax(
            add_and_subtract, {}, [row, row], out_dir, name=name,
            batch_sizes=STRING_BATCH_SIZES, input_names=["a", "b"],
            output_names=["sum", "difference"],
            description="integers as text: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 "
                        "(Triton's simple_string)",
            client_inputs=strings, client_outputs=results, hooks_source=source,
            build_hooks=build, target_stablehlo_version=target_stablehlo_version)}
    if name == "simple_identity":
        return {name: H.export_meta(
            out_dir, name=name, calls=[],
            client_inputs=[("INPUT0", "bytes", ["batch", -1])],
            client_outputs=[("OUTPUT0", "bytes", ["batch", -1])], source=source, build=build,
            description="returns its strings unchanged (Triton's simple_identity)")}
    if name == "repeat_int32":
        return {name: H.export_meta(
            out_dir, name=name, calls=[], decoupled=True,
            client_inputs=[("IN", "i32", [-1]), ("DELAY", "u32", [-1]), ("WAIT", "u32", [1])],
            client_outputs=[("OUT", "i32", [1]), ("IDX", "u32", [1])], source=source,
            build=build,
            description="one response per IN value after its DELAY in ms, then WAIT ms "
                        "(decoupled; Triton's repeat_int32)")}
    raise ValueError(f"unknown example {name!r}; known: {list(TRITON_EXAMPLE_NAMES)}")
