/*
 * cmd_infer.c - `pjserve infer MODEL --input NAME=FILE.npy ...`: one
 * inference on a running server through libpjserve-client, inputs read
 * from .npy files, outputs written as .npy files (--output-dir) or shown:
 * a table with the first values, or every value with --json.
 *
 * A decoupled model's answers come over a gRPC stream (--stream): each is
 * shown as it arrives, until the server ends the stream. A stateful
 * model's steps carry --sequence-id and its start and end flags, sent as
 * the request parameters sequence_id, sequence_start and sequence_end.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/client_cli.h"
#include "core/bytes.h"
#include "core/npy.h"

#define MAX_TENSORS 64
#define MAX_PARAMETERS 32
/* Values shown per output in the table. */
#define PREVIEW_VALUES 6

static const char help[] =
    "usage: pjserve infer MODEL --input NAME=FILE.npy ... [options]\n"
    "\n"
    "Runs one inference of MODEL on a running server (pjserve serve, node or gateway,\n"
    "or any KServe V2 server) and shows or saves the outputs.\n"
    "\n"
    "  --input NAME=FILE.npy  an input tensor from a .npy file (its dtype and shape\n"
    "                         are sent as they are; numpy strings, |S or <U, as\n"
    "                         BYTES, unicode in UTF-8); repeat for every input\n"
    "  --output NAME          ask for this output only; repeatable (default: all)\n"
    "  --output-dir DIR       write each output to DIR/NAME.npy (DIR is created)\n"
    "  --id ID                the request id the server echoes\n"
    "  --priority N           the request's priority parameter\n"
    "  --parameter KEY=VALUE  a request parameter; repeatable. VALUE is typed by a\n"
    "                         prefix, int:, bool: or string: (KEY=string:5); without\n"
    "                         one, true and false are bool, an integer is int, and\n"
    "                         anything else a string\n"
    "  --sequence-id ID       a stateful model's sequence (digits: an integer id,\n"
    "                         else a string one)\n"
    "  --sequence-start       this request starts the sequence\n"
    "  --sequence-end         this request ends it\n"
    "  --stream               send over a gRPC stream (ModelStreamInfer) and show each\n"
    "                         response as it arrives, until the server ends the\n"
    "                         stream: for decoupled models, which may answer with\n"
    "                         zero, one or many responses\n"
    "\n" PJS_CLI_CONN_HELP
    "\n"
    "Without --output-dir the outputs are shown: a table with the first values, or\n"
    "every value with --json. BYTES outputs are shown as strings and saved as\n"
    "numpy byte strings (|S, the longest element's width; one ending in a NUL byte\n"
    "is refused, since numpy would drop it).\n"
    "\n"
    "example:\n"
    "  python -c \"import numpy as np; np.save('x.npy', np.ones((2, 16), np.float32))\"\n"
    "  pjserve infer mlp --input x=x.npy --output-dir out/\n"
    "  pjserve infer mlp --input x=x.npy --url http://localhost:8000 --json\n"
    "  python -c \"import numpy as np; np.save('s.npy', np.array([['1'] * 16]))\"\n"
    "  pjserve infer simple_string --input INPUT0=s.npy --input INPUT1=s.npy\n"
    "\n"
    "exit status: 0 answered, 1 the call failed (the server's reason is printed),\n"
    "2 usage error.\n";

typedef struct infer_args {
    const char *model;
    const char *inputs[MAX_TENSORS];
    size_t n_inputs;
    const char *outputs[MAX_TENSORS];
    size_t n_outputs;
    const char *output_dir;
    const char *id;
    long long priority;
    bool has_priority;
    const char *parameters[MAX_PARAMETERS]; /* KEY=VALUE */
    size_t n_parameters;
    const char *sequence_id;
    bool sequence_start, sequence_end;
    bool stream;
    pjs_cli_conn conn;
} infer_args;

