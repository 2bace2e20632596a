/*
 * client_check.c - drives every call of libpjserve-client against a real
 * server, for tests/client/test_client.py (which starts the servers,
 * makes the inputs and holds the JAX references).
 *
 *   pjs_client_check SCENARIO URL [options]
 *
 * Scenarios (each prints lines the test reads, and "FAIL: ..." with exit
 * status 1 when a check made here fails):
 *
 *   calls       health, metadata, config, statistics, index, control
 *               status, unload/load of two_io: "NAME VALUE" lines, the
 *               documents as compact JSON
 *   infer       one inference of --model with --input NAME:DATATYPE:D0xD1:FILE
 *               ... (raw little-endian bytes), by --mode sync|async|poll|
 *               stream, staged in shared memory with --shm; each output to
 *               --outdir/NAME.bin and a line "output NAME DATATYPE D0,D1 FILE"
 *   errors      calls that must fail: "error CASE CODE HTTP FROM_SERVER MESSAGE"
 *   deadline    one inference of mlp with a --timeout-ms deadline: the error
 *               line, or "answered"
 *   concurrent  --threads T threads with --requests R asynchronous calls each
 *               in flight at once (callbacks and polled handles), and a
 *               stream of R requests on gRPC; every answer compared with
 *               the synchronous answer to the same input (FP32 within 1e-5
 *               relative: a coalesced batch may round differently)
 *   shm         inputs and outputs of mlp staged in a shared memory region:
 *               equal to the answer without it; the region's status
 *   bytes       BYTES through simple_identity (empty, binary, long elements)
 *               and simple_string (sums and differences of numbers as text)
 *
 * Connection options: --ca FILE --cert FILE --key FILE --token-file FILE.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pjserve/client.h>

#define MAX_INPUTS 16

typedef struct args {
    const char *scenario, *url;
    const char *ca, *cert, *key, *token_file;
    const char *model, *mode, *outdir;
    const char *inputs[MAX_INPUTS];
    int n_inputs;
    int shm, threads, requests;
    unsigned timeout_ms;
} args;

static int failures;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...)
{
    if (ok)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stdout);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    failures++;
}

/* Checks a call's status; prints the error when it failed. */
static int ok_call(int rc, const char *what, const pjs_client_error *err)
{
    check(rc == PJS_CLIENT_OK, "%s: %s (%s)", what, err->message,
          pjs_client_code_name(err->code));
    return rc == PJS_CLIENT_OK;
}

static void print_error(const char *name, const pjs_client_error *err)
{
    printf("error %s %s %d %d %s\n", name, pjs_client_code_name(err->code), err->http_status,
           err->from_server, err->message);
}

static void print_doc(const char *name, char *json)
{
    printf("%s %s\n", name, json ? json : "null");
    pjs_client_free(json);
}

static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static pjs_client *connect_or_die(const args *a, unsigned timeout_ms)
{
    char token[4096];
    pjs_client_options o = {0};
    o.tls_ca_file = a->ca;
    o.tls_cert_file = a->cert;
    o.tls_key_file = a->key;
    o.timeout_ms = timeout_ms;
    if (a->token_file != NULL) {
        size_t n;
        char *t = read_file(a->token_file, &n);
        if (t == NULL) {
            printf("FAIL: cannot read %s\n", a->token_file);
            exit(1);
        }
        snprintf(token, sizeof token, "%.*s", (int)strcspn(t, "\r\n"), t);
        free(t);
        o.token = token;
    }
    pjs_client *c;
    pjs_client_error err;
    if (pjs_client_connect(a->url, &o, &c, &err) != PJS_CLIENT_OK) {
        printf("FAIL: connect %s: %s\n", a->url, err.message);
        exit(1);
    }
    return c;
}

/* ---- calls ------------------------------------------------------------------------- */

