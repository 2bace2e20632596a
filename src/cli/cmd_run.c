/*
 * cmd_run.c - `pjserve run`: execute a bundle once on .npy inputs.
 *
 * The inputs' shapes pick the variant (as the server resolves a request),
 * their leading (batch) dimension n the module: the smallest compiled batch
 * size that holds n, zero-padded, with outputs sliced back to n rows. A batch
 * larger than every compiled size runs in chunks of the largest one.
 * --batch-size N forces module N (and chunks of N).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/npy.h"
#include "registry/bundle.h"

#define MAX_INPUTS 64

static const char help[] =
    "usage: pjserve run [OPTIONS] BUNDLE --input NAME=FILE.npy ... --output-dir DIR\n"
    "\n"
    "Loads and compiles a bundle, executes it once on the given inputs and writes\n"
    "each output as DIR/NAME.npy. Every model input needs one --input. The input\n"
    "shapes pick the bundle's variant whose shapes they have. Batched inputs share\n"
    "their leading dimension n; the smallest compiled batch size that holds n is\n"
    "used (inputs are zero-padded, outputs sliced back to n rows), and a batch\n"
    "larger than every compiled size runs in chunks.\n"
    "\n"
    "options:\n"
    "  --input NAME=FILE.npy  an input of the model (repeat for each input)\n"
    "  --output-dir DIR       where to write the outputs (created if missing)\n"
    "  --batch-size N         use the module compiled for batch size N\n" PJS_CLI_COMMON_HELP
    "\n"
    "example:\n"
    "  pjserve run models/mlp --input x=x.npy --output-dir out/\n";

typedef struct run_input {
    const char *name;
    const char *path;
    pjs_npy array;
    const pjs_tensor_spec *spec; /* the resolved variant's, once load_inputs succeeded */
} run_input;

typedef struct run_args {
    const char *bundle_dir;
    const char *output_dir;
    int64_t batch_size; /* 0: pick */
    run_input inputs[MAX_INPUTS];
    size_t n_inputs;
    size_t variant;     /* index into manifest.variants, set by load_inputs */
    pjs_cli_common common;
} run_args;

static int parse_args(int argc, char **argv, run_args *a)
{
    static const struct option opts[] = {PJS_CLI_COMMON_LONG_OPTIONS,
                                         {"input", required_argument, NULL, 'i'},
                                         {"output-dir", required_argument, NULL, 'o'},
                                         {"batch-size", required_argument, NULL, 'b'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "hi:o:b:", opts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            fputs(help, stdout);
            return -1;
        case 'i': {
            char *eq = strchr(optarg, '=');
            if (eq == NULL || eq == optarg || eq[1] == '\0')
                return pjs_cli_usage_error("run", "--input %s: expected NAME=FILE.npy", optarg);
            if (a->n_inputs == MAX_INPUTS)
                return pjs_cli_usage_error("run", "at most %d --input flags", MAX_INPUTS);
            *eq = '\0';
            a->inputs[a->n_inputs].name = optarg;
            a->inputs[a->n_inputs].path = eq + 1;
            a->n_inputs++;
            break;
        }
        case 'o': a->output_dir = optarg; break;
        case 'b': {
            char *end;
            errno = 0;
            long long n = strtoll(optarg, &end, 10);
            if (errno != 0 || *end != '\0' || n < 1)
                return pjs_cli_usage_error("run", "--batch-size %s: expected a positive integer",
                                           optarg);
            a->batch_size = n;
            break;
        }
        default: {
            int r = pjs_cli_common_option(&a->common, opt, optarg);
            if (r < 0)
                return PJS_EXIT_USAGE;
            if (r == 0)
                return pjs_cli_usage_error("run", "unknown option");
        }
        }
    }
    if (optind == argc)
        return pjs_cli_usage_error("run", "name the bundle directory to run");
    if (argc - optind > 1)
        return pjs_cli_usage_error("run", "one bundle at a time (got '%s' and '%s')", argv[optind],
                                   argv[optind + 1]);
    a->bundle_dir = argv[optind];
    a->common.model_dirs = argv + optind; /* auto CPU threads look at this bundle */
    a->common.n_model_dirs = 1;
    if (a->output_dir == NULL)
        return pjs_cli_usage_error("run", "--output-dir is required");
    if (a->n_inputs == 0)
        return pjs_cli_usage_error("run", "give each model input with --input NAME=FILE.npy");
    return 0;
}

static const char *input_names(const pjs_manifest *m, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < m->n_inputs && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", m->inputs[i].name);
    return buf;
}

