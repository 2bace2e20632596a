/*
 * control_codec.h - the messages of pjserve.control.v1.ModelControl
 * (proto/pjserve_control.proto) from and to the control surface's plain
 * structures (server/control.h).
 *
 * Pure functions (no server, no gRPC): responses are built in the caller's
 * arena, strings copied into it. Any thread.
 */
#ifndef PJS_FRONTEND_GRPC_CONTROL_CODEC_H
#define PJS_FRONTEND_GRPC_CONTROL_CODEC_H

#include <stddef.h>

#include "core/manifest.h"
#include "core/status.h"
#include "frontend/grpc/arena.h"
#include "grpc_service.pb-c.h"
#include "pjserve_control.pb-c.h"
#include "server/control.h"
#include "server/server.h"
#include "trace/trace.h"

typedef Pjserve__Control__V1__ModelStatus pjs_grpc_model_status;
typedef Pjserve__Control__V1__ModelControlStatusResponse pjs_grpc_control_status_response;

/* One model: every field from m; residency RESIDENCY_UNSPECIFIED and the
 * loaded-model fields zero when it is not loaded. */
int pjs_grpc_control_model_status(const pjs_control_model *m, pjs_grpc_arena *a,
                                  pjs_grpc_model_status **out, pjs_error *err);

/* The control mode, the weight cache (budget 0 and unlimited when
 * cache->budget_bytes is UINT64_MAX) and models[0..n). */
int pjs_grpc_control_status(pjs_control_mode mode, const pjs_weight_cache_info *cache,
                            const pjs_control_model *models, size_t n, pjs_grpc_arena *a,
                            pjs_grpc_control_status_response **out, pjs_error *err);

/* A request's Residency value; INVALID_ARGUMENT, naming model `name`, for
 * RESIDENCY_UNSPECIFIED and for numbers the enum does not have. */
int pjs_grpc_control_residency(int value, const char *name, pjs_residency *out, pjs_error *err);

/* The fields a SetModelPolicyRequest sets (unchecked; see
 * pjs_control_policy). Integers above INT64_MAX read as INT64_MAX, which no
 * range accepts. */
void pjs_grpc_control_policy_change(const Pjserve__Control__V1__SetModelPolicyRequest *r,
                                    pjs_control_policy_change *out);

typedef Pjserve__Control__V1__NodeStatusResponse pjs_grpc_node_status_response;

/* The NodeStatus answer from the node's status document (the JSON of GET
 * /v2/pjserve/node, docs/node.md): INTERNAL, naming what is wrong, when
 * the document is not one. */
int pjs_grpc_node_status(const char *json, size_t len, pjs_grpc_arena *a,
                         pjs_grpc_node_status_response **out, pjs_error *err);

/* Applies a TraceSetting request's settings to t (trace/trace.h:
 * pjs_trace_settings_update; at most 16 settings). */
int pjs_grpc_trace_settings_update(pjs_tracer *t, const Inference__TraceSettingRequest *req,
                                   pjs_error *err);

#endif
