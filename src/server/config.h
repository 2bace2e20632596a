/*
 * config.h - the server's configuration: defaults, a YAML file, PJSERVE_*
 * environment variables and command-line flags, applied in that order (each
 * overrides the one before).
 *
 * The file holds the scheduler's settings and per-model policies:
 *
 *   scheduler:
 *     discipline: fair            # fair | fifo | edf
 *     half_life_ms: 1000
 *     coalesce_discount: 0.5
 *     fair_clamp: 4
 *     cost_smoothing: 0.2
 *     edf_laxity_margin_us: 0
 *     max_queue_depth: 1024
 *     default_timeout_us: 0       # 0: no deadline unless the request has one
 *     warmup_runs: 2
 *   models:
 *     mlp: {weight: 2, max_queue_depth: 64, default_timeout_us: 50000}
 *   meta:
 *     concurrency: 2              # meta models inside their stages at once
 *     scratch_bytes: 0            # reuse pool for meta scratch buffers; 0: none
 *
 * Every setting has one dotted key ("scheduler.half_life_ms",
 * "models.mlp.weight", "meta.concurrency") shared by the file, the
 * environment (PJSERVE_SCHEDULER_HALF_LIFE_MS, PJSERVE_META_CONCURRENCY;
 * model settings have no environment form) and pjs_server_config_set, which
 * the command line uses. Every key is
 * optional (an empty file or section sets nothing), and text from the
 * environment and flags is read by the file's rules, as a plain YAML scalar
 * (core/yaml_strict.h). Errors name the origin (file and line, variable, or
 * flag) and the key. docs/serving.md ("Configuration") documents each key.
 */
#ifndef PJS_SERVER_CONFIG_H
#define PJS_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "sched/policy.h"

/* Largest configuration file read. */
#define PJS_CONFIG_MAX_BYTES (1u << 20)
/* Largest max_queue_depth (requests per model). */
#define PJS_CONFIG_MAX_QUEUE_DEPTH (1 << 24)
/* Longest duration in microseconds (one day), for timeouts and margins. */
#define PJS_CONFIG_MAX_DURATION_US 86400000000LL
/* Most meta.concurrency permits (each is a thread). */
#define PJS_CONFIG_MAX_META_CONCURRENCY 1024
/* Largest meta.scratch_bytes (1Ti). */
#define PJS_CONFIG_MAX_SCRATCH_BYTES (1ULL << 40)

typedef struct pjs_model_policy {
    char *name;
    double weight;               /* > 0; 0: the manifest's weight */
    size_t max_queue_depth;      /* 0: scheduler.max_queue_depth */
    int64_t default_timeout_us;  /* -1: scheduler.default_timeout_us; 0: none */
} pjs_model_policy;

/* Meta models (server/meta_gate.h, server/scratch_pool.h). */
typedef struct pjs_meta_config {
    int concurrency;           /* gate permits, 1..PJS_CONFIG_MAX_META_CONCURRENCY */
    uint64_t scratch_bytes;    /* scratch pool budget; 0: no pool (plain memory) */
} pjs_meta_config;

typedef struct pjs_server_config {
    pjs_sched_config sched;
    size_t n_models;
    pjs_model_policy *models;
    pjs_meta_config meta;
} pjs_server_config;

/* The defaults (pjs_sched_config_defaults, no model policies, meta
 * concurrency PJS_DEFAULT_META_CONCURRENCY and no scratch pool). */
void pjs_server_config_init(pjs_server_config *c);
void pjs_server_config_free(pjs_server_config *c);

/* Applies a YAML file / bytes over c. Strict: unknown keys, duplicates,
 * anchors and aliases are errors. On error c is unchanged. */
int pjs_server_config_load_file(pjs_server_config *c, const char *path, pjs_error *err);
int pjs_server_config_parse(pjs_server_config *c, const char *yaml, size_t len,
                            const char *label, pjs_error *err);
/* Applies every PJSERVE_SCHEDULER_* and PJSERVE_META_* variable of envp
 * (NULL-terminated). An unknown variable with one of those prefixes is an
 * error; other PJSERVE_* variables are left alone. */
int pjs_server_config_apply_env(pjs_server_config *c, char *const *envp, pjs_error *err);
/* Sets one dotted key from text; `origin` ("--scheduler-discipline",
 * "PJSERVE_SCHEDULER_DISCIPLINE") starts the error message. */
int pjs_server_config_set(pjs_server_config *c, const char *key, const char *value,
                          const char *origin, pjs_error *err);
/* Checks the ranges of every setting (pjs_sched_config_check, the models'
 * and meta's). */
int pjs_server_config_check(const pjs_server_config *c, pjs_error *err);

/* The policy for model `name`, or NULL. */
const pjs_model_policy *pjs_server_config_model(const pjs_server_config *c, const char *name);

/* One log line of the scheduler settings ("scheduler: fair, half-life
 * 1000 ms, ..."), and one of a model policy's settings ("model policy mlp:
 * weight 2, max queue depth 64"); truncated to size. */
void pjs_server_config_describe(const pjs_server_config *c, char *buf, size_t size);
void pjs_model_policy_describe(const pjs_model_policy *p, char *buf, size_t size);
/* One log line of the meta settings ("meta models: 2 permits, ..."). */
void pjs_meta_config_describe(const pjs_meta_config *m, char *buf, size_t size);

/* Reads a byte count: decimal digits, optionally followed by K, M, G
 * (powers of 1000) or Ki, Mi, Gi (powers of 1024), optionally followed by B
 * ("64Mi", "64MiB", "1G", "4096"). False when text is not one or overflows. */
bool pjs_server_config_parse_bytes(const char *text, uint64_t *out);

#endif
