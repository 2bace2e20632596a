/*
 * grpc_floor.c - the floor of a gRPC server on this gRPC library, and one C
 * client that measures both the floor and a real KServe server.
 *
 *   pjs_bench_grpc_floor echo-server --port P [--host H] [--threads N]
 *   pjs_bench_grpc_floor client --target HOST:PORT --method echo|infer
 *                        [--model NAME] [--input NAME] [--datatype T] [--shape D,D..]
 *                        [--concurrency C] [--seconds S] [--warmup S]
 *                        [--shared-channel] [--json]
 *
 * echo-server is the least a server on the gRPC C core can do per call: one
 * registered unary method, /pjserve.bench.Echo/Echo, whose request message
 * arrives with the call (GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER) and is
 * sent back unchanged, with the initial metadata, the status and the receive
 * of the client's close in one batch. No decoding, no allocation besides the
 * call's own. The threading is pjserve's front end's: N threads (default,
 * as pjserve's: one per CPU the process may run on, at most 4) wait on one
 * completion queue and run whatever event comes; one call of
 * the method is requested at a time, and the thread that receives it
 * requests the next before answering. SIGINT or SIGTERM shuts it down.
 *
 * client drives a server with --concurrency synchronous workers: each has its
 * own thread, completion queue and channel (its own connection, through a
 * local subchannel pool; --shared-channel gives all workers one channel) and
 * makes one call at a time, the whole call as one batch. --method infer
 * sends inference.GRPCInferenceService/ModelInfer for --model with one input
 * (default mlp's: x FP32 [1,16]) in raw_input_contents, built once with the
 * protobuf-c messages of pjs_grpc_codec, and checks every response: status
 * OK, one raw output per output. --method echo sends those same request bytes
 * to the echo method and checks that they come back. Calls made during
 * --warmup seconds are not counted; then every call that ends within the
 * next --seconds is: requests/s, latency p50/p90/p99/mean/min in
 * microseconds, and the client process's own CPU time per request (all its
 * threads, gRPC's included); the JSON also counts every successful call,
 * warm-up included (calls_total), for whoever measures the server's CPU
 * time over the client's whole run. Any failed call is an error; the exit status is
 * 1 if there was one.
 *
 * One client for both sides, so what the client itself costs is the same in
 * both numbers and their ratio is the server's doing.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "grpc_service.pb-c.h"

#define ECHO_METHOD "/pjserve.bench.Echo/Echo"
#define INFER_METHOD "/inference.GRPCInferenceService/ModelInfer"
#define MAX_THREADS 256
#define MAX_DIMS 8
/* A call that takes longer than this is an error. */
#define CALL_DEADLINE_S 30
/* First capacity of a worker's latency record; it doubles as needed. */
#define FIRST_RECORD 4096

/* pjserve's default count of gRPC threads (src/frontend/grpc/frontend.c). */
static long default_threads(void)
{
    cpu_set_t set;
    long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return cpus < 1 ? 1 : cpus > 2 ? 2 : cpus;
}

static const char usage[] =
    "usage: pjs_bench_grpc_floor echo-server --port P [--host H] [--threads N]\n"
    "       pjs_bench_grpc_floor client --target HOST:PORT --method echo|infer\n"
    "                            [--model NAME] [--input NAME] [--datatype T]\n"
    "                            [--shape D,D,..] [--concurrency C] [--seconds S]\n"
    "                            [--warmup S] [--shared-channel] [--json]\n"
    "\n"
    "echo-server: a unary gRPC method (" ECHO_METHOD ") that returns the request\n"
    "  bytes unchanged; N threads on one completion queue (default, as pjserve's: one\n"
    "  per CPU the process may run on, at most 2). --port 0 picks a free port; the port\n"
    "  is printed. SIGINT or SIGTERM stops it.\n"
    "client: C synchronous workers, one call at a time each, for S seconds (default 5)\n"
    "  after a warm-up (default 1 s). infer sends a ModelInfer request for --model\n"
    "  (default mlp) with one input (default x FP32 [1,16]) in raw_input_contents;\n"
    "  echo sends the same bytes to the echo method. Prints requests/s and latency in\n"
    "  microseconds (--json: one JSON object); exit status 1 if any call failed.\n";

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static double cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static long parse_long(const char *flag, const char *arg, long lo, long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(arg, &end, 10);
    if (errno != 0 || end == arg || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "pjs_bench_grpc_floor: %s %s: expected an integer in [%ld, %ld]\n", flag,
                arg, lo, hi);
        exit(2);
    }
    return (long)v;
}