static void scenario_calls(const args *a)
{
    pjs_client *c = connect_or_die(a, 60000);
    pjs_client_error err;
    int yes = -1;
    if (ok_call(pjs_client_server_live(c, &yes, &err), "server live", &err))
        printf("live %d\n", yes);
    if (ok_call(pjs_client_server_ready(c, &yes, &err), "server ready", &err))
        printf("ready %d\n", yes);
    if (ok_call(pjs_client_model_ready(c, "mlp", NULL, &yes, &err), "model ready", &err))
        printf("model_ready mlp %d\n", yes);
    if (ok_call(pjs_client_model_ready(c, "nope", NULL, &yes, &err), "model ready nope", &err))
        printf("model_ready nope %d\n", yes);
    char *doc = NULL;
    if (ok_call(pjs_client_server_metadata(c, &doc, &err), "server metadata", &err))
        print_doc("server_metadata", doc);
    if (ok_call(pjs_client_model_metadata(c, "mlp", NULL, &doc, &err), "model metadata", &err))
        print_doc("model_metadata", doc);
    if (ok_call(pjs_client_model_metadata(c, "mlp", "1", &doc, &err), "model metadata v1", &err))
        print_doc("model_metadata_v1", doc);
    if (ok_call(pjs_client_model_config(c, "mlp", NULL, &doc, &err), "model config", &err))
        print_doc("model_config", doc);
    if (ok_call(pjs_client_model_statistics(c, NULL, NULL, &doc, &err), "statistics", &err))
        print_doc("statistics_all", doc);
    if (ok_call(pjs_client_model_statistics(c, "mlp", NULL, &doc, &err), "statistics mlp", &err))
        print_doc("statistics_mlp", doc);
    if (ok_call(pjs_client_repository_index(c, 0, &doc, &err), "index", &err))
        print_doc("index", doc);
    if (ok_call(pjs_client_control_status(c, &doc, &err), "control status", &err))
        print_doc("control", doc);
    if (ok_call(pjs_client_shm_status(c, NULL, &doc, &err), "shm status", &err))
        print_doc("shm_status", doc);
    if (ok_call(pjs_client_unload_model(c, "two_io", &err), "unload two_io", &err))
        printf("unload two_io ok\n");
    if (ok_call(pjs_client_model_ready(c, "two_io", NULL, &yes, &err), "ready two_io", &err))
        printf("model_ready two_io %d\n", yes);
    if (ok_call(pjs_client_repository_index(c, 1, &doc, &err), "ready index", &err))
        print_doc("index_ready", doc);
    if (ok_call(pjs_client_load_model(c, "two_io", &err), "load two_io", &err))
        printf("load two_io ok\n");
    if (ok_call(pjs_client_model_ready(c, "two_io", NULL, &yes, &err), "ready two_io", &err))
        printf("model_ready two_io %d\n", yes);
    printf("protocol %s\n", pjs_client_get_protocol(c) == PJS_CLIENT_GRPC ? "grpc" : "http");
    printf("version %s\n", pjs_client_version());
    pjs_client_close(c);
}

/* ---- infer -------------------------------------------------------------------------- */

typedef struct input_spec {
    char name[128], datatype[16];
    int64_t shape[8];
    size_t rank;
    char *data;
    size_t nbytes;
} input_spec;

/* NAME:DATATYPE:D0xD1:FILE */
static int parse_input(const char *spec, input_spec *in)
{
    char dims[128], path[1024];
    memset(in, 0, sizeof *in);
    if (sscanf(spec, "%127[^:]:%15[^:]:%127[^:]:%1023s", in->name, in->datatype, dims, path) != 4)
        return -1;
    for (char *p = dims; *p && in->rank < 8;) {
        in->shape[in->rank++] = strtoll(p, &p, 10);
        if (*p == 'x')
            p++;
    }
    in->data = read_file(path, &in->nbytes);
    return in->data != NULL ? 0 : -1;
}

typedef struct shm_plan {
    pjs_client_shm *region;
    size_t in_at[MAX_INPUTS];
    size_t out_at, out_size;
} shm_plan;

#define SHM_OUTPUT_BYTES ((size_t)1 << 20)

/* With --shm: every input is copied into one region, which also receives
 * every output the model metadata names (each SHM_OUTPUT_BYTES at most). */
static pjs_client_request *build_infer_request(pjs_client *c, const args *a, input_spec *ins,
                                               int n, shm_plan *plan)
{
    pjs_client_request *req;
    pjs_client_error err;
    if (!ok_call(pjs_client_request_new(a->model, &req, &err), "request", &err))
        return NULL;
    pjs_client_request_set_id(req, "check-1", &err);
    /* Version 1 by name, and parameters servers pass over (unknown ones
     * are tolerated) of each kind; set twice, the second value wins. */
    ok_call(pjs_client_request_set_version(req, "1", &err), "version", &err);
    ok_call(pjs_client_request_set_parameter_string(req, "pjs_check_note", "first", &err),
            "string parameter", &err);
    ok_call(pjs_client_request_set_parameter_string(req, "pjs_check_note", "second", &err),
            "string parameter again", &err);
    ok_call(pjs_client_request_set_parameter_bool(req, "pjs_check_flag", 1, &err),
            "bool parameter", &err);
    ok_call(pjs_client_request_set_parameter_int(req, "priority", 0, &err), "priority", &err);
    if (!a->shm) {
        for (int i = 0; i < n; i++)
            ok_call(pjs_client_request_add_input(req, ins[i].name, ins[i].datatype, ins[i].shape,
                                                 ins[i].rank, ins[i].data, ins[i].nbytes, &err),
                    ins[i].name, &err);
        return req;
    }
    char *meta = NULL;
    ok_call(pjs_client_model_metadata(c, a->model, NULL, &meta, &err), "metadata", &err);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        plan->in_at[i] = total;
        total += (ins[i].nbytes + 63) & ~(size_t)63;
    }
    plan->out_at = total;
    /* Outputs named in the metadata: "outputs":[{"name":"y",... */
    const char *outs = meta ? strstr(meta, "\"outputs\"") : NULL;
    char names[8][128];
    int n_out = 0;
    for (const char *p = outs; p && n_out < 8 && (p = strstr(p, "\"name\":\"")) != NULL;) {
        p += 8;
        snprintf(names[n_out++], sizeof names[0], "%.*s", (int)strcspn(p, "\""), p);
    }
    pjs_client_free(meta);
    char key[64];
    snprintf(key, sizeof key, "/pjs-check-%d", (int)getpid());
    if (!ok_call(pjs_client_shm_create(key, total + (size_t)n_out * SHM_OUTPUT_BYTES,
                                       &plan->region, &err),
                 "shm create", &err))
        return req;
    ok_call(pjs_client_shm_register(c, "check", key, 0, pjs_client_shm_size(plan->region), &err),
            "shm register", &err);
    char *base = pjs_client_shm_data(plan->region);
    for (int i = 0; i < n; i++) {
        memcpy(base + plan->in_at[i], ins[i].data, ins[i].nbytes);
        ok_call(pjs_client_request_add_input_shm(req, ins[i].name, ins[i].datatype, ins[i].shape,
                                                 ins[i].rank, "check", plan->in_at[i],
                                                 ins[i].nbytes, &err),
                ins[i].name, &err);
    }
    for (int i = 0; i < n_out; i++)
        ok_call(pjs_client_request_add_output_shm(req, names[i], "check",
                                                  total + (size_t)i * SHM_OUTPUT_BYTES,
                                                  SHM_OUTPUT_BYTES, &err),
                names[i], &err);
    return req;
}

