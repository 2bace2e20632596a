/*
 * hooked.h - requests to a model whose bundle has pre/post hooks (see
 * hooked.c for the path a request takes).
 */
#ifndef PJS_SERVER_HOOKED_H
#define PJS_SERVER_HOOKED_H

#include "core/infer.h"
#include "core/status.h"

struct pjs_server;

/* As pjs_server_submit, for r->model with hooks: client inputs checked
 * against client_inputs, preprocess on this thread, postprocess before
 * on_done. A hook's error is returned (preprocess) or set in r->error
 * (postprocess) with the hook's message. */
int pjs_hooked_submit(struct pjs_server *s, pjs_infer_request *r, pjs_error *err);

#endif
