/*
 * cmd_check.c - `pjserve check`: validate and compile bundles, and report.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "registry/bundle.h"

static const char help[] =
    "usage: pjserve check [OPTIONS] BUNDLE...\n"
    "\n"
    "Validates each bundle (manifest, weights, one module per variant and batch\n"
    "size, and per swap-in stage and batch size) and compiles every module,\n"
    "checking its parameters and results against its variant's (or stage's)\n"
    "shapes in the manifest and the weights. Compiled executables go to the\n"
    "executable cache, so a later run or serve of the same bundle skips\n"
    "compilation. Prints what was found, the modules of each variant and stage,\n"
    "and ends with 'modules: K (compiled C, from cache H)'. Exits 1 if any bundle\n"
    "is invalid.\n"
    "\n"
    "options:\n" PJS_CLI_COMMON_HELP;

static void print_specs(const char *indent, const char *label, const pjs_tensor_spec *specs,
                        size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const pjs_tensor_spec *t = &specs[i];
        printf("%s%-8s %s %s [", indent, i == 0 ? label : "", t->name, pjs_dtype_name(t->dtype));
        for (int d = 0; d < t->shape.rank; d++) {
            if (d == 0 && t->batched)
                printf("batch");
            else
                printf("%s%lld", d ? ", " : "", (long long)t->shape.dims[d]);
        }
        printf("]\n");
    }
}

/* "  step 0: two_io (a <- a, b <- b) -> (sum -> s1)", in the order run. */
static void print_steps(const pjs_manifest *m)
{
    for (size_t k = 0; k < m->n_steps; k++) {
        const pjs_ensemble_step *st = &m->steps[m->step_order[k]];
        printf("  step %zu: %s (", m->step_order[k], st->model);
        for (size_t e = 0; e < st->n_inputs; e++)
            printf("%s%s <- %s", e ? ", " : "", st->inputs[e].model_tensor,
                   st->inputs[e].ensemble_tensor);
        printf(") -> (");
        for (size_t e = 0; e < st->n_outputs; e++)
            printf("%s%s -> %s", e ? ", " : "", st->outputs[e].model_tensor,
                   st->outputs[e].ensemble_tensor);
        printf(")\n");
    }
}

void pjs_cli_print_manifest(const pjs_manifest *m)
{
    if (m->kind == PJS_KIND_ENSEMBLE) {
        printf("  kind: ensemble, %zu steps, in the order they run:\n", m->n_steps);
        print_steps(m);
        print_specs("  ", "client inputs:", m->client_inputs, m->n_client_inputs);
        print_specs("  ", "client outputs:", m->client_outputs, m->n_client_outputs);
        return;
    }
    if (m->kind == PJS_KIND_META) {
        printf("  kind: meta, calls: [");
        for (size_t i = 0; i < m->n_calls; i++)
            printf("%s%s", i ? ", " : "", m->calls[i]);
        printf("]%s\n", m->n_calls == 0 ? " (compute-only)" : "");
        print_specs("  ", "client inputs:", m->client_inputs, m->n_client_inputs);
        print_specs("  ", "client outputs:", m->client_outputs, m->n_client_outputs);
        return;
    }
    printf("  kind: model, residency: %s, weight: %g\n", pjs_residency_name(m->residency),
           m->weight);
    print_specs("  ", "client inputs:", m->client_inputs, m->n_client_inputs);
    print_specs("  ", "client outputs:", m->client_outputs, m->n_client_outputs);
    printf("  batch sizes: [");
    for (size_t i = 0; i < m->n_batch_sizes; i++)
        printf("%s%lld", i ? ", " : "", (long long)m->batch_sizes[i]);
    printf("]\n");
    print_specs("  ", "inputs:", m->inputs, m->n_inputs);
    print_specs("  ", "outputs:", m->outputs, m->n_outputs);
    for (size_t v = 1; v < m->n_variants; v++) {
        printf("  variant %s:\n", m->variants[v].name);
        print_specs("    ", "inputs:", m->variants[v].inputs, m->n_inputs);
        print_specs("    ", "outputs:", m->variants[v].outputs, m->n_outputs);
    }
}

typedef struct tally {
    int modules, compiled, cached, failed_bundles;
} tally;

