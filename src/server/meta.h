/*
 * meta.h - meta models: a bundle's pjserve_run orchestrating sub-models.
 *
 * A request to a kind: meta model is checked against its client_inputs and
 * handed to the meta gate (server/meta_gate.h): it runs on a gate thread
 * holding one of --meta-concurrency permits (a compute-only meta, with empty
 * meta.calls, on a compute thread without one), never on a front end's
 * thread. Its sub-calls enter the local scheduler in-process with their
 * tensors passed by reference: the first one in flight as a committed
 * request (ahead of queued regular work; at most one per meta at a time),
 * others as ordinary requests, all carrying the meta's deadline. A call
 * started after that deadline fails DEADLINE_EXCEEDED, so the run stops at
 * the next stage boundary. A stage larger than the sub-model's largest
 * compiled batch size runs as several executions whose outputs are joined.
 * When the run returns, pjserve waits for every sub-call still in flight,
 * copies the outputs into the request and completes it; sub-call outputs
 * and scratch buffers live until then.
 */
#ifndef PJS_SERVER_META_H
#define PJS_SERVER_META_H

#include "core/infer.h"
#include "core/status.h"
#include "server/hook_ctx.h"

struct pjs_server;

/* Validates r against the meta's client tensors and queues its run; as
 * pjs_server_submit. */
int pjs_meta_submit(struct pjs_server *s, pjs_infer_request *r, pjs_error *err);

/* pjserve_call_start / pjserve_call_wait for the run owning ctx. */
int pjs_meta_call_start(pjs_hook_ctx *ctx, const char *model, const pjserve_tensor *in, size_t n,
                        pjserve_subcall **out);
int pjs_meta_call_wait(pjs_hook_ctx *ctx, pjserve_subcall *call, const pjserve_tensor **out,
                       size_t *n);

#endif
