/*
 * sequence.h - requests to a stateful model (a manifest with `sequence:`;
 * see sequence.c for the path a request takes).
 */
#ifndef PJS_SERVER_SEQUENCE_H
#define PJS_SERVER_SEQUENCE_H

#include "core/infer.h"
#include "core/status.h"

struct pjs_server;

/* As pjs_server_submit, for a stateful r->model: r must name its sequence
 * (r->sequence.has_id) and carry one row of the client inputs. The
 * sequence's state joins the request as the model's state inputs when the
 * step runs; its steps run one at a time in arrival order. Errors are
 * INVALID_ARGUMENT (no sequence_id, a sequence that is not active, more
 * than one row, a string id longer than 127 bytes), RESOURCE_EXHAUSTED
 * (r->sequence.client holds as many live sequences as one client may) or
 * UNAVAILABLE (as many sequences live as the model keeps), returned; a
 * waiting step's failure to run is set in r->error. */
int pjs_sequence_submit(struct pjs_server *s, pjs_infer_request *r, pjs_error *err);

#endif