static int parse(int argc, char **argv, infer_args *a)
{
    static const struct option longs[] = {
        {"input", required_argument, NULL, 'i'},
        {"output", required_argument, NULL, 'o'},
        {"output-dir", required_argument, NULL, 'd'},
        {"id", required_argument, NULL, 'I'},
        {"priority", required_argument, NULL, 'p'},
        {"parameter", required_argument, NULL, 'P'},
        {"sequence-id", required_argument, NULL, 'q'},
        {"sequence-start", no_argument, NULL, 's'},
        {"sequence-end", no_argument, NULL, 'e'},
        {"stream", no_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        PJS_CLI_CONN_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        int conn = pjs_cli_conn_option("infer", &a->conn, opt, optarg);
        if (conn < 0)
            return PJS_EXIT_USAGE;
        if (conn > 0)
            continue;
        switch (opt) {
        case 'i':
            if (a->n_inputs == MAX_TENSORS)
                return pjs_cli_usage_error("infer", "at most %d inputs", MAX_TENSORS);
            if (strchr(optarg, '=') == NULL || optarg[0] == '=')
                return pjs_cli_usage_error("infer", "--input takes NAME=FILE.npy, not '%s'",
                                           optarg);
            a->inputs[a->n_inputs++] = optarg;
            break;
        case 'o':
            if (a->n_outputs == MAX_TENSORS)
                return pjs_cli_usage_error("infer", "at most %d outputs", MAX_TENSORS);
            a->outputs[a->n_outputs++] = optarg;
            break;
        case 'd': a->output_dir = optarg; break;
        case 'I': a->id = optarg; break;
        case 'p': {
            char *end;
            a->priority = strtoll(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0')
                return pjs_cli_usage_error("infer", "--priority takes an integer, not '%s'",
                                           optarg);
            a->has_priority = true;
            break;
        }
        case 'P':
            if (a->n_parameters == MAX_PARAMETERS)
                return pjs_cli_usage_error("infer", "at most %d parameters", MAX_PARAMETERS);
            if (strchr(optarg, '=') == NULL || optarg[0] == '=')
                return pjs_cli_usage_error("infer", "--parameter takes KEY=VALUE, not '%s'",
                                           optarg);
            a->parameters[a->n_parameters++] = optarg;
            break;
        case 'q':
            if (optarg[0] == '\0')
                return pjs_cli_usage_error("infer", "--sequence-id takes an id");
            a->sequence_id = optarg;
            break;
        case 's': a->sequence_start = true; break;
        case 'e': a->sequence_end = true; break;
        case 'S': a->stream = true; break;
        case 'h': fputs(help, stdout); return -1;
        default: return pjs_cli_usage_error("infer", "unknown option");
        }
    }
    if (optind + 1 != argc)
        return pjs_cli_usage_error("infer", optind == argc ? "name the model to run"
                                                           : "one model at a time");
    a->model = argv[optind];
    if ((a->sequence_start || a->sequence_end) && a->sequence_id == NULL)
        return pjs_cli_usage_error("infer", "--sequence-start and --sequence-end need "
                                            "--sequence-id");
    if (a->n_inputs == 0)
        return pjs_cli_usage_error("infer", "give the model's inputs with --input NAME=FILE.npy "
                                            "(`pjserve models` and the model's metadata list "
                                            "them)");
    return PJS_EXIT_OK;
}

/* Adds `spec` (NAME=FILE.npy) to the request. */
static int add_npy_input(pjs_client_request *req, const char *spec)
{
    const char *eq = strchr(spec, '=');
    char name[512];
    snprintf(name, sizeof name, "%.*s", (int)(eq - spec), spec);
    pjs_npy a;
    pjs_error err;
    if (pjs_npy_load(&a, eq + 1, PJS_DTYPE_BF16, &err) != 0)
        return pjs_cli_fail("input %s: %s", name, err.msg);
    int64_t shape[PJS_MAX_RANK];
    for (int i = 0; i < a.shape.rank; i++)
        shape[i] = a.shape.dims[i];
    pjs_client_error cerr;
    int rc = pjs_client_request_add_input(req, name, pjs_dtype_kserve_name(a.dtype), shape,
                                          (size_t)a.shape.rank, a.data, a.nbytes, &cerr);
    pjs_npy_free(&a);
    return rc != 0 ? pjs_cli_fail("input %s: %s", name, cerr.message) : 0;
}

/* An integer, whole string; false for anything else. */
static bool parse_int(const char *s, long long *out)
{
    char *end;
    errno = 0;
    *out = strtoll(s, &end, 10);
    return *s != '\0' && *end == '\0' && errno == 0;
}

/* Adds `spec`, KEY=VALUE typed as the help says. */
static int add_parameter(pjs_client_request *req, const char *spec, pjs_client_error *err)
{
    const char *eq = strchr(spec, '=');
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - spec), spec);
    const char *v = eq + 1;
    long long n;
    if (strncmp(v, "string:", 7) == 0)
        return pjs_client_request_set_parameter_string(req, key, v + 7, err);
    if (strncmp(v, "bool:", 5) == 0 || strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
        const char *b = strncmp(v, "bool:", 5) == 0 ? v + 5 : v;
        if (strcmp(b, "true") != 0 && strcmp(b, "false") != 0)
            return pjs_cli_usage_error("infer", "--parameter %s: a bool is true or false", key);
        return pjs_client_request_set_parameter_bool(req, key, strcmp(b, "true") == 0, err);
    }
    if (strncmp(v, "int:", 4) == 0) {
        if (!parse_int(v + 4, &n))
            return pjs_cli_usage_error("infer", "--parameter %s: '%s' is not an integer", key,
                                       v + 4);
        return pjs_client_request_set_parameter_int(req, key, n, err);
    }
    if (parse_int(v, &n))
        return pjs_client_request_set_parameter_int(req, key, n, err);
    return pjs_client_request_set_parameter_string(req, key, v, err);
}

