/*
 * infer.h - one inference request as every front end hands it to the server.
 *
 * A front end (gRPC, HTTP) decodes its wire format into a pjs_infer_request:
 * input names, datatypes, shapes and pointers to the input bytes, which stay
 * owned by the front end (the decoded message, a converted JSON buffer, or a
 * shared-memory region) until the request completes. pjs_infer_validate then
 * checks the request against the model's manifest in one place, so both
 * protocols reject the same mistakes with the same words, and puts the inputs
 * in manifest order. The device owner fills `outputs` (owned by the
 * request, freed by pjs_infer_request_release); `on_done` is called once the
 * device was given back, on the submitting thread or a dispatcher worker,
 * where the front end encodes and responds.
 *
 * A request belongs to one thread at a time: the front end until submit, the
 * dispatcher until completion, then the front end again.
 */
#ifndef PJS_CORE_INFER_H
#define PJS_CORE_INFER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/manifest.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/job.h"
#include "trace/trace.h"

/* Most inputs or outputs a served model may have. */
#define PJS_INFER_MAX_TENSORS 64

struct pjs_model;
struct pjs_shm_view;

typedef struct pjs_infer_input {
    const char *name;     /* borrowed, NUL-terminated */
    const char *datatype; /* KServe datatype as sent ("FP32"), borrowed */
    pjs_shape shape;
    const void *data;     /* borrowed; nbytes long (BYTES: serialized, core/bytes.h) */
    size_t nbytes;
    const pjs_tensor_spec *spec; /* set by pjs_infer_validate */
    /* The CUDA shared memory window the bytes are in, borrowed, while they
     * are not read (data NULL, nbytes the window's size): the dispatcher
     * reads them on the device, or into host memory where it must
     * (pjs_infer_read_device_inputs). NULL elsewhere. */
    struct pjs_shm_view *device;
} pjs_infer_input;

/* An output the client asked for by name, with its delivery options. */
typedef struct pjs_infer_requested_output {
    const char *name;        /* borrowed */
    bool binary_data;        /* HTTP: send as binary (binary_data_output or per-output) */
    const char *shm_region;  /* shared memory region name, or NULL */
    uint64_t shm_offset;
    uint64_t shm_byte_size;
    /* The region's window, borrowed: a CUDA one on the model's device is
     * written device to device by the dispatcher (outputs[].in_shm). */
    const struct pjs_shm_view *shm_view;
    /* Classification extension: the best class_count classes of each row
     * instead of the tensor; 0: the tensor itself (core/classify.h). */
    uint64_t class_count;
    pjs_tensor_spec class_spec; /* what the output is once classified (BYTES) */
} pjs_infer_requested_output;

/* One produced output, in manifest order. */
typedef struct pjs_infer_output {
    const pjs_tensor_spec *spec;
    pjs_shape shape;       /* batch axis set to the request's batch */
    void *data;            /* owned; NULL when not wanted (BYTES: serialized) */
    size_t nbytes;
    int requested;         /* index into requested[] or -1 (all outputs sent) */
    /* Already in the requested output's CUDA shared memory window, written
     * there on the device (data NULL, nbytes its size). */
    bool in_shm;
} pjs_infer_output;

/* Monotonic nanosecond timestamps of a request's life (0: not reached). */
typedef struct pjs_infer_times {
    uint64_t received;      /* front end started decoding */
    uint64_t queued;        /* submitted to the dispatcher */
    uint64_t exec_start;    /* dispatcher dequeued it */
    uint64_t input_done;    /* inputs on the device */
    uint64_t infer_done;    /* execution finished */
    uint64_t output_done;   /* outputs back on the host, sliced */
    uint64_t hooks_done;    /* a hooked model's postprocess returned (0: none ran) */
} pjs_infer_times;

/* The sequence batching parameters of a request (sequence_id,
 * sequence_start, sequence_end), as front ends decode them. sequence_id 0
 * or "" means none, as in Triton. */
typedef struct pjs_infer_sequence {
    bool has_id;        /* a sequence_id other than 0 or "" */
    bool is_string;
    uint64_t number;    /* the id when it is an integer */
    const char *string; /* the id when it is a string: borrowed, NUL-terminated */
    bool start;         /* sequence_start: true */
    bool end;           /* sequence_end: true */
    /* Who sent a request with sequence_start to a stateful model
     * (frontend/client_id.h), set by the front end: the new sequence counts
     * to that client's cap. Borrowed; NULL counts as one unnamed client. */
    const char *client;
} pjs_infer_sequence;

typedef struct pjs_infer_request pjs_infer_request;
typedef void (*pjs_infer_done_fn)(pjs_infer_request *r);
/* Sends one response of a decoupled model's request now (see `respond`):
 * n outputs in client_outputs order, each owned by the callee from the call
 * on (data malloc'd, NULL for an output the client did not request; freed
 * whatever the result); n is 0 for a response carrying only the final flag. */
typedef int (*pjs_infer_respond_fn)(pjs_infer_request *r, pjs_infer_output *outputs, size_t n,
                                    bool final, pjs_error *err);

struct pjs_infer_request {
    struct pjs_model *model;  /* a reference the request holds */
    const char *id;           /* borrowed, NUL-terminated; "" when the client sent none */

