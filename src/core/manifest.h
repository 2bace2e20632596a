/*
 * manifest.h - the bundle manifest (manifest.yaml), parsed and validated.
 *
 * See docs/bundle-format.md for the schema. The parser is strict: unknown
 * keys, wrong types, duplicate names, a batch axis anywhere but first,
 * variants that change a tensor's rank or batch axis or repeat another's
 * input shapes, or a format_version other than "2.0" are rejected with a
 * message that names the file (the `label`) and the field ("inputs[1].dtype").
 *
 * A parsed manifest is plain owned memory, read-only after parsing.
 */
#ifndef PJS_CORE_MANIFEST_H
#define PJS_CORE_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/residency.h"
#include "core/shape.h"
#include "core/status.h"

/* Largest manifest file accepted. */
#define PJS_MANIFEST_MAX_BYTES (1u << 20)
/* Most variants a model may declare besides its top-level shapes ("default"). */
#define PJS_MANIFEST_MAX_VARIANTS 16
/* Longest library name in hooks_libraries. */
#define PJS_MANIFEST_LIBRARY_MAX 64

typedef enum pjs_model_kind {
    PJS_KIND_MODEL = 0,
    PJS_KIND_META = 1,
    PJS_KIND_ENSEMBLE = 2, /* declarative steps, run by the meta engine (no model.so) */
} pjs_model_kind;

/* Most steps an ensemble may have, and most entries of one step's input_map
 * or output_map (a step's inputs travel as one sub-call). */
#define PJS_ENSEMBLE_MAX_STEPS 64
#define PJS_ENSEMBLE_MAX_MAP 64

/* The layout of an image input, as clients read it from the model
 * configuration (Triton's ModelInput.format, same values). */
typedef enum pjs_tensor_format {
    PJS_FORMAT_NONE = 0,
    PJS_FORMAT_NHWC = 1,
    PJS_FORMAT_NCHW = 2,
} pjs_tensor_format;

/* "FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW". */
const char *pjs_tensor_format_name(pjs_tensor_format f);

/* Largest labels file accepted. */
#define PJS_LABELS_MAX_BYTES (16u << 20)

/* The class names of an output that clients may ask to classify (the
 * classification extension, core/classify.h): the manifest entry's
 * `labels: FILE` names a file in the bundle directory whose line i names
 * class i. pjs_manifest_load reads it; a manifest only parsed has the file
 * name and no names (count 0). */
typedef struct pjs_labels {
    char *file;   /* as declared */
    size_t count; /* lines read */
    char **names; /* count of them, NUL-terminated, pointing into text; "" for an empty line */
    char *text;
} pjs_labels;

typedef struct pjs_tensor_spec {
    char *name;
    pjs_dtype dtype; /* PJS_DTYPE_BYTES only in client tensors */
    /* Extents; when `batched`, dims[0] is the batch axis and holds -1. In
     * client tensors other extents may be -1 too: any extent is accepted. */
    pjs_shape shape;
    bool batched;
    /* Inputs only (`format: NHWC | NCHW` in the manifest); an image input has
     * three extents besides the batch axis. */
    pjs_tensor_format format;
    /* Outputs and client outputs only (`labels: FILE`), else NULL. Owned by
     * the top-level tensor; a variant's copy of the tensor shares it. */
    pjs_labels *labels;
} pjs_tensor_spec;

/* An input-shape variant: the model's tensors at other shapes, executed by
 * its own modules over the same weights. Tensors are in manifest order with
 * the top level's names, dtypes, ranks and batch axes. variants[0] is the top
 * level itself ("default"; its arrays are m->inputs and m->outputs). No two
 * variants have the same input shapes, so a request's shapes name at most
 * one. */
typedef struct pjs_variant {
    char *name;
    pjs_tensor_spec *inputs;   /* n_inputs */
    pjs_tensor_spec *outputs;  /* n_outputs */
} pjs_variant;

/* One entry of a step's input_map or output_map: the step model's tensor
 * and the ensemble tensor it reads or writes. */
typedef struct pjs_ensemble_map {
    char *model_tensor;
    char *ensemble_tensor;
} pjs_ensemble_map;

/* One of ensemble.steps: call `model` with the ensemble tensors input_map
 * names, and publish the outputs output_map names. */