typedef struct stream_sink {
    pthread_mutex_t mu;
    pjs_client_result *results[1024];
    size_t n;
    int errors;
    char last_error[PJS_CLIENT_MESSAGE_MAX];
} stream_sink;

static void stream_collect(void *user, pjs_client_result *result, const pjs_client_error *err)
{
    stream_sink *s = user;
    pthread_mutex_lock(&s->mu);
    if (result != NULL && s->n < 1024)
        s->results[s->n++] = result;
    else {
        s->errors++;
        snprintf(s->last_error, sizeof s->last_error, "%s", err->message);
        pjs_client_result_free(result);
    }
    pthread_mutex_unlock(&s->mu);
}

typedef struct one_answer {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int done;
    pjs_client_result *result;
    pjs_client_error err;
} one_answer;

static void callback_into_pending(void *user, pjs_client_result *result,
                                  const pjs_client_error *err)
{
    one_answer *o = user;
    pthread_mutex_lock(&o->mu);
    o->result = result;
    o->err = *err;
    o->done = 1;
    pthread_cond_signal(&o->cond);
    pthread_mutex_unlock(&o->mu);
}

/* One inference by `mode`; the result or NULL with *err. */
static pjs_client_result *infer_by(pjs_client *c, const pjs_client_request *req,
                                   const char *mode, pjs_client_error *err)
{
    pjs_client_result *r = NULL;
    if (strcmp(mode, "async") == 0) {
        one_answer o = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
        if (pjs_client_infer_async(c, req, callback_into_pending, &o, err) != PJS_CLIENT_OK)
            return NULL;
        pthread_mutex_lock(&o.mu);
        while (!o.done)
            pthread_cond_wait(&o.cond, &o.mu);
        pthread_mutex_unlock(&o.mu);
        *err = o.err;
        return o.result;
    }
    if (strcmp(mode, "poll") == 0) {
        pjs_client_pending *p;
        if (pjs_client_infer_start(c, req, &p, err) != PJS_CLIENT_OK)
            return NULL;
        while (!pjs_client_pending_done(p))
            usleep(1000);
        pjs_client_pending_wait(p, &r, err);
        return r;
    }
    if (strcmp(mode, "stream") == 0) {
        stream_sink s = {.mu = PTHREAD_MUTEX_INITIALIZER};
        pjs_client_stream *st;
        if (pjs_client_stream_open(c, stream_collect, &s, 0, &st, err) != PJS_CLIENT_OK)
            return NULL;
        int rc = pjs_client_stream_send(st, req, err);
        int close_rc = pjs_client_stream_close(st, rc == 0 ? err : NULL);
        if (rc == 0 && close_rc == 0 && s.n == 1)
            return s.results[0];
        if (s.errors > 0)
            snprintf(err->message, sizeof err->message, "%s", s.last_error);
        for (size_t i = 0; i < s.n; i++)
            pjs_client_result_free(s.results[i]);
        err->code = err->code ? err->code : PJS_CLIENT_UNKNOWN;
        return NULL;
    }
    pjs_client_infer(c, req, &r, err);
    return r;
}