static int add_sequence(const infer_args *a, pjs_client_request *req, pjs_client_error *err)
{
    long long id;
    int rc = parse_int(a->sequence_id, &id)
                 ? pjs_client_request_set_parameter_int(req, "sequence_id", id, err)
                 : pjs_client_request_set_parameter_string(req, "sequence_id", a->sequence_id,
                                                           err);
    if (rc == 0 && a->sequence_start)
        rc = pjs_client_request_set_parameter_bool(req, "sequence_start", true, err);
    if (rc == 0 && a->sequence_end)
        rc = pjs_client_request_set_parameter_bool(req, "sequence_end", true, err);
    return rc;
}

static int build_request(const infer_args *a, pjs_client_request **out)
{
    pjs_client_request *req;
    pjs_client_error err;
    if (pjs_client_request_new(a->model, &req, &err) != 0)
        return pjs_cli_fail("%s", err.message);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < a->n_inputs; i++)
        rc = add_npy_input(req, a->inputs[i]);
    for (size_t i = 0; rc == 0 && i < a->n_outputs; i++)
        if (pjs_client_request_add_output(req, a->outputs[i], &err) != 0)
            rc = pjs_cli_fail("%s", err.message);
    if (rc == 0 && a->id != NULL && pjs_client_request_set_id(req, a->id, &err) != 0)
        rc = pjs_cli_fail("%s", err.message);
    if (rc == 0 && a->has_priority &&
        pjs_client_request_set_parameter_int(req, "priority", a->priority, &err) != 0)
        rc = pjs_cli_fail("%s", err.message);
    for (size_t i = 0; rc == 0 && i < a->n_parameters; i++) {
        err.code = PJS_CLIENT_OK;
        if ((rc = add_parameter(req, a->parameters[i], &err)) != 0 && err.code != PJS_CLIENT_OK)
            rc = pjs_cli_fail("%s", err.message);
    }
    if (rc == 0 && a->sequence_id != NULL && add_sequence(a, req, &err) != 0)
        rc = pjs_cli_fail("%s", err.message);
    if (rc != 0) {
        pjs_client_request_free(req);
        return rc;
    }
    *out = req;
    return 0;
}