/* With several variants, sets a->variant to the one whose input shapes the
 * arrays have and points the inputs at its specs. A single-variant model
 * needs no resolving: check_shapes reports a shape that does not fit. */
static int resolve_variant(run_args *a, const pjs_manifest *m)
{
    a->variant = 0;
    if (m->n_variants <= 1)
        return PJS_EXIT_OK;
    const pjs_shape *shapes[MAX_INPUTS];
    for (size_t i = 0; i < a->n_inputs; i++)
        shapes[i] = &a->inputs[i].array.shape;
    if (pjs_manifest_find_variant(m, shapes, &a->variant)) {
        for (size_t i = 0; i < a->n_inputs; i++)
            a->inputs[i].spec = &m->variants[a->variant].inputs[i];
        return PJS_EXIT_OK;
    }
    char given[512], accepted[1024], shape[160];
    size_t used = 0;
    bool batched = false;
    given[0] = '\0';
    for (size_t i = 0; i < a->n_inputs && used < sizeof given; i++) {
        int w = snprintf(given + used, sizeof given - used, "%s%s %s", i ? ", " : "",
                         a->inputs[i].name,
                         pjs_shape_format(&a->inputs[i].array.shape, shape, sizeof shape));
        if (w < 0)
            break;
        used += (size_t)w;
        batched = batched || m->inputs[i].batched;
    }
    return pjs_cli_fail("bundle %s: input shapes %s match no variant of the model (accepted: "
                        "%s%s)",
                        m->name, given, pjs_manifest_format_variants(m, accepted, sizeof accepted),
                        batched ? "; -1: any batch size" : "");
}

/* Checks each array's shape against its spec and sets *n to the common
 * batch dimension (0 when nothing is batched). */
static int check_shapes(const run_args *a, const pjs_manifest *m, int64_t *n)
{
    *n = 0;
    for (size_t i = 0; i < a->n_inputs; i++) {
        const run_input *in = &a->inputs[i];
        const pjs_tensor_spec *s = in->spec;
        const pjs_shape *sh = &in->array.shape;
        char got[128], want[128];
        bool ok = sh->rank == s->shape.rank;
        for (int d = s->batched ? 1 : 0; ok && d < sh->rank; d++)
            ok = sh->dims[d] == s->shape.dims[d];
        if (ok && s->batched && sh->dims[0] < 1)
            ok = false;
        if (!ok) {
            pjs_shape shown = s->shape;
            if (s->batched)
                shown.dims[0] = sh->rank > 0 && sh->dims[0] > 0 ? sh->dims[0] : 1;
            return pjs_cli_fail("bundle %s: input \"%s\": %s has shape %s but the model takes %s%s",
                                m->name, in->name, in->path, pjs_shape_format(sh, got, sizeof got),
                                pjs_shape_format(&shown, want, sizeof want),
                                s->batched ? " (any batch size >= 1 in the first dimension)" : "");
        }
        if (s->batched) {
            if (*n != 0 && sh->dims[0] != *n)
                return pjs_cli_fail("bundle %s: batched inputs disagree on the batch size (%lld "
                                    "and %lld)",
                                    m->name, (long long)*n, (long long)sh->dims[0]);
            *n = sh->dims[0];
        }
    }
    return PJS_EXIT_OK;
}

/* Matches --input flags to the manifest (leaving a->inputs in manifest
 * order), loads them, checks their dtypes, resolves the variant and checks
 * the shapes. Sets *n to the common batch dimension (0 when nothing is
 * batched). */