static void write_outputs(const args *a, const pjs_client_result *r, const shm_plan *plan)
{
    for (size_t i = 0; i < pjs_client_result_output_count(r); i++) {
        pjs_client_tensor t;
        pjs_client_result_output(r, i, &t, NULL);
        const void *data = t.data;
        size_t nbytes = t.nbytes;
        if (t.shm_region != NULL) {
            /* The region's bytes are the output's, up to its size. */
            size_t elem = pjs_client_datatype_size(t.datatype);
            uint64_t n = 1;
            for (size_t k = 0; k < t.rank; k++)
                n *= (uint64_t)t.shape[k];
            data = (const char *)pjs_client_shm_data(plan->region) + t.shm_offset;
            nbytes = (size_t)n * elem;
        }
        char path[2048], dims[256] = "";
        snprintf(path, sizeof path, "%s/%s.bin", a->outdir, t.name);
        for (size_t k = 0, n = 0; k < t.rank; k++)
            n += (size_t)snprintf(dims + n, sizeof dims - n, "%s%lld", k ? "," : "",
                                  (long long)t.shape[k]);
        FILE *f = fopen(path, "wb");
        check(f != NULL && fwrite(data, 1, nbytes, f) == nbytes, "write %s", path);
        if (f != NULL)
            fclose(f);
        printf("output %s %s %s %s%s\n", t.name, t.datatype, dims[0] ? dims : "-", path,
               t.shm_region ? " shm" : "");
    }
    pjs_client_tensor past;
    pjs_client_error err;
    check(pjs_client_result_output(r, pjs_client_result_output_count(r), &past, &err) ==
              PJS_CLIENT_INVALID_ARGUMENT,
          "an output past the end");
    check(pjs_client_result_find(r, "no_such_output", &past, &err) == PJS_CLIENT_NOT_FOUND,
          "an output that is not there");
    printf("id %s model %s version %s\n", pjs_client_result_id(r), pjs_client_result_model(r),
           pjs_client_result_model_version(r));
}

static void scenario_infer(const args *a)
{
    input_spec ins[MAX_INPUTS];
    for (int i = 0; i < a->n_inputs; i++)
        if (parse_input(a->inputs[i], &ins[i]) != 0) {
            printf("FAIL: bad --input %s\n", a->inputs[i]);
            exit(1);
        }
    pjs_client *c = connect_or_die(a, 60000);
    shm_plan plan = {0};
    pjs_client_request *req = build_infer_request(c, a, ins, a->n_inputs, &plan);
    pjs_client_error err;
    pjs_client_result *r = req ? infer_by(c, req, a->mode ? a->mode : "sync", &err) : NULL;
    if (ok_call(r != NULL ? 0 : err.code, "infer", &err))
        write_outputs(a, r, &plan);
    pjs_client_result_free(r);
    pjs_client_request_free(req);
    if (plan.region != NULL) {
        ok_call(pjs_client_shm_unregister(c, "check", &err), "shm unregister", &err);
        pjs_client_shm_destroy(plan.region);
    }
    pjs_client_close(c);
    for (int i = 0; i < a->n_inputs; i++)
        free(ins[i].data);
}

/* ---- errors ---------------------------------------------------------------------------- */

static pjs_client_request *mlp_request(const char *model, int64_t rows, int64_t cols)
{
    static float x[64 * 32];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = (float)(i % 97) / 50.0f - 1.0f;
    pjs_client_request *req;
    pjs_client_error err;
    int64_t shape[2] = {rows, cols};
    pjs_client_request_new(model, &req, &err);
    pjs_client_request_add_input(req, "x", "FP32", shape, 2, x,
                                 (size_t)(rows * cols) * sizeof(float), &err);
    return req;
}

static void expect_failure(pjs_client *c, const char *name, pjs_client_request *req)
{
    pjs_client_result *r = NULL;
    pjs_client_error err;
    int rc = pjs_client_infer(c, req, &r, &err);
    check(rc != PJS_CLIENT_OK && r == NULL && err.message[0] != '\0', "%s did not fail", name);
    check(rc == (int)err.code, "%s: the status returned is not the error's code", name);
    print_error(name, &err);
    pjs_client_result_free(r);
    pjs_client_request_free(req);
}

