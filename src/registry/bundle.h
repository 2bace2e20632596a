/*
 * bundle.h - a model bundle on disk, validated and compiled.
 *
 * Opening a bundle reads and cross-checks what needs no device: the manifest,
 * the safetensors header (mapped, not read), the presence of one module file
 * per (variant, compiled batch size): model.b<N>.mlir for the top-level
 * shapes, model.<variant>.b<N>.mlir for each manifest variant. Compiling then
 * builds (or loads from the executable cache) each module and checks its
 * signature against its variant's shapes and the weights (the same for every
 * variant): parameters are the weights in argument_order followed by the
 * inputs in manifest order, results are the outputs in manifest order, and
 * every batch axis has the module's batch size. Every rejection names the
 * bundle, the file and the field.
 *
 * A bundle with swap_in_stages has, besides, one module per (stage, batch
 * size), swap_in.s<k>.b<N>.mlir, whose signature is the stage's (see
 * core/manifest.h); opening resolves each stage's weight names and checks
 * that the weights a stage uses first follow the earlier stages' in
 * argument_order, so that each stage copies one contiguous run of them.
 *
 * A bundle with model.so (hooks, or a meta's run) has it loaded at open
 * (registry/hooks.h). A kind: meta bundle has no executable: opening it
 * reads the manifest and model.so only, and it has no weights or modules.
 *
 * Weights are read from weights.safetensors with positioned reads, never
 * through a memory map (a file truncated under a mapping raises SIGBUS).
 * The first read of each weight records a checksum of its bytes; once the
 * bundle is sealed (pjs_bundle_seal_weights, at model load, which reads the
 * weights not read yet) every later read must find the file unchanged
 * (pjs_safetensors_read) and the bytes matching their checksum, else it
 * fails with FAILED_PRECONDITION naming the file and asking for a reload:
 * weights that changed under a loaded model are refused, never served.
 *
 * A pjs_bundle is owned by one thread while opened, compiled and sealed,
 * and read-only afterwards.
 */
#ifndef PJS_REGISTRY_BUNDLE_H
#define PJS_REGISTRY_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/manifest.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "registry/hooks.h"
#include "runtime/exec_cache.h"
#include "runtime/runtime.h"

/* Longest bundle directory path accepted. */
#define PJS_BUNDLE_DIR_MAX 4096
/* Room for a module's path: the directory, "/model.", a variant name (at most
 * 128 characters), ".b65536.mlir". */
#define PJS_BUNDLE_PATH_MAX (PJS_BUNDLE_DIR_MAX + 192)

typedef struct pjs_bundle_module {
    size_t variant;          /* index into manifest.variants */
    int stage;               /* -1: the whole model; k: swap-in stage k */
    int64_t batch_size;
    char path[PJS_BUNDLE_PATH_MAX];
    pjs_rt_executable *exec; /* NULL until compiled */
    bool shared;             /* exec was already loaded for another model */
} pjs_bundle_module;

typedef struct pjs_bundle {
    char dir[PJS_BUNDLE_DIR_MAX];
    pjs_manifest manifest;
    pjs_safetensors weights;
    /* One per (variant, batch size), variant-major: see pjs_bundle_module_at. */
    size_t n_modules;
    pjs_bundle_module *modules;
    /* One per (swap-in stage, batch size), stage-major (see
     * pjs_bundle_stage_module_at); none without swap_in_stages. */
    size_t n_stage_modules;
    pjs_bundle_module *stage_modules;
    /* Per stage (manifest.n_stages): the weights its module takes, as
     * indices into weights.tensors, and the run [first, end) of weights it
     * is the first to use, which it copies to the device (the last stage's
     * run ends at the last weight). */
    struct pjs_bundle_stage {
        size_t *weights;
        size_t first, end;
    } *stages;
    /* Checksums of each weight's bytes (argument order), taken at the first
     * read; `summed[i]` once taken. After sealing, reads are checked. */
    uint64_t *weight_sums;
    bool *summed;
    bool sealed;
    /* model.so's entry points, or NULL when the bundle has none. */
    pjs_hooks *hooks;
} pjs_bundle;

/* The module of `variant` at manifest batch_sizes[size_index]. */
static inline pjs_bundle_module *pjs_bundle_module_at(const pjs_bundle *b, size_t variant,
                                                      size_t size_index)
{
    return &b->modules[variant * b->manifest.n_batch_sizes + size_index];
}

/* Swap-in stage k's module at manifest batch_sizes[size_index]. */
static inline pjs_bundle_module *pjs_bundle_stage_module_at(const pjs_bundle *b, size_t stage,
                                                            size_t size_index)
{
    return &b->stage_modules[stage * b->manifest.n_batch_sizes + size_index];
}

/* Reads and validates everything but the modules' contents. */
int pjs_bundle_open(const char *dir, pjs_bundle **out, pjs_error *err);
void pjs_bundle_close(pjs_bundle *b);

/* The module of `variant` compiled for batch_size, or NULL. */
pjs_bundle_module *pjs_bundle_module_for(pjs_bundle *b, size_t variant, int64_t batch_size);
/* The smallest compiled batch size >= n, or the largest when n exceeds all
 * (every variant has the same batch sizes). */
int64_t pjs_bundle_pick_batch_size(const pjs_bundle *b, int64_t n);

/* Compiles (or loads from the cache, which may be NULL) one module and checks
 * its signature. Already compiled modules are left as they are. */
int pjs_bundle_compile_module(pjs_bundle *b, pjs_bundle_module *m, pjs_rt_client *c,
                              pjs_exec_cache *cache, pjs_error *err);

/* Weight i (argument order) read from the file into 64-byte aligned host
 * memory (safetensors offsets need not be aligned); free() it. Checked as
 * the header comment says once the bundle is sealed. Only the thread that
 * owns the bundle may call it before sealing; any thread after. */
void *pjs_bundle_host_weight(pjs_bundle *b, size_t i, pjs_error *err);

/* Weight i's bytes read from the file into dst (its nbytes), checked as
 * pjs_bundle_host_weight's are. */
int pjs_bundle_read_weight(pjs_bundle *b, size_t i, void *dst, pjs_error *err);

/* Records the checksum of every weight not read yet (reading it in pieces
 * through a small buffer) and seals the bundle. */
int pjs_bundle_seal_weights(pjs_bundle *b, pjs_error *err);

/* Reads every weight i into host[i] (aligned, its tensor's size), checked as
 * pjs_bundle_read_weight, by `threads` threads (the caller's one of them;
 * at most 8), the largest weights first. The first failure is returned. */
int pjs_bundle_read_weights(pjs_bundle *b, void *const *host, size_t threads, pjs_error *err);
/* The threads worth reading b's weights with: 1 below 16 MiB of weights,
 * else a quarter of the CPUs the process may run on, at most 4 (the others
 * keep serving while a cold model is read). */
size_t pjs_bundle_read_threads(const pjs_bundle *b);

/* Copies every weight to the device in argument order into out[n_tensors],
 * from host[i] (aligned copies, e.g. a model's host floor: all the copies in
 * flight at once) or, when host is NULL, from the file through a temporary
 * aligned copy, one weight at a time (checked as pjs_bundle_host_weight).
 * On failure nothing is left allocated. */
int pjs_bundle_upload_weights(pjs_bundle *b, pjs_rt_client *c, void *const *host,
                              pjrt_buffer **out, pjs_error *err);

#endif