    size_t n_inputs;
    pjs_infer_input inputs[PJS_INFER_MAX_TENSORS];
    /* Outputs named by the client; none means "every output". */
    size_t n_requested;
    pjs_infer_requested_output requested[PJS_INFER_MAX_TENSORS];
    bool binary_data_output; /* HTTP parameter: every output binary by default */
    /* A stateful model's requests name their sequence (server/sequence.h);
     * other models accept and ignore these, as Triton does. */
    pjs_infer_sequence sequence;

    /* Set by validation: rows in the batch axis (1 for unbatched models) and
     * the manifest variant (input shapes) the request resolved to. */
    int64_t batch;
    size_t variant;
    /* Monotonic nanoseconds (pjs_now_ns) after which the request is no longer
     * worth answering, 0 for none. Front ends set it from the gRPC deadline
     * and the KServe `timeout` parameter (the earlier wins); the server adds
     * the model's default when neither was given. */
    uint64_t deadline_ns;
    /* Set by a front end that notices its client going away while the
     * request runs (gRPC ModelStreamInfer: the stream cancelled, or dead
     * after a failed write), NULL elsewhere: true from then on. Read by
     * bundle code through pjserve_cancelled; it lives as long as the
     * request. */
    const atomic_bool *client_gone;
    /* Who sent the request, for sharing threads fairly between clients
     * (server/meta_gate.h): the ModelStreamInfer stream it came on, NULL
     * elsewhere (a client of its own). Compared, never dereferenced. */
    const void *client;
    /* The request's place in a trace (server/request_trace.c): its own
     * span's context, sampled or not; zero when tracing is off. Set by the
     * front end, or by a meta for its sub-calls. */
    pjs_trace_ctx trace;
    /* Set by a front end whose every other thread was busy when this one
     * submitted the request: executing it here would leave the front end's
     * connections unread meanwhile, so the dispatcher lets this thread run
     * only a quick execution itself (pjs_dispatcher_submit). */
    bool sole_poller;
    /* Set by the dispatcher. */
    size_t n_outputs;
    pjs_infer_output outputs[PJS_INFER_MAX_TENSORS];
    pjs_infer_times times;
    /* The execution the request rode in: rows of all its requests, the
     * compiled batch size, and how many requests. */
    int64_t exec_rows, exec_batch_size;
    size_t exec_requests;
    /* Where its model's weights were when it was queued (a pjs_tier): the
     * tier it is counted under (pjserve_request_tier_seconds). */
    unsigned char queued_tier;
    pjs_error error; /* code PJS_OK on success */

    /* Called once when outputs or error are set (see the top of this file). */
    pjs_infer_done_fn on_done;
    void *frontend_ctx;
    /* Set by a front end that can carry many responses per request (gRPC
     * ModelStreamInfer), NULL elsewhere: a decoupled model's request needs
     * it (pjs_server_submit refuses one without). Called on the thread
     * running the model's code, before on_done; it may block while the
     * stream's write queue is full, until deadline_ns. */
    pjs_infer_respond_fn respond;

    pjs_sched_job job;       /* the scheduler's view while queued */
    /* Committed requests: their caller's in-flight flag, cleared just before
     * on_done (pjs_server_submit_committed). */
    atomic_bool *committed_slot;
    pjs_infer_request *next; /* completion queue link */
};

/* Zeroes r, sets id to "" and received to now. */
void pjs_infer_request_init(pjs_infer_request *r);
/* Frees the outputs; does not touch the model reference. */
void pjs_infer_request_release(pjs_infer_request *r);

/* Checks a decoded request against a model's executable: every input named
 * once and known, datatype, shape (batch axis in 1..max_batch for batched
 * inputs, every other extent exact), byte size, batched inputs agreeing on
 * the batch, requested outputs known and named once (and numeric when
 * they are to be classified). Reorders inputs to
 * manifest order and sets r->batch. With several input-shape variants, the
 * shapes must fit one variant: r->variant is set to it and every input's
 * spec is that variant's (r->variant is 0 for a model with one). Errors are
 * PJS_ERR_INVALID_ARGUMENT with a message naming the model, the tensor and
 * what was expected; a request matching no variant is told every variant's
 * shapes. */
int pjs_infer_validate(pjs_infer_request *r, const pjs_manifest *m, int64_t max_batch,
                       pjs_error *err);

/* The same checks against the tensors clients see
 * (pjs_manifest_client_tensors: a hooked or meta model's client_inputs and
 * client_outputs, else the executable's), without variants: an extent
 * declared -1 takes any extent >= 0, and a BYTES input must be well formed
 * (see core/bytes.h) with as many elements as its shape has. Reorders the
 * inputs to client_inputs order, points their specs at the client tensors
 * and sets r->batch (1 when no client input is batched) and r->variant (0). */
int pjs_infer_validate_client(pjs_infer_request *r, const pjs_manifest *m, int64_t max_batch,
                              pjs_error *err);

/* Gives input `in` the bytes of shared memory window `view` (which outlives
 * the request): a CUDA window stays where it is (in->device, read where it
 * is used), a system one is read into the view now (pjs_shm_view_read's
 * errors). */
int pjs_infer_input_from_shm(pjs_infer_input *in, struct pjs_shm_view *view, pjs_error *err);
/* Reads every input still in CUDA shared memory (`device`) into host memory
 * the input's view owns, for the code that reads inputs on the host: hooks,
 * metas, sequences, BYTES. */
int pjs_infer_read_device_inputs(pjs_infer_request *r, pjs_error *err);

/* Monotonic clock in nanoseconds. */
uint64_t pjs_now_ns(void);
/* Wall clock in milliseconds since the Unix epoch. */
uint64_t pjs_wall_ms(void);

#endif