static void scenario_errors(const args *a)
{
    pjs_client *c = connect_or_die(a, 60000);
    pjs_client_error err;
    expect_failure(c, "unknown_model", mlp_request("no_such_model", 1, 16));
    expect_failure(c, "bad_shape", mlp_request("mlp", 1, 15));
    pjs_client_request *req = mlp_request("mlp", 1, 16);
    pjs_client_request_add_output(req, "not_an_output", &err);
    expect_failure(c, "unknown_output", req);
    /* A deadline already past when the server looks at it: 1 us. */
    req = mlp_request("mlp", 1, 16);
    pjs_client_request_set_parameter_int(req, "timeout", 1, &err);
    expect_failure(c, "server_deadline", req);
    /* Mistakes the library catches before sending. */
    req = mlp_request("mlp", 1, 16);
    float x[4] = {0};
    int64_t shape[2] = {1, 16};
    int rc = pjs_client_request_add_input(req, "z", "FP32", shape, 2, x, sizeof x, &err);
    check(rc == PJS_CLIENT_INVALID_ARGUMENT && !err.from_server, "short input accepted");
    print_error("short_input", &err);
    rc = pjs_client_request_add_input(req, "z", "FLOAT", shape, 2, x, sizeof x, &err);
    check(rc == PJS_CLIENT_INVALID_ARGUMENT, "unknown datatype accepted");
    print_error("bad_datatype", &err);
    const char bad_bytes[] = {5, 0, 0, 0, 'a'};
    int64_t one = 1;
    rc = pjs_client_request_add_input(req, "s", "BYTES", &one, 1, bad_bytes, sizeof bad_bytes,
                                      &err);
    check(rc == PJS_CLIENT_INVALID_ARGUMENT, "malformed BYTES accepted");
    print_error("bad_bytes", &err);
    pjs_client_request_free(req);
    pjs_client_stream *st = NULL;
    rc = pjs_client_stream_open(c, stream_collect, NULL, 0, &st, &err);
    if (pjs_client_get_protocol(c) == PJS_CLIENT_HTTP) {
        check(rc == PJS_CLIENT_UNIMPLEMENTED, "a REST stream opened");
        print_error("http_stream", &err);
    } else if (ok_call(rc, "stream open", &err)) {
        /* An error of one request on a stream comes to the callback; the
         * stream itself ends well. */
        stream_sink s = {.mu = PTHREAD_MUTEX_INITIALIZER};
        pjs_client_stream_close(st, &err);
        pjs_client_stream_open(c, stream_collect, &s, 0, &st, &err);
        req = mlp_request("no_such_model", 1, 16);
        pjs_client_stream_send(st, req, &err);
        pjs_client_request_free(req);
        rc = pjs_client_stream_close(st, &err);
        check(rc == PJS_CLIENT_OK && s.errors == 1 && s.n == 0, "stream error not delivered");
        printf("error stream_unknown_model - 0 1 %s\n", s.last_error);
    }
    rc = pjs_client_load_model(c, "no_such_model", &err);
    check(rc != PJS_CLIENT_OK, "loading an unknown model succeeded");
    print_error("load_unknown", &err);
    char *doc = NULL;
    rc = pjs_client_model_metadata(c, "no_such_model", NULL, &doc, &err);
    check(rc != PJS_CLIENT_OK && doc == NULL, "metadata of an unknown model");
    print_error("metadata_unknown", &err);
    pjs_client_close(c);
    rc = pjs_client_connect("ftp://x", NULL, &c, &err);
    check(rc == PJS_CLIENT_INVALID_ARGUMENT && c == NULL, "ftp:// accepted");
    print_error("bad_url", &err);
}

static void scenario_deadline(const args *a)
{
    pjs_client *c = connect_or_die(a, 0);
    pjs_client_request *req = mlp_request("mlp", 1, 16);
    pjs_client_error err;
    pjs_client_request_set_timeout_ms(req, a->timeout_ms, &err);
    pjs_client_result *r = NULL;
    if (pjs_client_infer(c, req, &r, &err) == PJS_CLIENT_OK)
        printf("answered\n");
    else
        print_error("deadline", &err);
    pjs_client_result_free(r);
    pjs_client_request_free(req);
    /* Calls other than inference take the client's default deadline. */
    pjs_client_close(c);
    c = connect_or_die(a, a->timeout_ms);
    int live;
    if (pjs_client_server_live(c, &live, &err) == PJS_CLIENT_OK)
        printf("live answered\n");
    else
        print_error("live_deadline", &err);
    pjs_client_close(c);
}

/* ---- concurrency --------------------------------------------------------------------------- */

#define DISTINCT 8

typedef struct shared {
    pjs_client *client;
    pjs_client_request *requests[DISTINCT];
    pjs_client_result *expected[DISTINCT];
    int requests_per_thread;
    pthread_mutex_t mu;
    int mismatches, failed, answered;
} shared;

/* FP32 outputs equal within what coalescing into another compiled batch
 * size may change (the row's neighbours differ, the arithmetic does not). */
static int close_floats(const pjs_client_tensor *x, const pjs_client_tensor *y)
{
    const float *a = x->data, *b = y->data;
    for (size_t i = 0; i < x->nbytes / sizeof(float); i++) {
        float d = a[i] - b[i], scale = 1.0f + (a[i] < 0 ? -a[i] : a[i]);
        if ((d < 0 ? -d : d) > 1e-5f * scale)
            return 0;
    }
    return 1;
}

static int same_answer(const pjs_client_result *a, const pjs_client_result *b)
{
    if (pjs_client_result_output_count(a) != pjs_client_result_output_count(b))
        return 0;
    for (size_t i = 0; i < pjs_client_result_output_count(a); i++) {
        pjs_client_tensor x, y;
        pjs_client_result_output(a, i, &x, NULL);
        if (pjs_client_result_find(b, x.name, &y, NULL) != 0 || x.nbytes != y.nbytes ||
            strcmp(x.datatype, y.datatype) != 0 || x.rank != y.rank ||
            memcmp(x.shape, y.shape, x.rank * sizeof *x.shape) != 0)
            return 0;
        if (strcmp(x.datatype, "FP32") == 0 ? !close_floats(&x, &y)
                                            : memcmp(x.data, y.data, x.nbytes) != 0)
            return 0;
    }
    return 1;
}