static int load_inputs(run_args *a, const pjs_bundle *b, int64_t *n)
{
    const pjs_manifest *m = &b->manifest;
    char names[1024];
    pjs_error err;
    for (size_t i = 0; i < a->n_inputs; i++) {
        run_input *in = &a->inputs[i];
        for (size_t j = 0; j < m->n_inputs; j++)
            if (strcmp(m->inputs[j].name, in->name) == 0)
                in->spec = &m->inputs[j];
        if (in->spec == NULL)
            return pjs_cli_fail("bundle %s: --input %s: the model has no input named \"%s\" "
                                "(its inputs: %s)",
                                m->name, in->name, in->name, input_names(m, names, sizeof names));
        for (size_t j = 0; j < i; j++)
            if (a->inputs[j].spec == in->spec)
                return pjs_cli_fail("bundle %s: input \"%s\" given twice", m->name, in->name);
    }
    /* Every input is given once: put them in manifest order. */
    for (size_t j = 0; j < m->n_inputs; j++) {
        size_t i = j;
        while (i < a->n_inputs && a->inputs[i].spec != &m->inputs[j])
            i++;
        if (i == a->n_inputs)
            return pjs_cli_fail("bundle %s: missing --input %s=FILE.npy (the model's inputs: %s)",
                                m->name, m->inputs[j].name, input_names(m, names, sizeof names));
        run_input given = a->inputs[i];
        a->inputs[i] = a->inputs[j];
        a->inputs[j] = given;
    }
    for (size_t i = 0; i < a->n_inputs; i++) {
        run_input *in = &a->inputs[i];
        const pjs_tensor_spec *s = in->spec;
        pjs_dtype void2 = s->dtype == PJS_DTYPE_BF16 ? PJS_DTYPE_BF16 : PJS_DTYPE_INVALID;
        if (pjs_npy_load(&in->array, in->path, void2, &err) != 0)
            return pjs_cli_fail("input \"%s\": %s", in->name, err.msg);
        if (in->array.dtype != s->dtype)
            return pjs_cli_fail("bundle %s: input \"%s\": %s has dtype %s but the model takes %s",
                                m->name, in->name, in->path, pjs_dtype_name(in->array.dtype),
                                pjs_dtype_name(s->dtype));
    }
    int rc = resolve_variant(a, m);
    return rc != PJS_EXIT_OK ? rc : check_shapes(a, m, n);
}

/* Runs rows [offset, offset+rows) through module mod (batch size mod_n). */
static int run_chunk(run_args *a, pjs_bundle *b, pjs_bundle_module *mod, pjrt_buffer **weights,
                     int64_t offset, int64_t rows, void **outputs, pjs_cli_runtime *rt)
{
    const pjs_manifest *m = &b->manifest;
    const pjs_tensor_spec *out_specs = m->variants[a->variant].outputs;
    size_t n_w = b->weights.n_tensors;
    size_t n_args = n_w + m->n_inputs;
    pjrt_buffer *args[n_args + 1];
    pjrt_buffer *results[m->n_outputs + 1];
    int rc = PJS_EXIT_OK;
    pjs_error err;
    memcpy(args, weights, n_w * sizeof *args);
    size_t uploaded = 0;
    for (; uploaded < m->n_inputs; uploaded++) {
        const run_input *in = &a->inputs[uploaded]; /* in manifest order */
        const pjs_tensor_spec *s = in->spec;
        pjs_shape shape = s->shape;
        const unsigned char *src = in->array.data;
        void *padded = NULL;
        if (s->batched) {
            shape.dims[0] = mod->batch_size;
            size_t rb = pjs_tensor_spec_row_bytes(s);
            padded = calloc((size_t)mod->batch_size, rb ? rb : 1);
            if (padded == NULL) {
                rc = pjs_cli_fail("out of memory");
                break;
            }
            memcpy(padded, src + (size_t)offset * rb, (size_t)rows * rb);
            src = padded;
        }
        int r = pjs_rt_buffer_from_host(rt->client, s->dtype, &shape,
                                        &mod->exec->params[n_w + uploaded], src,
                                        &args[n_w + uploaded], &err);
        free(padded);
        if (r != 0) {
            rc = pjs_cli_fail("bundle %s: input \"%s\": %s", m->name, s->name, err.msg);
            break;
        }
    }
    if (rc == PJS_EXIT_OK) {
        if (pjs_rt_execute(mod->exec, args, results, &err) != 0)
            rc = pjs_cli_fail("bundle %s: %s", m->name, err.msg);
    }
    for (size_t i = 0; i < uploaded; i++)
        pjs_rt_buffer_destroy(rt->client, args[n_w + i]);
    if (rc != PJS_EXIT_OK)
        return rc;
    for (size_t o = 0; o < m->n_outputs; o++) {
        const pjs_tensor_spec *s = &out_specs[o];
        size_t rb = pjs_tensor_spec_row_bytes(s);
        size_t full = s->batched ? rb * (size_t)mod->batch_size : rb;
        unsigned char *tmp = malloc(full ? full : 1);
        if (tmp == NULL)
            rc = pjs_cli_fail("out of memory");
        else if (pjs_rt_buffer_to_host(rt->client, results[o], tmp, full, &err) != 0)
            rc = pjs_cli_fail("bundle %s: output \"%s\": %s", m->name, s->name, err.msg);
        else if (s->batched)
            memcpy((unsigned char *)outputs[o] + (size_t)offset * rb, tmp, (size_t)rows * rb);
        else
            memcpy(outputs[o], tmp, rb);
        free(tmp);
        pjs_rt_buffer_destroy(rt->client, results[o]);
    }
    return rc;
}

