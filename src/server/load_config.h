/*
 * load_config.h - a load's configuration override: the `config` parameter of
 * RepositoryModelLoad and POST /v2/repository/models/NAME/load, Triton's
 * ModelConfig as JSON (what tritonclient's load_model(config=...) sends).
 *
 * Two steps. pjs_load_config_parse reads the untrusted text strictly, as
 * protobuf's JSON mapping writes a ModelConfig (field names in snake_case
 * or lowerCamelCase, 64-bit integers as numbers or decimal strings, enums
 * by name) and refuses at once what pjserve cannot apply, naming every such
 * field. pjs_load_config_apply then checks the rest against the bundle
 * being loaded (its manifest, before anything compiles) and yields the
 * override: the served max_batch_size (a compiled batch size, or 0 for a
 * model without a batch axis), whether requests are coalesced (the
 * presence of dynamic_batching) and the model's queue policy
 * (default_queue_policy). Fields that only restate the model (name,
 * platform, backend, version_policy latest 1, inputs and outputs as
 * ModelConfig reports them) are accepted when they agree with it.
 *
 * Every refusal is INVALID_ARGUMENT with a message that starts "config
 * override" and names the model and the field. Pure functions of their
 * arguments; any thread.
 */
#ifndef PJS_SERVER_LOAD_CONFIG_H
#define PJS_SERVER_LOAD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/manifest.h"
#include "core/status.h"

/* Longest config text read. */
#define PJS_LOAD_CONFIG_MAX_BYTES (1u << 20)

/* A parsed config: the document (kept for pjs_load_config_apply) and the
 * values the parse checked. Opaque beyond these fields. */
typedef struct pjs_load_config pjs_load_config;

/* Parses `len` bytes of config JSON for model `model` (named in messages).
 * On success *out is the parsed config (free with pjs_load_config_free). */
int pjs_load_config_parse(const char *model, const char *text, size_t len,
                          pjs_load_config **out, pjs_error *err);
void pjs_load_config_free(pjs_load_config *c);
/* The text it was parsed from (NUL-terminated): equal texts, equal loads. */
const char *pjs_load_config_text(const pjs_load_config *c);

/* What a load with a config changes, against the bundle's own settings. */
typedef struct pjs_load_override {
    int64_t max_batch_size;     /* the served cap: a compiled batch size, 0 without a batch axis */
    size_t n_served_sizes;      /* executions use batch_sizes[0 .. n_served_sizes) */
    bool coalesce;              /* dynamic_batching given: requests are coalesced */
    int64_t default_timeout_us; /* -1: the configured one; 0: none */
    size_t max_queue_depth;     /* 0: the configured one */
} pjs_load_override;

/* Checks c against the manifest of the bundle being loaded as model `model`
 * (`platform` is what ModelConfig reports, "pjrt_cpu") and fills *out. */
int pjs_load_config_apply(const pjs_load_config *c, const char *model, const char *platform,
                          const pjs_manifest *man, pjs_load_override *out, pjs_error *err);

/* Load parameters other than `config`: a `file:` override (model files
 * sent in the request) is refused with UNSUPPORTED saying why, or IO
 * ("failed to poll from model repository", as Triton) when its path could
 * not name a file in a model directory; other keys are ignored (0), as
 * Triton's clients may send their own. */
int pjs_load_parameter_check(const char *model, const char *key, pjs_error *err);

#endif