typedef struct tagged {
    shared *s;
    int which;
} tagged;

static void note_answer(shared *s, int which, pjs_client_result *r, const pjs_client_error *err)
{
    pthread_mutex_lock(&s->mu);
    if (r == NULL) {
        s->failed++;
        printf("FAIL: concurrent call: %s\n", err->message);
    } else {
        s->answered++;
        s->mismatches += !same_answer(r, s->expected[which]);
    }
    pthread_mutex_unlock(&s->mu);
    pjs_client_result_free(r);
}

static void tagged_done(void *user, pjs_client_result *r, const pjs_client_error *err)
{
    tagged *t = user;
    note_answer(t->s, t->which, r, err);
    free(t);
}

static void *worker(void *arg)
{
    shared *s = arg;
    int n = s->requests_per_thread;
    pjs_client_pending **pending = calloc((size_t)n, sizeof *pending);
    int *which = calloc((size_t)n, sizeof *which);
    pjs_client_error err;
    unsigned seed = (unsigned)(uintptr_t)pthread_self();
    for (int i = 0; i < n; i++) {
        which[i] = (int)(rand_r(&seed) % DISTINCT);
        if (i % 2 == 0) {
            tagged *t = malloc(sizeof *t);
            t->s = s;
            t->which = which[i];
            if (pjs_client_infer_async(s->client, s->requests[which[i]], tagged_done, t, &err)) {
                note_answer(s, which[i], NULL, &err);
                free(t);
            }
        } else if (pjs_client_infer_start(s->client, s->requests[which[i]], &pending[i], &err)) {
            note_answer(s, which[i], NULL, &err);
        }
    }
    for (int i = 1; i < n; i += 2) {
        if (pending[i] == NULL)
            continue;
        pjs_client_result *r;
        pjs_client_pending_wait(pending[i], &r, &err);
        note_answer(s, which[i], r, &err);
    }
    free(pending);
    free(which);
    return NULL;
}

static void scenario_concurrent(const args *a)
{
    shared s = {.mu = PTHREAD_MUTEX_INITIALIZER, .requests_per_thread = a->requests};
    s.client = connect_or_die(a, 120000);
    pjs_client_error err;
    for (int i = 0; i < DISTINCT; i++) {
        s.requests[i] = mlp_request("mlp", 1 + i % 3, 16);
        /* Distinct rows: scale the first value by the index. */
        float x[48];
        int64_t shape[2] = {1 + i % 3, 16};
        for (int k = 0; k < 48; k++)
            x[k] = (float)((k * 7 + i * 13) % 29) / 10.0f - 1.0f;
        pjs_client_request_free(s.requests[i]);
        pjs_client_request_new("mlp", &s.requests[i], &err);
        pjs_client_request_add_input(s.requests[i], "x", "FP32", shape, 2, x,
                                     (size_t)shape[0] * 16 * sizeof(float), &err);
        ok_call(pjs_client_infer(s.client, s.requests[i], &s.expected[i], &err), "reference",
                &err);
    }
    pthread_t threads[64];
    int n = a->threads < 64 ? a->threads : 64;
    for (int i = 0; i < n; i++)
        pthread_create(&threads[i], NULL, worker, &s);
    for (int i = 0; i < n; i++)
        pthread_join(threads[i], NULL);
    /* Async calls of the callback kind may still run: close waits for
     * them. */
    int streamed = 0, stream_mismatch = 0;
    if (pjs_client_get_protocol(s.client) == PJS_CLIENT_GRPC) {
        stream_sink sink = {.mu = PTHREAD_MUTEX_INITIALIZER};
        pjs_client_stream *st;
        if (ok_call(pjs_client_stream_open(s.client, stream_collect, &sink, 0, &st, &err),
                    "stream", &err)) {
            for (int i = 0; i < a->requests && i < 1024; i++) {
                char id[32];
                snprintf(id, sizeof id, "%d", i % DISTINCT);
                pjs_client_request_set_id(s.requests[i % DISTINCT], id, &err);
                ok_call(pjs_client_stream_send(st, s.requests[i % DISTINCT], &err), "send", &err);
            }
            ok_call(pjs_client_stream_close(st, &err), "stream close", &err);
            for (size_t i = 0; i < sink.n; i++) {
                int which = atoi(pjs_client_result_id(sink.results[i]));
                stream_mismatch += !same_answer(sink.results[i], s.expected[which]);
                pjs_client_result_free(sink.results[i]);
            }
            streamed = (int)sink.n;
            check(sink.errors == 0, "stream errors: %s", sink.last_error);
        }
    }
    pjs_client_close(s.client);
    int want = n * a->requests;
    check(s.answered == want && s.failed == 0, "answered %d of %d", s.answered, want);
    check(s.mismatches == 0, "%d answers differ from the synchronous ones", s.mismatches);
    check(stream_mismatch == 0, "%d streamed answers differ", stream_mismatch);
    printf("concurrent answered %d mismatches %d streamed %d\n", s.answered, s.mismatches,
           streamed);
    for (int i = 0; i < DISTINCT; i++) {
        pjs_client_request_free(s.requests[i]);
        pjs_client_result_free(s.expected[i]);
    }
}