static double parse_seconds(const char *flag, const char *arg, double lo)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno != 0 || end == arg || *end != '\0' || !(v >= lo) || v > 86400) {
        fprintf(stderr, "pjs_bench_grpc_floor: %s %s: expected seconds >= %g\n", flag, arg, lo);
        exit(2);
    }
    return v;
}

/* ======================================================================
 * echo-server
 * ====================================================================== */

typedef struct echo_server {
    grpc_server *core;
    grpc_completion_queue *cq;
    void *method;           /* the registered echo method */
    atomic_bool stopping;   /* set before shutdown: request no more calls */
    char shutdown_tag;      /* its address is the tag of the shutdown event */
} echo_server;

/* One call, from its request to its answer's completion. The call itself is
 * the tag of both its events; `answered` says which one comes next. */
typedef struct echo_call {
    echo_server *server;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array metadata;
    grpc_byte_buffer *payload; /* the request message, NULL if the client sent none */
    int cancelled;
    bool answered;
    /* Bumped (release) each time the call is handed to gRPC and read
     * (acquire) when its tag comes back: gRPC is not built for
     * ThreadSanitizer, so this is what shows the thread that takes the tag
     * what the thread that handed it over wrote. */
    atomic_int handoffs;
} echo_call;

static void echo_call_free(echo_call *c)
{
    if (c->call != NULL)
        grpc_call_unref(c->call);
    if (c->payload != NULL)
        grpc_byte_buffer_destroy(c->payload);
    grpc_metadata_array_destroy(&c->metadata);
    free(c);
}

static void echo_request(echo_server *s)
{
    if (atomic_load(&s->stopping))
        return;
    echo_call *c = calloc(1, sizeof *c);
    if (c == NULL) {
        fprintf(stderr, "pjs_bench_grpc_floor: no memory to accept a call\n");
        return;
    }
    c->server = s;
    grpc_metadata_array_init(&c->metadata);
    atomic_fetch_add_explicit(&c->handoffs, 1, memory_order_release);
    if (grpc_server_request_registered_call(s->core, s->method, &c->call, &c->deadline,
                                            &c->metadata, &c->payload, s->cq, s->cq,
                                            c) != GRPC_CALL_OK) {
        fprintf(stderr, "pjs_bench_grpc_floor: cannot request a call\n");
        echo_call_free(c);
    }
}

/* A call arrived: request the next one, then answer with its own bytes.
 * The order matters at shutdown too: while the next call is requested, this
 * one is still unanswered, so the server's shutdown cannot complete (and the
 * queue cannot be shut down) under a request that missed `stopping`. */
static void echo_answer(echo_call *c)
{
    echo_request(c->server);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (c->payload != NULL) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->payload;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n++].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    c->answered = true;
    grpc_call *call = c->call; /* c is gRPC's from the handoff on */
    atomic_fetch_add_explicit(&c->handoffs, 1, memory_order_release);
    if (grpc_call_start_batch(call, ops, n, c, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "pjs_bench_grpc_floor: cannot answer a call\n");
        echo_call_free(c);
    }
}

static void *echo_thread(void *arg)
{
    echo_server *s = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return NULL;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &s->shutdown_tag) {
            grpc_completion_queue_shutdown(s->cq);
            continue;
        }
        echo_call *c = ev.tag;
        atomic_load_explicit(&c->handoffs, memory_order_acquire);
        if (!ev.success || c->answered)
            echo_call_free(c);
        else
            echo_answer(c);
    }
}

