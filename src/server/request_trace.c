/*
 * request_trace.c - the spans of one request, recorded when it is answered.
 *
 * A request keeps the monotonic times of its stages (pjs_infer_times) for
 * its metrics; a traced one turns them into spans once its answer is
 * encoded, so tracing adds nothing to the path of a request that is not
 * sampled and only this to one that is:
 *
 *   <protocol> <model>     SERVER, its own context (r->trace), received..end
 *     decode               received..queued
 *     queue                queued..exec_start           (executables)
 *     execute              exec_start..output_done, with the batch it rode in
 *       upload, compute, read back                      (the execution's phases)
 *     respond              output_done (or queued, or the postprocess hook's
 *                          end)..end
 *
 * A meta's or an ensemble's request has queue (for the meta gate) and run
 * in place of queue and execute; the run records its own stages
 * (server/meta.c): each sub-call is a span under the request, and each
 * part of it one queue and one execute span under the call
 * (pjs_server_trace_execution). Hooks add preprocess and postprocess
 * (server/hooked.c).
 */
#include "server/server.h"

#include <stdio.h>
#include <string.h>

#include "trace/trace.h"

void pjs_server_trace_start(pjs_server *s, pjs_infer_request *r, const char *traceparent,
                            size_t len)
{
    pjs_tracer *t = pjs_server_tracer(s);
    if (t == NULL) {
        memset(&r->trace, 0, sizeof r->trace);
        return;
    }
    pjs_trace_ctx incoming;
    bool given = traceparent != NULL && pjs_trace_parse(traceparent, len, &incoming);
    pjs_tracer_start(t, given ? &incoming : NULL, &r->trace);
}

/* A child span of parent from..to, when both times are known. */
static void stage(pjs_tracer *t, const pjs_trace_ctx *parent, const char *name, uint64_t from,
                  uint64_t to, pjs_span *out)
{
    if (from == 0 || to == 0)
        return;
    pjs_span_init(out, parent, PJS_SPAN_INTERNAL, name, from, to);
    pjs_tracer_emit(t, out);
}

static void execution(pjs_tracer *t, const pjs_trace_ctx *parent, const pjs_infer_request *r)
{
    const pjs_infer_times *tm = &r->times;
    if (tm->exec_start == 0)
        return;
    pjs_span s;
    stage(t, parent, "queue", tm->queued, tm->exec_start, &s);
    if (r->exec_batch_size == 0) { /* a meta's or an ensemble's run: its calls are its spans */
        stage(t, parent, "run", tm->exec_start, tm->output_done, &s);
        return;
    }
    pjs_span_init(&s, parent, PJS_SPAN_INTERNAL, "execute", tm->exec_start, tm->output_done);
    pjs_span_attr_str(&s, "pjserve.model", r->model->name);
    pjs_span_attr_int(&s, "pjserve.batch_rows", r->exec_rows);
    pjs_span_attr_int(&s, "pjserve.batch_size", r->exec_batch_size);
    pjs_span_attr_int(&s, "pjserve.batch_requests", (int64_t)r->exec_requests);
    pjs_span_attr_int(&s, "pjserve.request_rows", r->batch);
    pjs_tracer_emit(t, &s);
    pjs_trace_ctx exec = {.valid = true, .sampled = true};
    memcpy(exec.trace_id, s.trace_id, PJS_TRACE_ID_SIZE);
    memcpy(exec.span_id, s.span_id, PJS_SPAN_ID_SIZE);
    pjs_span phase;
    stage(t, &exec, "upload", tm->exec_start, tm->input_done, &phase);
    stage(t, &exec, "compute", tm->input_done, tm->infer_done, &phase);
    stage(t, &exec, "read back", tm->infer_done, tm->output_done, &phase);
}

void pjs_server_trace_execution(pjs_server *s, const pjs_trace_ctx *parent,
                                const pjs_infer_request *r)
{
    pjs_tracer *t = pjs_server_tracer(s);
    if (t != NULL && parent->sampled)
        execution(t, parent, r);
}

void pjs_server_trace_finish(pjs_server *s, const pjs_infer_request *r, const char *protocol,
                             uint64_t end_ns, const pjs_error *err)
{
    pjs_tracer *t = pjs_server_tracer(s);
    if (t == NULL || !r->trace.sampled)
        return;
    const pjs_infer_times *tm = &r->times;
    char name[PJS_SPAN_NAME_MAX];
    snprintf(name, sizeof name, "infer %.80s", r->model != NULL ? r->model->name : "?");
    pjs_span span;
    pjs_span_init_self(&span, &r->trace, PJS_SPAN_SERVER, name, tm->received, end_ns);
    if (r->model != NULL)
        pjs_span_attr_str(&span, "pjserve.model", r->model->name);
    pjs_span_attr_str(&span, "rpc.system", protocol);
    if (r->id != NULL && r->id[0] != '\0')
        pjs_span_attr_str(&span, "pjserve.request_id", r->id);
    pjs_span_attr_int(&span, "pjserve.request_rows", r->batch);
    if (err != NULL && err->code != PJS_OK)
        pjs_span_set_error(&span, err->msg);
    pjs_tracer_emit(t, &span);
    stage(t, &r->trace, "decode", tm->received, tm->queued, &span);
    execution(t, &r->trace, r);
    uint64_t answered = tm->hooks_done != 0    ? tm->hooks_done
                        : tm->output_done != 0 ? tm->output_done
                                               : tm->queued;
    stage(t, &r->trace, "respond", answered, end_ns, &span);
}