/* ---- shared memory ---------------------------------------------------------------------- */

static void scenario_shm(const args *a)
{
    pjs_client *c = connect_or_die(a, 60000);
    pjs_client_error err;
    char key[64];
    snprintf(key, sizeof key, "/pjs-check-shm-%d", (int)getpid());
    pjs_client_shm *region;
    if (!ok_call(pjs_client_shm_create(key, 4096, &region, &err), "create", &err))
        exit(1);
    pjs_client_shm *again;
    check(pjs_client_shm_create(key, 4096, &again, &err) == PJS_CLIENT_ALREADY_EXISTS,
          "a second region with the same key");
    float *mem = pjs_client_shm_data(region);
    float x[3 * 16];
    for (int i = 0; i < 48; i++)
        x[i] = mem[i] = (float)i / 20.0f - 1.0f;
    ok_call(pjs_client_shm_register(c, "in_out", key, 0, 4096, &err), "register", &err);
    char *doc = NULL;
    if (ok_call(pjs_client_shm_status(c, "in_out", &doc, &err), "status", &err))
        print_doc("shm_status", doc);
    int64_t shape[2] = {3, 16};
    pjs_client_request *plain, *staged;
    pjs_client_request_new("mlp", &plain, &err);
    pjs_client_request_add_input(plain, "x", "FP32", shape, 2, x, sizeof x, &err);
    pjs_client_request_new("mlp", &staged, &err);
    pjs_client_request_add_input_shm(staged, "x", "FP32", shape, 2, "in_out", 0, sizeof x, &err);
    pjs_client_request_add_output_shm(staged, "y", "in_out", 2048, 3 * 4 * sizeof(float), &err);
    pjs_client_result *want = NULL, *got = NULL;
    ok_call(pjs_client_infer(c, plain, &want, &err), "plain infer", &err);
    ok_call(pjs_client_infer(c, staged, &got, &err), "staged infer", &err);
    if (want != NULL && got != NULL) {
        pjs_client_tensor w, g;
        pjs_client_result_find(want, "y", &w, &err);
        check(pjs_client_result_find(got, "y", &g, &err) == 0, "no y in the staged answer");
        check(g.shm_region != NULL && strcmp(g.shm_region, "in_out") == 0 && g.data == NULL &&
                  g.shm_offset == 2048,
              "y not marked as written to the region");
        check(memcmp((char *)mem + 2048, w.data, w.nbytes) == 0,
              "the region's y differs from the answer's");
        printf("shm y %zu bytes equal\n", w.nbytes);
    }
    /* An input outside the region. */
    pjs_client_request *outside;
    pjs_client_request_new("mlp", &outside, &err);
    pjs_client_request_add_input_shm(outside, "x", "FP32", shape, 2, "in_out", 4000, sizeof x,
                                     &err);
    expect_failure(c, "shm_outside", outside);
    ok_call(pjs_client_shm_unregister(c, "in_out", &err), "unregister", &err);
    if (ok_call(pjs_client_shm_status(c, NULL, &doc, &err), "status after", &err))
        print_doc("shm_status_after", doc);
    expect_failure(c, "shm_unregistered", staged);
    pjs_client_result_free(want);
    pjs_client_result_free(got);
    pjs_client_request_free(plain);
    pjs_client_shm_destroy(region);
    pjs_client_close(c);
}

/* ---- BYTES ------------------------------------------------------------------------------ */

