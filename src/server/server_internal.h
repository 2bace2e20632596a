/*
 * server_internal.h - what the server's own files share beyond server.h:
 * the executable path of a request, internal model lookups, and the meta
 * gate and scratch pool the hooked and meta paths use.
 */
#ifndef PJS_SERVER_SERVER_INTERNAL_H
#define PJS_SERVER_SERVER_INTERNAL_H

#include <stdbool.h>

#include "core/infer.h"
#include "core/status.h"
#include "registry/model.h"
#include "server/meta_gate.h"
#include "server/scratch_pool.h"
#include "server/server.h"

struct pjs_server;

/* Validates r against its model's executable and queues it (committed:
 * ahead of the discipline, see pjs_server_submit_committed). */
int pjs__server_submit_executable(struct pjs_server *s, pjs_infer_request *r, bool committed,
                                  pjs_error *err);
/* The model `name` as a meta's sub-call sees it: internal models too. */
int pjs__server_get_internal_model(struct pjs_server *s, const char *name, pjs_model **out,
                                   pjs_error *err);
/* Makes r (an ordinary sub-call still queued) committed for `caller` when
 * the caller has no committed request in flight; false otherwise. */
bool pjs__server_promote(struct pjs_server *s, pjs_infer_request *r,
                         pjs_committed_caller *caller);
/* The gate a meta model's runs go to: decoupled compute-only metas have
 * threads of their own. */
pjs_meta_gate *pjs__server_meta_gate(struct pjs_server *s, const pjs_manifest *meta);
pjs_scratch_pool *pjs__server_scratch_pool(struct pjs_server *s);

#endif