/* Compiles the modules of one variant or swap-in stage (one per batch
 * size, from `mods`); prints one line per module. */
static int check_modules(pjs_bundle *b, pjs_bundle_module *mods, const char *indent,
                         pjs_cli_runtime *rt, tally *t)
{
    pjs_error err;
    for (size_t i = 0; i < b->manifest.n_batch_sizes; i++) {
        pjs_bundle_module *mod = &mods[i];
        fflush(stdout);
        if (pjs_bundle_compile_module(b, mod, rt->client, rt->cache, &err) != 0) {
            fprintf(stderr, "pjserve: error: %s\n", err.msg);
            t->failed_bundles++;
            return -1;
        }
        t->modules++;
        if (mod->exec->from_cache) {
            t->cached++;
            printf("%sb%lld: loaded from the executable cache in %.2f s\n", indent,
                   (long long)mod->batch_size, mod->exec->compile_seconds);
        } else {
            t->compiled++;
            printf("%sb%lld: compiled in %.2f s\n", indent, (long long)mod->batch_size,
                   mod->exec->compile_seconds);
        }
    }
    return 0;
}

static void check_one(const char *dir, pjs_cli_runtime *rt, tally *t)
{
    pjs_error err;
    pjs_bundle *b = NULL;
    if (pjs_bundle_open(dir, &b, &err) != 0) {
        fprintf(stderr, "pjserve: error: %s\n", err.msg);
        t->failed_bundles++;
        return;
    }
    const pjs_manifest *m = &b->manifest;
    printf("bundle %s (%s)\n", m->name, dir);
    pjs_cli_print_manifest(m);
    if (b->hooks != NULL)
        printf("  model.so: ABI version %u;%s%s%s\n", PJSERVE_MODEL_ABI_VERSION,
               b->hooks->preprocess != NULL ? " pjserve_preprocess" : "",
               b->hooks->postprocess != NULL ? " pjserve_postprocess" : "",
               b->hooks->run != NULL ? " pjserve_run" : "");
    printf("  weights: %zu tensors, %llu bytes\n", b->weights.n_tensors,
           (unsigned long long)pjs_safetensors_total_bytes(&b->weights));
    int rc = 0;
    for (size_t v = 0; rc == 0 && v < m->n_variants; v++) {
        if (m->n_variants > 1)
            printf("  variant %s: %zu modules\n", m->variants[v].name, m->n_batch_sizes);
        rc = check_modules(b, pjs_bundle_module_at(b, v, 0), m->n_variants > 1 ? "    " : "  ",
                           rt, t);
    }
    for (size_t k = 0; rc == 0 && k < m->n_stages; k++) {
        const struct pjs_bundle_stage *st = &b->stages[k];
        printf("  swap-in stage %zu: takes %zu weights, copies %zu as its block; ", k,
               m->stages[k].n_weights, st->end - st->first);
        if (k + 1 < m->n_stages)
            printf("passes %zu tensors on\n", m->stages[k].n_outputs);
        else
            printf("returns the outputs\n");
        rc = check_modules(b, pjs_bundle_stage_module_at(b, k, 0), "    ", rt, t);
    }
    pjs_bundle_close(b);
}

int pjs_cmd_check(int argc, char **argv)
{
    pjs_cli_common common = {0};
    int rc = pjs_cli_parse_common_only("check", help, argc, argv, &common);
    if (rc != PJS_EXIT_OK)
        return rc < 0 ? PJS_EXIT_OK : rc;
    if (optind == argc)
        return pjs_cli_usage_error("check", "name at least one bundle directory");
    pjs_cli_runtime rt;
    rc = pjs_cli_start(&common, &rt);
    if (rc != PJS_EXIT_OK)
        return rc;
    tally t = {0};
    for (int i = optind; i < argc; i++)
        check_one(argv[i], &rt, &t);
    printf("modules: %d (compiled %d, from cache %d)\n", t.modules, t.compiled, t.cached);
    if (t.failed_bundles > 0)
        printf("%d of %d bundles failed\n", t.failed_bundles, argc - optind);
    pjs_cli_stop(&rt);
    return t.failed_bundles > 0 ? PJS_EXIT_FAILURE : PJS_EXIT_OK;
}