static void scenario_bytes(const args *a)
{
    pjs_client *c = connect_or_die(a, 60000);
    pjs_client_error err;
    char big[3000];
    memset(big, 'z', sizeof big);
    const char *elements[] = {"", "hello", "a\0b", big};
    const size_t lengths[] = {0, 5, 3, sizeof big};
    void *packed;
    size_t nbytes;
    ok_call(pjs_client_bytes_pack(elements, lengths, 4, &packed, &nbytes, &err), "pack", &err);
    int64_t shape[2] = {1, 4};
    pjs_client_request *req;
    pjs_client_request_new("simple_identity", &req, &err);
    ok_call(pjs_client_request_add_input(req, "INPUT0", "BYTES", shape, 2, packed, nbytes, &err),
            "BYTES input", &err);
    const char *modes[] = {"sync", "async", "stream"};
    for (size_t m = 0; m < 3; m++) {
        if (strcmp(modes[m], "stream") == 0 && pjs_client_get_protocol(c) != PJS_CLIENT_GRPC)
            continue;
        pjs_client_result *r = infer_by(c, req, modes[m], &err);
        if (!ok_call(r ? 0 : err.code, "identity", &err))
            continue;
        pjs_client_tensor t;
        pjs_client_result_find(r, "OUTPUT0", &t, &err);
        check(strcmp(t.datatype, "BYTES") == 0 && t.nbytes == nbytes &&
                  memcmp(t.data, packed, nbytes) == 0,
              "simple_identity (%s) changed the BYTES", modes[m]);
        size_t at = 0, len, n = 0;
        const char *e;
        while (pjs_client_bytes_next(t.data, t.nbytes, &at, &e, &len) == 1) {
            check(len == lengths[n] && memcmp(e, elements[n], len) == 0, "element %zu", n);
            n++;
        }
        check(n == 4, "%zu elements read back", n);
        printf("identity %s %zu elements\n", modes[m], n);
        pjs_client_result_free(r);
    }
    pjs_client_request_free(req);
    pjs_client_free(packed);
    /* simple_string: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, as text. */
    char a_text[16][8], b_text[16][8];
    const char *a_el[16], *b_el[16];
    size_t a_len[16], b_len[16];
    for (int i = 0; i < 16; i++) {
        a_len[i] = (size_t)snprintf(a_text[i], 8, "%d", i);
        b_len[i] = (size_t)snprintf(b_text[i], 8, "%d", 1);
        a_el[i] = a_text[i];
        b_el[i] = b_text[i];
    }
    void *pa, *pb;
    size_t na, nb;
    pjs_client_bytes_pack(a_el, a_len, 16, &pa, &na, &err);
    pjs_client_bytes_pack(b_el, b_len, 16, &pb, &nb, &err);
    int64_t shape16[2] = {1, 16};
    pjs_client_request_new("simple_string", &req, &err);
    pjs_client_request_add_input(req, "INPUT0", "BYTES", shape16, 2, pa, na, &err);
    pjs_client_request_add_input(req, "INPUT1", "BYTES", shape16, 2, pb, nb, &err);
    pjs_client_result *r = NULL;
    if (ok_call(pjs_client_infer(c, req, &r, &err), "simple_string", &err)) {
        pjs_client_tensor sum, diff;
        check(pjs_client_result_find(r, "OUTPUT0", &sum, &err) == 0 &&
                  pjs_client_result_find(r, "OUTPUT1", &diff, &err) == 0,
              "simple_string outputs");
        size_t at_s = 0, at_d = 0, ls, ld;
        const char *es, *ed;
        int i = 0;
        while (pjs_client_bytes_next(sum.data, sum.nbytes, &at_s, &es, &ls) == 1 &&
               pjs_client_bytes_next(diff.data, diff.nbytes, &at_d, &ed, &ld) == 1) {
            char s1[16], d1[16];
            snprintf(s1, sizeof s1, "%.*s", (int)ls, es);
            snprintf(d1, sizeof d1, "%.*s", (int)ld, ed);
            check(atoi(s1) == i + 1 && atoi(d1) == i - 1, "element %d: %s %s", i, s1, d1);
            i++;
        }
        check(i == 16, "%d sums", i);
        printf("simple_string %d elements\n", i);
    }
    pjs_client_result_free(r);
    pjs_client_request_free(req);
    pjs_client_free(pa);
    pjs_client_free(pb);
    pjs_client_close(c);
}

/* ---- main -------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s SCENARIO URL [options] (see the source)\n", argv[0]);
        return 2;
    }
    args a = {.scenario = argv[1], .url = argv[2], .threads = 4, .requests = 16,
              .timeout_ms = 500};
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--ca") == 0) a.ca = v;
        else if (strcmp(k, "--cert") == 0) a.cert = v;
        else if (strcmp(k, "--key") == 0) a.key = v;
        else if (strcmp(k, "--token-file") == 0) a.token_file = v;
        else if (strcmp(k, "--model") == 0) a.model = v;
        else if (strcmp(k, "--mode") == 0) a.mode = v;
        else if (strcmp(k, "--outdir") == 0) a.outdir = v;
        else if (strcmp(k, "--shm") == 0) a.shm = atoi(v);
        else if (strcmp(k, "--threads") == 0) a.threads = atoi(v);
        else if (strcmp(k, "--requests") == 0) a.requests = atoi(v);
        else if (strcmp(k, "--timeout-ms") == 0) a.timeout_ms = (unsigned)atoi(v);
        else if (strcmp(k, "--input") == 0 && a.n_inputs < MAX_INPUTS) a.inputs[a.n_inputs++] = v;
        else {
            fprintf(stderr, "unknown option %s\n", k);
            return 2;
        }
    }
    if (strcmp(a.scenario, "calls") == 0) scenario_calls(&a);
    else if (strcmp(a.scenario, "infer") == 0) scenario_infer(&a);
    else if (strcmp(a.scenario, "errors") == 0) scenario_errors(&a);
    else if (strcmp(a.scenario, "deadline") == 0) scenario_deadline(&a);
    else if (strcmp(a.scenario, "concurrent") == 0) scenario_concurrent(&a);
    else if (strcmp(a.scenario, "shm") == 0) scenario_shm(&a);
    else if (strcmp(a.scenario, "bytes") == 0) scenario_bytes(&a);
    else {
        fprintf(stderr, "unknown scenario %s\n", a.scenario);
        return 2;
    }
    fflush(stdout);
    return failures > 0 ? 1 : 0;
}
