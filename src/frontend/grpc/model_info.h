/*
 * model_info.h - a model's manifest as ModelMetadataResponse and ModelConfig.
 *
 * Pure functions of the manifest (no server, no gRPC), built in the caller's
 * arena; strings borrow from the manifest, which must outlive the message.
 * Metadata shows the batch axis, and every extent that differs between the
 * model's variants, as -1; the config, like Triton's, leaves the batch axis
 * out of dims when the model batches (max_batch_size > 0), and reports
 * dynamic_batching (the compiled batch sizes up to max_batch_size as
 * preferred_batch_size) when the model's requests are coalesced
 * (sched/coalesce.h, unless a load's override turned it off).
 */
#ifndef PJS_FRONTEND_GRPC_MODEL_INFO_H
#define PJS_FRONTEND_GRPC_MODEL_INFO_H

#include <stdbool.h>
#include <stdint.h>

#include "core/manifest.h"
#include "core/status.h"
#include "frontend/grpc/arena.h"
#include "grpc_service.pb-c.h"

/* What the server knows of a model beyond its manifest. */
typedef struct pjs_grpc_model_desc {
    const char *name;       /* as clients address it */
    const char *version;    /* the one version served, "1" */
    const char *platform;   /* the server's PJRT platform, "cpu"; reported as "pjrt_cpu" */
    int64_t max_batch_size; /* 0 when no input is batched; a load's override may lower it */
    const pjs_manifest *manifest;
    bool batching_off;      /* a load's configuration override left dynamic_batching out */
} pjs_grpc_model_desc;

/* The KServe datatype's model-config enum value (TYPE_FP32 for f32). */
Inference__DataType pjs_grpc_config_dtype(pjs_dtype t);

int pjs_grpc_model_metadata(const pjs_grpc_model_desc *m, pjs_grpc_arena *a,
                            Inference__ModelMetadataResponse **out, pjs_error *err);
int pjs_grpc_model_config(const pjs_grpc_model_desc *m, pjs_grpc_arena *a,
                          Inference__ModelConfig **out, pjs_error *err);

#endif