static int echo_server_main(int argc, char **argv)
{
    static const struct option opts[] = {{"host", required_argument, NULL, 'H'},
                                         {"port", required_argument, NULL, 'p'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *host = "127.0.0.1";
    long port = -1, n_threads = default_threads();
    int opt;
    while ((opt = getopt_long(argc, argv, "H:p:t:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'H': host = optarg; break;
        case 'p': port = parse_long("--port", optarg, 0, 65535); break;
        case 't': n_threads = parse_long("--threads", optarg, 1, MAX_THREADS); break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    if (port < 0 || optind != argc) {
        fputs(usage, stderr);
        return 2;
    }

    /* Blocked before gRPC starts its own threads, so only sigwait sees them. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

    grpc_init();
    echo_server s = {0};
    pthread_t threads[MAX_THREADS];
    long started = 0;
    int rc = 1;
    grpc_arg no_reuseport = {.type = GRPC_ARG_INTEGER,
                             .key = (char *)GRPC_ARG_ALLOW_REUSEPORT,
                             .value.integer = 0};
    grpc_channel_args args = {.num_args = 1, .args = &no_reuseport};
    s.core = grpc_server_create(&args, NULL);
    s.cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s.core, s.cq, NULL);
    s.method = grpc_server_register_method(s.core, ECHO_METHOD, NULL,
                                           GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    char addr[300];
    snprintf(addr, sizeof addr, strchr(host, ':') ? "[%s]:%ld" : "%s:%ld", host, port);
    int bound = 0;
    if (s.method != NULL) {
        grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
        bound = grpc_server_add_http2_port(s.core, addr, creds);
        grpc_server_credentials_release(creds);
    }
    if (bound == 0) {
        fprintf(stderr, "pjs_bench_grpc_floor: cannot %s %s\n",
                s.method == NULL ? "register the echo method on" : "listen on (in use?)", addr);
        grpc_server_destroy(s.core); /* never started, nothing bound */
        grpc_completion_queue_shutdown(s.cq);
        goto out;
    }
    grpc_server_start(s.core);
    echo_request(&s);
    for (; started < n_threads; started++)
        if (pthread_create(&threads[started], NULL, echo_thread, &s) != 0)
            break;
    if (started == n_threads) {
        printf("pjs_bench_grpc_floor: echo server listening on %s:%d (%s), %ld threads\n", host,
               bound, ECHO_METHOD, n_threads);
        fflush(stdout);
        int sig;
        sigwait(&stop_signals, &sig);
        rc = 0;
    } else {
        fprintf(stderr, "pjs_bench_grpc_floor: cannot start the threads\n");
    }
    atomic_store(&s.stopping, true);
    grpc_server_shutdown_and_notify(s.core, s.cq, &s.shutdown_tag);
    grpc_server_cancel_all_calls(s.core);
    if (started == 0)
        echo_thread(&s);
    for (long i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    grpc_server_destroy(s.core);
out:
    /* The queue is shut down and drained here. */
    grpc_completion_queue_destroy(s.cq);
    grpc_shutdown();
    return rc;
}

/* ======================================================================
 * client
 * ====================================================================== */

typedef enum { METHOD_ECHO, METHOD_INFER } client_method;

enum { PHASE_WARMUP, PHASE_MEASURE, PHASE_STOP };

typedef struct client_config {
    const char *target;
    client_method method;
    const char *model;
    const char *input;
    const char *datatype;
    int64_t shape[MAX_DIMS];
    size_t rank;
    long concurrency;
    double seconds, warmup;
    bool shared_channel;
    bool json;
    grpc_slice request; /* the packed ModelInferRequest, sent by both methods */
} client_config;

/* One synchronous worker. Only its own thread touches it until joined. */
typedef struct worker {
    pthread_t thread;
    const client_config *cfg;
    atomic_int *phase;
    grpc_channel *channel;      /* owned unless the channel is shared */
    void *registered;           /* the method registered on that channel */
    grpc_completion_queue *cq;  /* this worker's own */
    double *latency_us;         /* of the calls that ended while measuring */
    size_t n_latency, cap_latency;
    long calls_ok;              /* every call that succeeded, warm-up included */
    long errors;
    char first_error[256];
} worker;

static void worker_error(worker *w, const char *fmt, const char *detail)
{
    if (w->errors++ == 0)
        snprintf(w->first_error, sizeof w->first_error, fmt, detail);
}

/* Checks an answer: the request's bytes for echo, a ModelInferResponse with
 * one raw output per output for infer. NULL if it is good, else what is
 * wrong. */
static const char *check_response(const client_config *cfg, grpc_slice got)
{
    const uint8_t *p = GRPC_SLICE_START_PTR(got);
    size_t n = GRPC_SLICE_LENGTH(got);
    if (cfg->method == METHOD_ECHO) {
        if (n != GRPC_SLICE_LENGTH(cfg->request) ||
            memcmp(p, GRPC_SLICE_START_PTR(cfg->request), n) != 0)
            return "the echo differs from the request";
        return NULL;
    }
    Inference__ModelInferResponse *r = inference__model_infer_response__unpack(NULL, n, p);
    if (r == NULL)
        return "the response is not a ModelInferResponse";
    const char *bad = NULL;
    if (r->n_outputs == 0)
        bad = "the response has no outputs";
    else if (r->n_raw_output_contents != r->n_outputs)
        bad = "the response's outputs are not all in raw_output_contents";
    inference__model_infer_response__free_unpacked(r, NULL);
    return bad;
}

/* One call, start to end. 0 if it succeeded and its answer is good. */
static int worker_call(worker *w)
{
    const client_config *cfg = w->cfg;
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_seconds(CALL_DEADLINE_S, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_registered_call(
        w->channel, NULL, GRPC_PROPAGATE_DEFAULTS, w->cq, w->registered, deadline, NULL);
    grpc_slice request = cfg->request;
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&request, 1);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    int rc = -1;

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    if (call == NULL || grpc_call_start_batch(call, ops, 6, w, NULL) != GRPC_CALL_OK) {
        worker_error(w, "%s", "cannot start a call");
        goto out;
    }
    grpc_event ev = grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE || ev.tag != w || !ev.success) {
        worker_error(w, "%s", "a call's batch failed");
        goto out;
    }
    if (status != GRPC_STATUS_OK) {
        char *msg = grpc_slice_to_c_string(details);
        char text[200];
        snprintf(text, sizeof text, "status %d: %s", (int)status, msg);
        gpr_free(msg);
        worker_error(w, "%s", text);
        goto out;
    }
    if (recv == NULL) {
        worker_error(w, "%s", "status OK without a message");
        goto out;
    }
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, recv)) {
        worker_error(w, "%s", "cannot read the response");
        goto out;
    }
    grpc_slice got = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    const char *bad = check_response(cfg, got);
    grpc_slice_unref(got);
    if (bad != NULL) {
        worker_error(w, "%s", bad);
        goto out;
    }
    rc = 0;
out:
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&trailing);
    grpc_metadata_array_destroy(&initial);
    if (recv != NULL)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    if (call != NULL)
        grpc_call_unref(call);
    return rc;
}

static int worker_record(worker *w, double us)
{
    if (w->n_latency == w->cap_latency) {
        size_t cap = w->cap_latency ? 2 * w->cap_latency : FIRST_RECORD;
        double *more = realloc(w->latency_us, cap * sizeof *more);
        if (more == NULL)
            return -1;
        w->latency_us = more;
        w->cap_latency = cap;
    }
    w->latency_us[w->n_latency++] = us;
    return 0;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    while (atomic_load(w->phase) != PHASE_STOP) {
        double t0 = now_us();
        int rc = worker_call(w);
        double t1 = now_us();
        w->calls_ok += rc == 0;
        if (rc == 0 && atomic_load(w->phase) == PHASE_MEASURE && worker_record(w, t1 - t0) != 0) {
            worker_error(w, "%s", "out of memory for the latency record");
            break;
        }
        if (rc != 0 && w->errors >= 100)
            break; /* no point in hammering a broken server */
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double percentile(const double *v, size_t n, double q)
{
    long i = (long)(q * (double)n + 0.999999) - 1;
    return v[i < 0 ? 0 : i];
}

static int parse_shape(const char *arg, client_config *cfg)
{
    const char *p = arg;
    cfg->rank = 0;
    while (*p != '\0') {
        char *end;
        errno = 0;
        long long d = strtoll(p, &end, 10);
        if (errno != 0 || end == p || d < 0 || d > (1LL << 31) || cfg->rank == MAX_DIMS ||
            (*end != ',' && *end != '\0'))
            return -1;
        cfg->shape[cfg->rank++] = d;
        p = *end == ',' ? end + 1 : end;
    }
    return cfg->rank == 0 ? -1 : 0;
}

static size_t datatype_size(const char *t)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {{"BOOL", 1}, {"UINT8", 1}, {"INT8", 1},  {"UINT16", 2}, {"INT16", 2},
                 {"FP16", 2}, {"BF16", 2},  {"UINT32", 4}, {"INT32", 4}, {"FP32", 4},
                 {"UINT64", 8}, {"INT64", 8}, {"FP64", 8}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(t, sizes[i].name) == 0)
            return sizes[i].size;
    return 0;
}

/* Packs the ModelInferRequest into cfg->request. FP32 inputs get
 * pseudo-random values in [-1, 1), others zeros. */
static int build_request(client_config *cfg)
{
    size_t elem = datatype_size(cfg->datatype);
    if (elem == 0) {
        fprintf(stderr, "pjs_bench_grpc_floor: --datatype %s: not a KServe datatype\n",
                cfg->datatype);
        return -1;
    }
    size_t bytes = elem;
    for (size_t d = 0; d < cfg->rank; d++)
        bytes *= (size_t)cfg->shape[d];
    if (bytes > ((size_t)1 << 26)) {
        fprintf(stderr, "pjs_bench_grpc_floor: --shape: the input is larger than 64 MiB\n");
        return -1;
    }
    uint8_t *data = calloc(1, bytes ? bytes : 1);
    if (data == NULL)
        return -1;
    if (strcmp(cfg->datatype, "FP32") == 0) {
        uint32_t x = 2654435761u;
        for (size_t i = 0; i < bytes / 4; i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            float f = (float)((double)x / 4294967296.0 * 2.0 - 1.0);
            memcpy(data + 4 * i, &f, 4);
        }
    }
    Inference__ModelInferRequest__InferInputTensor input;
    inference__model_infer_request__infer_input_tensor__init(&input);
    input.name = (char *)cfg->input;
    input.datatype = (char *)cfg->datatype;
    input.n_shape = cfg->rank;
    input.shape = cfg->shape;
    Inference__ModelInferRequest__InferInputTensor *inputs[1] = {&input};
    ProtobufCBinaryData raw = {.len = bytes, .data = data};
    Inference__ModelInferRequest msg;
    inference__model_infer_request__init(&msg);
    msg.model_name = (char *)cfg->model;
    msg.n_inputs = 1;
    msg.inputs = inputs;
    msg.n_raw_input_contents = 1;
    msg.raw_input_contents = &raw;
    size_t packed = inference__model_infer_request__get_packed_size(&msg);
    cfg->request = grpc_slice_malloc(packed);
    inference__model_infer_request__pack(&msg, GRPC_SLICE_START_PTR(cfg->request));
    free(data);
    return 0;
}

static const char *method_name(const client_config *cfg)
{
    return cfg->method == METHOD_ECHO ? "echo" : "infer";
}

static void client_report(const client_config *cfg, double *lat, size_t n, double window_s,
                          double client_cpu_us, long calls_ok, long errors)
{
    qsort(lat, n, sizeof *lat, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += lat[i];
    double rps = (double)n / window_s, mean = sum / (double)n;
    double p50 = percentile(lat, n, 0.50), p90 = percentile(lat, n, 0.90),
           p99 = percentile(lat, n, 0.99);
    double cpu = client_cpu_us / (double)n;
    if (cfg->json) {
        printf("{\"method\": \"%s\", \"target\": \"%s\", \"model\": \"%s\", "
               "\"concurrency\": %ld, \"channels\": \"%s\", \"request_bytes\": %zu, "
               "\"warmup_s\": %.3f, \"window_s\": %.3f, \"requests\": %zu, \"calls_total\": %ld, "
               "\"errors\": %ld, "
               "\"throughput\": %.1f, \"p50_us\": %.2f, \"p90_us\": %.2f, \"p99_us\": %.2f, "
               "\"mean_us\": %.2f, \"min_us\": %.2f, \"client_cpu_us_per_request\": %.2f}\n",
               method_name(cfg), cfg->target, cfg->model, cfg->concurrency,
               cfg->shared_channel ? "shared" : "per-worker", GRPC_SLICE_LENGTH(cfg->request),
               cfg->warmup, window_s, n, calls_ok, errors, rps, p50, p90, p99, mean, lat[0], cpu);
        return;
    }
    printf("%s %s (%s), concurrency %ld, %zu-byte requests, %zu calls in %.2f s, %ld errors\n",
           method_name(cfg), cfg->target, cfg->method == METHOD_INFER ? cfg->model : ECHO_METHOD,
           cfg->concurrency, GRPC_SLICE_LENGTH(cfg->request), n, window_s, errors);
    printf("%10s %9s %9s %9s %9s %9s %14s\n", "requests/s", "p50 us", "p90 us", "p99 us",
           "mean us", "min us", "client CPU us");
    printf("%10.0f %9.1f %9.1f %9.1f %9.1f %9.1f %14.1f\n", rps, p50, p90, p99, mean, lat[0],
           cpu);
}

/* Starts the workers, measures, joins them and reports. */
static int client_run(client_config *cfg, worker *workers)
{
    atomic_int phase = PHASE_WARMUP;
    grpc_arg local_pool = {.type = GRPC_ARG_INTEGER,
                           .key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                           .value.integer = 1};
    grpc_channel_args args = {.num_args = 1, .args = &local_pool};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    const char *path = cfg->method == METHOD_ECHO ? ECHO_METHOD : INFER_METHOD;
    long started = 0;
    int rc = 1;
    for (long i = 0; i < cfg->concurrency; i++) {
        worker *w = &workers[i];
        w->cfg = cfg;
        w->phase = &phase;
        w->cq = grpc_completion_queue_create_for_next(NULL);
        if (i == 0 || !cfg->shared_channel)
            w->channel = grpc_channel_create(cfg->target, creds, &args);
        else
            w->channel = workers[0].channel;
        w->registered = grpc_channel_register_call(w->channel, path, NULL, NULL);
    }
    grpc_channel_credentials_release(creds);
    for (; started < cfg->concurrency; started++)
        if (pthread_create(&workers[started].thread, NULL, worker_main, &workers[started]) != 0)
            break;
    if (started == cfg->concurrency) {
        sleep_s(cfg->warmup);
        double cpu0 = cpu_us(), t0 = now_us();
        atomic_store(&phase, PHASE_MEASURE);
        sleep_s(cfg->seconds);
        double t1 = now_us();
        atomic_store(&phase, PHASE_STOP);
        double cpu1 = cpu_us();
        for (long i = 0; i < started; i++)
            pthread_join(workers[i].thread, NULL);
        started = 0;

        size_t n = 0;
        long calls_ok = 0, errors = 0;
        for (long i = 0; i < cfg->concurrency; i++) {
            n += workers[i].n_latency;
            calls_ok += workers[i].calls_ok;
            errors += workers[i].errors;
            if (workers[i].errors > 0)
                fprintf(stderr, "pjs_bench_grpc_floor: worker %ld: %ld errors, the first: %s\n",
                        i, workers[i].errors, workers[i].first_error);
        }
        double *all = malloc((n ? n : 1) * sizeof *all);
        if (all != NULL && n > 0) {
            size_t k = 0;
            for (long i = 0; i < cfg->concurrency; i++) {
                memcpy(all + k, workers[i].latency_us, workers[i].n_latency * sizeof *all);
                k += workers[i].n_latency;
            }
            client_report(cfg, all, n, (t1 - t0) / 1e6, cpu1 - cpu0, calls_ok, errors);
            rc = errors > 0;
        } else {
            fprintf(stderr, "pjs_bench_grpc_floor: %s\n",
                    all == NULL ? "out of memory" : "no call succeeded while measuring");
        }
        free(all);
    } else {
        fprintf(stderr, "pjs_bench_grpc_floor: cannot start the workers\n");
        atomic_store(&phase, PHASE_STOP);
    }
    for (long i = 0; i < started; i++)
        pthread_join(workers[i].thread, NULL);
    for (long i = 0; i < cfg->concurrency; i++) {
        worker *w = &workers[i];
        if (i == 0 || !cfg->shared_channel)
            grpc_channel_destroy(w->channel);
        grpc_completion_queue_shutdown(w->cq);
        while (grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(w->cq);
        free(w->latency_us);
    }
    return rc;
}

static int client_main(int argc, char **argv)
{
    static const struct option opts[] = {{"target", required_argument, NULL, 'T'},
                                         {"method", required_argument, NULL, 'm'},
                                         {"model", required_argument, NULL, 'M'},
                                         {"input", required_argument, NULL, 'i'},
                                         {"datatype", required_argument, NULL, 'd'},
                                         {"shape", required_argument, NULL, 's'},
                                         {"concurrency", required_argument, NULL, 'c'},
                                         {"seconds", required_argument, NULL, 'S'},
                                         {"warmup", required_argument, NULL, 'w'},
                                         {"shared-channel", no_argument, NULL, 'C'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    client_config cfg = {.model = "mlp", .input = "x", .datatype = "FP32",
                         .shape = {1, 16}, .rank = 2, .concurrency = 1, .seconds = 5,
                         .warmup = 1};
    const char *method = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "T:m:M:i:d:s:c:S:w:Cjh", opts, NULL)) != -1) {
        switch (opt) {
        case 'T': cfg.target = optarg; break;
        case 'm': method = optarg; break;
        case 'M': cfg.model = optarg; break;
        case 'i': cfg.input = optarg; break;
        case 'd': cfg.datatype = optarg; break;
        case 's':
            if (parse_shape(optarg, &cfg) != 0) {
                fprintf(stderr, "pjs_bench_grpc_floor: --shape %s: expected D,D,... (at most %d)\n",
                        optarg, MAX_DIMS);
                return 2;
            }
            break;
        case 'c': cfg.concurrency = parse_long("--concurrency", optarg, 1, MAX_THREADS); break;
        case 'S': cfg.seconds = parse_seconds("--seconds", optarg, 0.01); break;
        case 'w': cfg.warmup = parse_seconds("--warmup", optarg, 0); break;
        case 'C': cfg.shared_channel = true; break;
        case 'j': cfg.json = true; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    if (cfg.target == NULL || method == NULL || optind != argc ||
        (strcmp(method, "echo") != 0 && strcmp(method, "infer") != 0)) {
        fputs(usage, stderr);
        return 2;
    }
    cfg.method = strcmp(method, "echo") == 0 ? METHOD_ECHO : METHOD_INFER;

    grpc_init();
    int rc = 1;
    worker *workers = calloc((size_t)cfg.concurrency, sizeof *workers);
    if (workers != NULL && build_request(&cfg) == 0) {
        rc = client_run(&cfg, workers);
        grpc_slice_unref(cfg.request);
    }
    free(workers);
    grpc_shutdown();
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "echo-server") == 0)
        return echo_server_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "client") == 0)
        return client_main(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    fputs(usage, stderr);
    return 2;
}