typedef struct pjs_ensemble_step {
    char *model;
    int64_t version;              /* -1: the version served (`version` left out) */
    size_t n_inputs;
    pjs_ensemble_map *inputs;     /* input_map, in manifest order */
    size_t n_outputs;
    pjs_ensemble_map *outputs;    /* output_map, in manifest order */
} pjs_ensemble_step;

/* One state tensor pair of a stateful model (`sequence.state`): the
 * executable's input inputs[input] takes a sequence's state, its output
 * outputs[output] returns the next; both batched, the same dtype and shape. */
typedef struct pjs_state_pair {
    size_t input;
    size_t output;
} pjs_state_pair;

/* Most state tensors a stateful model may declare. */
#define PJS_SEQUENCE_MAX_STATE 16

/* The control inputs a stateful model may declare (`sequence.controls`,
 * Triton's control_input kinds): inputs the server fills in each step's
 * row, which clients do not send. */
typedef enum pjs_sequence_control {
    PJS_CONTROL_START,  /* 1 on a sequence's first request, else 0 */
    PJS_CONTROL_END,    /* 1 on its last request, else 0 */
    PJS_CONTROL_READY,  /* 1 in every request's row (padding rows stay 0) */
    PJS_CONTROL_CORRID, /* the sequence's id, a number */
    PJS_CONTROL_COUNT
} pjs_sequence_control;

/* pjs_sequence_spec.control[k] when control k is not declared. */
#define PJS_CONTROL_NONE ((size_t)-1)

/* "start", "end", "ready", "corrid": the manifest's keys. */
const char *pjs_sequence_control_name(pjs_sequence_control k);

/* A stateful model's `sequence:` section (docs/bundle-format.md). */
typedef struct pjs_sequence_spec {
    size_t n_state;
    pjs_state_pair state[PJS_SEQUENCE_MAX_STATE];
    /* inputs[control[k]] takes control k, or PJS_CONTROL_NONE; a control
     * input has the batch axis and one element per row. */
    size_t control[PJS_CONTROL_COUNT];
    int64_t idle_timeout_ms; /* a sequence idle this long is freed; > 0 */
    int64_t max_sequences;   /* live at once; > 0 */
    /* Live at once started by one client (its address, frontend/client_id.h);
     * 1..max_sequences, a quarter of max_sequences by default (at least 1). */
    int64_t max_sequences_per_client;
    /* A new sequence in a full table evicts the least recently used one
     * idle longer than this; 1..idle_timeout_ms. */
    int64_t evict_after_idle_ms;
    /* The tensors clients see: the executable's without the state and
     * control tensors, in manifest order (shallow copies: names and labels
     * belong to inputs[] and outputs[]). */
    size_t n_client_inputs;
    pjs_tensor_spec *client_inputs;
    size_t n_client_outputs;
    pjs_tensor_spec *client_outputs;
} pjs_sequence_spec;

/* Most entries of `swap_in_stages`. */
#define PJS_MANIFEST_MAX_STAGES 16

/* One of `swap_in_stages` (docs/bundle-format.md): the module
 * swap_in.s<k>.b<N>.mlir takes `weights` (names from weights.safetensors,
 * in this order), then stage k-1's outputs (stage 0: the model's inputs),
 * and returns `outputs`, carried to stage k+1; the last stage has none and
 * returns the model's outputs. The registry checks the names against the
 * weights file and that each stage's first-used weights follow the earlier
 * stages' in argument_order, so that each stage's copy is one block. */
typedef struct pjs_swap_in_stage {
    size_t n_weights;
    char **weights;
    size_t n_outputs;
    pjs_tensor_spec *outputs;
} pjs_swap_in_stage;