/* ---- values ---------------------------------------------------------------------- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31u, frac = h & 1023u;
    uint32_t bits;
    if (exp == 0 && frac == 0) {
        bits = sign;
    } else if (exp == 0) { /* subnormal: normalize */
        exp = 127 - 15 + 1;
        while (!(frac & 1024u)) {
            frac <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((frac & 1023u) << 13);
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (frac << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (frac << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Element i of a numeric tensor as JSON. */
static json_t *element_json(pjs_dtype dt, const unsigned char *p)
{
    switch (dt) {
    case PJS_DTYPE_BOOL: return json_boolean(p[0] != 0);
    case PJS_DTYPE_U8: return json_integer(p[0]);
    case PJS_DTYPE_I8: return json_integer((int8_t)p[0]);
    case PJS_DTYPE_U16: { uint16_t v; memcpy(&v, p, 2); return json_integer(v); }
    case PJS_DTYPE_I16: { int16_t v; memcpy(&v, p, 2); return json_integer(v); }
    case PJS_DTYPE_U32: { uint32_t v; memcpy(&v, p, 4); return json_integer(v); }
    case PJS_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); return json_integer(v); }
    case PJS_DTYPE_U64: { uint64_t v; memcpy(&v, p, 8); return json_integer((json_int_t)v); }
    case PJS_DTYPE_I64: { int64_t v; memcpy(&v, p, 8); return json_integer(v); }
    case PJS_DTYPE_F16: { uint16_t v; memcpy(&v, p, 2); return json_real(half_to_float(v)); }
    case PJS_DTYPE_BF16: {
        uint16_t v;
        memcpy(&v, p, 2);
        uint32_t bits = (uint32_t)v << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return json_real(f);
    }
    case PJS_DTYPE_F32: { float v; memcpy(&v, p, 4); return json_real(v); }
    case PJS_DTYPE_F64: { double v; memcpy(&v, p, 8); return json_real(v); }
    default: return json_null();
    }
}

/* The first `limit` values of a tensor (all for SIZE_MAX) as a JSON array;
 * *more is set when there were more. */
static json_t *values_json(const pjs_client_tensor *t, size_t limit, bool *more)
{
    pjs_dtype dt = pjs_dtype_from_kserve(t->datatype, strlen(t->datatype));
    json_t *list = json_array();
    *more = false;
    if (dt == PJS_DTYPE_BYTES) {
        size_t at = 0, len, n = 0;
        const char *s;
        while (pjs_client_bytes_next(t->data, t->nbytes, &at, &s, &len) == 1) {
            if (n++ == limit) {
                *more = true;
                break;
            }
            json_array_append_new(list, json_stringn_nocheck(s, len));
        }
        return list;
    }
    size_t size = pjs_dtype_size(dt);
    size_t n = size ? t->nbytes / size : 0;
    for (size_t i = 0; i < n; i++) {
        if (i == limit) {
            *more = true;
            break;
        }
        json_array_append_new(list, element_json(dt, (const unsigned char *)t->data + i * size));
    }
    return list;
}

static json_t *shape_json(const pjs_client_tensor *t)
{
    json_t *a = json_array();
    for (size_t i = 0; i < t->rank; i++)
        json_array_append_new(a, json_integer(t->shape[i]));
    return a;
}

static void shape_text(const pjs_client_tensor *t, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (size_t i = 0; i < t->rank && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap)
        snprintf(out + n, cap - n, "]");
}

/* ---- output ------------------------------------------------------------------------ */

/* Writes output t to dir/NAME.npy; *path gets the file. */
static int save_output(const char *dir, const pjs_client_tensor *t, char *path, size_t cap)
{
    pjs_dtype dt = pjs_dtype_from_kserve(t->datatype, strlen(t->datatype));
    char name[1024];
    pjs_cli_shown(t->name, name, sizeof name);
    if (t->rank > PJS_MAX_RANK)
        return pjs_cli_fail("output %s has %zu dimensions; .npy files here hold at most %d",
                            name, t->rank, PJS_MAX_RANK);
    if (strchr(t->name, '/') != NULL || strcmp(t->name, "..") == 0)
        return pjs_cli_fail("output name %s cannot be a file name", name);
    pjs_shape shape = {.rank = (int)t->rank};
    for (size_t i = 0; i < t->rank; i++)
        shape.dims[i] = t->shape[i];
    size_t n = strlen(dir);
    snprintf(path, cap, "%.*s/%s.npy", (int)(n > 1 && dir[n - 1] == '/' ? n - 1 : n), dir,
             t->name);
    pjs_error err;
    int rc = dt == PJS_DTYPE_BYTES ? pjs_npy_save_bytes(path, &shape, t->data, t->nbytes, &err)
                                   : pjs_npy_save(path, dt, &shape, t->data, &err);
    char why[4 * sizeof err.msg];
    if (rc != 0) /* the message names the file, which holds the output's name */
        return pjs_cli_fail("output %s: %s", name, pjs_cli_shown(err.msg, why, sizeof why));
    return 0;
}

static int report(const infer_args *a, const pjs_client_result *r)
{
    size_t n = pjs_client_result_output_count(r);
    if (a->output_dir != NULL && mkdir(a->output_dir, 0777) != 0) {
        struct stat st;
        if (stat(a->output_dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return pjs_cli_fail("cannot create the output directory %s", a->output_dir);
    }
    json_t *outputs = json_array();
    pjs_cli_table table;
    pjs_cli_table_init(&table, 4);
    const char *head[] = {"OUTPUT", "DATATYPE", "SHAPE", a->output_dir ? "FILE" : "VALUES"};
    pjs_cli_table_row(&table, head);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        pjs_client_tensor t;
        pjs_client_result_output(r, i, &t, NULL);
        char path[4096] = "", shape[256];
        shape_text(&t, shape, sizeof shape);
        json_t *o = json_pack("{s:s, s:s, s:o}", "name", t.name, "datatype", t.datatype, "shape",
                              shape_json(&t));
        char *preview = NULL;
        if (a->output_dir != NULL) {
            rc = save_output(a->output_dir, &t, path, sizeof path);
            json_object_set_new(o, "file", json_string(path));
        } else {
            bool more;
            json_object_set_new(o, "data", values_json(&t, SIZE_MAX, &more));
            json_t *first = values_json(&t, PREVIEW_VALUES, &more);
            char *text = json_dumps(first, JSON_COMPACT | JSON_REAL_PRECISION(6));
            json_decref(first);
            if (text != NULL && (preview = malloc(strlen(text) + 8)) != NULL)
                sprintf(preview, "%.*s%s", (int)strlen(text) - (more ? 1 : 0), text,
                        more ? ", ...]" : "");
            free(text);
        }
        json_array_append_new(outputs, o);
        const char *row[] = {t.name, t.datatype, shape, a->output_dir ? path : preview};
        pjs_cli_table_row(&table, row);
        free(preview);
    }
    if (rc == 0 && a->conn.json) {
        json_t *doc = json_pack("{s:s, s:s, s:s, s:O}", "model_name", pjs_client_result_model(r),
                                "model_version", pjs_client_result_model_version(r), "id",
                                pjs_client_result_id(r), "outputs", outputs);
        pjs_cli_print_json(doc);
        json_decref(doc);
    } else if (rc == 0) {
        pjs_cli_table_print(&table);
    }
    json_decref(outputs);
    pjs_cli_table_free(&table);
    return rc;
}

/* ---- streaming ------------------------------------------------------------------- */

/* What the stream's callback shares with the command, under lock. */
typedef struct stream_state {
    const infer_args *a;
    const pjs_client *c;
    pthread_mutex_t lock;
    size_t responses;
    int rc; /* the first failure, else 0 */
} stream_state;

static void on_stream_answer(void *user_data, pjs_client_result *result,
                             const pjs_client_error *err)
{
    stream_state *st = user_data;
    pthread_mutex_lock(&st->lock);
    int rc = result != NULL ? report(st->a, result)
                            : pjs_cli_client_fail(st->c, "infer (a stream response)", err);
    fflush(stdout);
    st->responses += result != NULL;
    if (st->rc == 0)
        st->rc = rc;
    pthread_mutex_unlock(&st->lock);
    pjs_client_result_free(result);
}

/* Sends req on a stream and shows every answer until the server ends it. */
static int infer_stream(const infer_args *a, pjs_client *c, const pjs_client_request *req)
{
    stream_state st = {.a = a, .c = c};
    pthread_mutex_init(&st.lock, NULL);
    pjs_client_stream *stream = NULL;
    pjs_client_error err;
    int rc = 0;
    if (pjs_client_stream_open(c, on_stream_answer, &st, a->conn.timeout_ms, &stream, &err) != 0)
        rc = pjs_cli_client_fail_hint(c, "infer", &err,
                                      err.code == PJS_CLIENT_UNIMPLEMENTED && !err.from_server
                                          ? "--stream needs gRPC: give a grpc:// URL"
                                          : NULL);
    int sent = rc == 0 ? pjs_client_stream_send(stream, req, &err) : 0;
    if (sent != 0)
        rc = pjs_cli_client_fail(c, "infer", &err);
    pjs_client_error closed;
    if (stream != NULL && pjs_client_stream_close(stream, &closed) != 0 && rc == 0)
        rc = pjs_cli_client_fail(c, "infer (the stream)", &closed);
    pthread_mutex_lock(&st.lock);
    if (rc == 0)
        rc = st.rc;
    pthread_mutex_unlock(&st.lock);
    pthread_mutex_destroy(&st.lock);
    return rc;
}

/* The hint for a failed unary call: a decoupled model needs --stream. */
static const char *unary_hint(const infer_args *a, const pjs_client_error *err, char *buf,
                              size_t cap)
{
    if (!err->from_server)
        return NULL;
    if (err->code == PJS_CLIENT_NOT_FOUND)
        return "`pjserve models` lists the models the server has";
    if (err->code == PJS_CLIENT_UNIMPLEMENTED && strstr(err->message, "decoupled") != NULL) {
        char model[256];
        snprintf(buf, cap, "model %s is decoupled: use --stream (over gRPC)",
                 pjs_cli_shown(a->model, model, sizeof model));
        return buf;
    }
    return NULL;
}

int pjs_cmd_infer(int argc, char **argv)
{
    infer_args a;
    memset(&a, 0, sizeof a);
    int rc = parse(argc, argv, &a);
    if (rc != PJS_EXIT_OK)
        return rc < 0 ? PJS_EXIT_OK : rc;
    pjs_client_request *req = NULL;
    if ((rc = build_request(&a, &req)) != 0)
        return rc;
    pjs_client *c = NULL;
    rc = pjs_cli_connect("infer", &a.conn, &c);
    pjs_client_result *result = NULL;
    pjs_client_error err;
    char hint[320];
    if (rc == 0 && a.stream) {
        rc = infer_stream(&a, c, req);
    } else if (rc == 0 && pjs_client_infer(c, req, &result, &err) != 0) {
        rc = pjs_cli_client_fail_hint(c, "infer", &err, unary_hint(&a, &err, hint, sizeof hint));
    } else if (rc == 0) {
        rc = report(&a, result);
    }
    pjs_client_result_free(result);
    pjs_client_request_free(req);
    pjs_client_close(c);
    return rc;
}
