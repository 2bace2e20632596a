/*
 * control.h - the model control surface as both front ends serve it (gRPC
 * pjserve.control.v1.ModelControl, REST /v2/pjserve/...): snapshots of each
 * model's repository state, weight residency and scheduling policy, and the
 * checks of a requested policy change.
 *
 * The front ends decode a request into these plain structures, call the
 * functions here and in server.h, and encode the snapshots back
 * (frontend/grpc/control_codec.h, frontend/http/control_json.h), so both
 * protocols accept and refuse the same things with the same words. Any
 * thread.
 */
#ifndef PJS_SERVER_CONTROL_H
#define PJS_SERVER_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "server/config.h"
#include "server/server.h"

/* One model as the control surface reports it. */
typedef struct pjs_control_model {
    pjs_repository_entry entry;         /* name, state, reason */
    bool loaded;                        /* the fields below describe a loaded model;
                                           all zero when it is not loaded */
    pjs_model_residency_info residency;
    pjs_model_sched_info sched;         /* its policy (weight, max_queue_depth,
                                           default_timeout_us) and queue depth */
} pjs_control_model;

/* The models named (n > 0), in that order, or every entry of the
 * repository index (n == 0), sorted by name, into a malloc'd array the
 * caller frees. NOT_FOUND for a name the repository does not have. */
int pjs_control_models(pjs_server *s, const char *const *names, size_t n,
                       pjs_control_model **out, size_t *n_out, pjs_error *err);

/* One model (NOT_FOUND as pjs_control_models). */
int pjs_control_model_get(pjs_server *s, const char *name, pjs_control_model *out,
                          pjs_error *err);

/* A policy change as a request states it: each field is applied when its
 * has_ flag is set. */
typedef struct pjs_control_policy_change {
    bool has_weight;
    double weight;                /* finite, > 0 */
    bool has_max_queue_depth;
    int64_t max_queue_depth;      /* 1 .. PJS_CONFIG_MAX_QUEUE_DEPTH */
    bool has_default_timeout_us;
    int64_t default_timeout_us;   /* 0 (none) .. PJS_CONFIG_MAX_DURATION_US */
} pjs_control_policy_change;

/* The pjs_model_policy for pjs_server_set_model_policy that applies c (the
 * fields not given unset), after checking each given field against the
 * range the configuration file accepts. INVALID_ARGUMENT, naming model
 * `name` and the field, for a value out of range or a change of nothing. */
int pjs_control_policy(const char *name, const pjs_control_policy_change *c,
                       pjs_model_policy *out, pjs_error *err);

#endif