typedef struct pjs_manifest {
    char *name;
    pjs_model_kind kind;
    char *description;             /* optional, may be NULL */
    size_t n_inputs;
    pjs_tensor_spec *inputs;       /* the executable's; none for kind meta */
    size_t n_outputs;
    pjs_tensor_spec *outputs;
    /* What clients send and get when it differs from the executable's
     * (a hooked model: its hooks convert; kind meta: always); NULL and 0
     * when not declared. pjs_manifest_client_tensors picks. */
    size_t n_client_inputs;
    pjs_tensor_spec *client_inputs;
    size_t n_client_outputs;
    pjs_tensor_spec *client_outputs;
    size_t n_batch_sizes;
    int64_t *batch_sizes;          /* strictly ascending, each >= 1 */
    size_t n_variants;             /* kind model: 1..1 + PJS_MANIFEST_MAX_VARIANTS; meta: 0 */
    pjs_variant *variants;
    pjs_residency residency;
    double weight;                 /* scheduler share, > 0; default 1 */
    /* `decoupled: true` (kind meta only): the run may send zero, one or many
     * responses per request with pjserve_respond, over ModelStreamInfer
     * alone; Triton's decoupled transaction policy. */
    bool decoupled;
    /* A `sequence:` section (kind model only): the server keeps each
     * sequence's state tensors between its requests. */
    bool stateful;
    pjs_sequence_spec sequence;
    size_t n_calls;
    char **calls;                  /* meta.calls; an ensemble's step models, each once */
    /* `hooks_libraries` (kinds model and meta): what model.c links with,
     * each a name as it follows -l ([A-Za-z0-9_+.-], 1 to
     * PJS_MANIFEST_LIBRARY_MAX bytes, not starting with '-'), each once;
     * `pjserve build-hooks` appends them as -lNAME. */
    size_t n_hooks_libraries;
    char **hooks_libraries;
    /* Kind ensemble only (else 0 and NULL). The parse checked the graph:
     * every step input is a client input or some step's output, every
     * ensemble tensor is written once, every client output is written and
     * every client input read, and no cycle; step_order lists the steps so
     * that each comes after the steps writing its inputs. */
    size_t n_steps;
    pjs_ensemble_step *steps;
    size_t *step_order;
    /* Kind model, optional (else 0 and NULL): the stages a cold model's
     * first execution may run while later stages' weights are still being
     * copied (pipelined swap-in, docs/residency.md); 2..16 of them. Never
     * with variants. */
    size_t n_stages;
    pjs_swap_in_stage *stages;
} pjs_manifest;

/* Bytes of one example (one batch row) of a tensor; the whole tensor when it
 * has no batch axis. */
size_t pjs_tensor_spec_row_bytes(const pjs_tensor_spec *s);

/* The variant whose every input fits shapes[i] (manifest order, n_inputs of
 * them): the same rank and extents, whatever the batch axis holds. A request
 * (or `pjserve run`) resolves to it. False when none fits. */
bool pjs_manifest_find_variant(const pjs_manifest *m, const pjs_shape *const *shapes,
                               size_t *variant);

/* Lists every variant's input shapes into buf, for messages: "default
 * [-1, 3, 16, 16], wide [-1, 3, 16, 32]" for one input, "default (a [-1, 8],
 * b [-1, 3]), wide (...)" for several; truncated to fit. Returns buf. */
const char *pjs_manifest_format_variants(const pjs_manifest *m, char *buf, size_t size);

/* The tensors clients see: the declared client_inputs (client_outputs with
 * `output`), a stateful model's inputs (outputs) without its state tensors,
 * else the executable's inputs (outputs). *n is their count. */
const pjs_tensor_spec *pjs_manifest_client_tensors(const pjs_manifest *m, bool output, size_t *n);

/* The shape clients are shown for client input (or, with `output`, output)
 * i: a declared client tensor's shape as declared; otherwise the top-level
 * shape with every extent that differs between variants as -1 (the batch
 * axis is -1 already). */
pjs_shape pjs_manifest_client_shape(const pjs_manifest *m, bool output, size_t i);

/* Elements of one row of an output (the batch axis left out; the whole
 * tensor when it has none): the classes a classification ranks. -1 when an
 * extent other than the batch axis is -1 (a client tensor's, known only per
 * request). */
int64_t pjs_tensor_spec_row_elements(const pjs_tensor_spec *s);

/* pjs_manifest_parse leaves labels files unread; pjs_manifest_load reads
 * every one (beside the manifest file) and refuses a missing or unreadable
 * file, a NUL byte in it, or fewer lines than the output's row has
 * elements at any variant's shape. */
int pjs_manifest_parse(pjs_manifest *m, const char *yaml, size_t len, const char *label,
                       pjs_error *err);
int pjs_manifest_load(pjs_manifest *m, const char *path, pjs_error *err);
void pjs_manifest_free(pjs_manifest *m);

#endif