static int make_dir(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pjs_cli_fail("cannot create output directory %s: %s", dir, strerror(errno));
    return PJS_EXIT_OK;
}

static int write_outputs(const run_args *a, const pjs_manifest *m, void **outputs, int64_t n)
{
    pjs_error err;
    int rc = make_dir(a->output_dir);
    for (size_t o = 0; rc == PJS_EXIT_OK && o < m->n_outputs; o++) {
        const pjs_tensor_spec *s = &m->variants[a->variant].outputs[o];
        pjs_shape shape = s->shape;
        if (s->batched)
            shape.dims[0] = n;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.npy", a->output_dir, s->name);
        if (pjs_npy_save(path, s->dtype, &shape, outputs[o], &err) != 0)
            rc = pjs_cli_fail("%s", err.msg);
    }
    return rc;
}

static int execute(run_args *a, pjs_bundle *b, int64_t n, pjs_cli_runtime *rt)
{
    const pjs_manifest *m = &b->manifest;
    pjs_error err;
    int64_t chunk = a->batch_size ? a->batch_size : pjs_bundle_pick_batch_size(b, n ? n : 1);
    pjs_bundle_module *mod = pjs_bundle_module_for(b, a->variant, chunk);
    if (mod == NULL)
        return pjs_cli_fail("bundle %s: --batch-size %lld: no module compiled for that batch size",
                            m->name, (long long)a->batch_size);
    if (pjs_bundle_compile_module(b, mod, rt->client, rt->cache, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    int64_t rows_total = n ? n : 1;
    void *outputs[m->n_outputs + 1];
    size_t n_outputs_allocated = 0;
    pjrt_buffer *weights[b->weights.n_tensors + 1];
    int rc = PJS_EXIT_OK;
    if (pjs_bundle_upload_weights(b, rt->client, NULL, weights, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    for (; n_outputs_allocated < m->n_outputs; n_outputs_allocated++) {
        const pjs_tensor_spec *s = &m->variants[a->variant].outputs[n_outputs_allocated];
        size_t bytes = pjs_tensor_spec_row_bytes(s) * (s->batched ? (size_t)rows_total : 1);
        outputs[n_outputs_allocated] = calloc(1, bytes ? bytes : 1);
        if (outputs[n_outputs_allocated] == NULL) {
            rc = pjs_cli_fail("out of memory");
            break;
        }
    }
    for (int64_t off = 0; rc == PJS_EXIT_OK && off < rows_total; off += chunk) {
        int64_t rows = rows_total - off < chunk ? rows_total - off : chunk;
        rc = run_chunk(a, b, mod, weights, off, rows, outputs, rt);
    }
    if (rc == PJS_EXIT_OK)
        rc = write_outputs(a, m, outputs, rows_total);
    for (size_t o = 0; o < n_outputs_allocated; o++)
        free(outputs[o]);
    for (size_t i = 0; i < b->weights.n_tensors; i++)
        pjs_rt_buffer_destroy(rt->client, weights[i]);
    return rc;
}

int pjs_cmd_run(int argc, char **argv)
{
    run_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? PJS_EXIT_OK : rc;
    pjs_error err;
    pjs_bundle *b = NULL;
    pjs_cli_runtime rt = {0};
    int64_t n = 0;
    if (pjs_bundle_open(a.bundle_dir, &b, &err) != 0) {
        rc = pjs_cli_fail("%s", err.msg);
        goto out;
    }
    if (b->manifest.kind != PJS_KIND_MODEL) {
        rc = pjs_cli_fail("%s is %s: its run calls other models, which only a server has; "
                          "serve the repository (pjserve serve) and call it",
                          a.bundle_dir,
                          b->manifest.kind == PJS_KIND_META ? "a meta model" : "an ensemble");
        goto out;
    }
    if (b->hooks != NULL)
        fprintf(stderr, "pjserve: note: %s has hooks; run executes its executable alone, with "
                        "the executable's inputs (manifest `inputs`), without them\n",
                a.bundle_dir);
    rc = load_inputs(&a, b, &n);
    if (rc != PJS_EXIT_OK)
        goto out;
    rc = pjs_cli_start(&a.common, &rt);
    if (rc != PJS_EXIT_OK)
        goto out;
    rc = execute(&a, b, n, &rt);
out:
    for (size_t i = 0; i < a.n_inputs; i++)
        pjs_npy_free(&a.inputs[i].array);
    pjs_bundle_close(b); /* executables go before the client */
    if (rt.client != NULL)
        pjs_cli_stop(&rt);
    return rc;
}
