/*
 * dispatch.h - the device's one dispatch thread and the completion threads.
 *
 * Accepted requests wait in the dispatcher's queue. The dispatch thread
 * takes one at a time (under the queue lock, which it never holds while
 * executing), executes it on the device and hands it to a pool of
 * completion threads, which call the request's on_done so encoding and
 * responding never delay the next execution.
 *
 * Which request runs next is decided in one function (dispatch.c,
 * take_next_locked): oldest first for now. The scheduler replaces that
 * choice and lets one execution serve several queued requests; the
 * submit / execute / complete hand-off stays as it is.
 */
#ifndef PJS_SCHED_DISPATCH_H
#define PJS_SCHED_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "core/infer.h"
#include "core/status.h"

typedef struct pjs_dispatcher pjs_dispatcher;

/* completion_threads and max_queue must be >= 1. */
int pjs_dispatcher_create(int completion_threads, size_t max_queue, pjs_dispatcher **out,
                          pjs_error *err);
/* Drains, then stops and joins every thread. */
void pjs_dispatcher_destroy(pjs_dispatcher *d);

/* Queues a validated request (r->model set, holding a reference). Errors:
 * UNAVAILABLE once draining, RESOURCE_EXHAUSTED when max_queue requests wait.
 * On success r->on_done is called exactly once, on a completion thread. */
int pjs_dispatcher_submit(pjs_dispatcher *d, pjs_infer_request *r, pjs_error *err);

/* Refuses new requests from now on and waits until every accepted one has
 * completed (its on_done returned). */
void pjs_dispatcher_drain(pjs_dispatcher *d);

void pjs_dispatcher_counters(pjs_dispatcher *d, uint64_t *queue_depth, uint64_t *in_flight);

/* Runs one request on the device: pads the batch to the smallest compiled
 * size that holds it, uploads the inputs, executes with the model's weights,
 * reads the outputs back and slices them to the request's rows. Fills
 * r->outputs, the timestamps and, on failure, r->error. Called by the
 * dispatch thread only. */
void pjs_execute_request(pjs_infer_request *r);

#endif
