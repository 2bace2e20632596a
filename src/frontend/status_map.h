/*
 * status_map.h - the one place pjs_status becomes a gRPC or HTTP status.
 *
 * gRPC codes are the numeric values of grpc_status_code (so this header
 * needs no gRPC include); HTTP codes follow Triton's mapping.
 */
#ifndef PJS_FRONTEND_STATUS_MAP_H
#define PJS_FRONTEND_STATUS_MAP_H

#include "core/status.h"

/* How a worker's error answer tells a gateway that it is an answer: gRPC
 * trailing metadata (every error status pjserve sends itself) and an HTTP
 * header (refusals before anything ran). A status without the mark came
 * from the channel between (a connection that failed), whatever its text
 * says; a gateway never reads that text, which a client's model name can
 * fill. */
#define PJS_ANSWER_MARK "pjserve-answer"
#define PJS_ANSWER_ERROR "error"       /* a status pjserve decided */
#define PJS_ANSWER_NOT_RUN "not-run"   /* refused before anything ran (pjs_error.not_run):
                                          another worker may have the model */
#define PJS_ANSWER_DRAINING "draining" /* refused before anything ran: the server is going */

/* The mark of an error answer; NULL for the ones HTTP leaves unmarked. */
static inline const char *pjs_answer_mark(const pjs_error *err, bool plain_errors)
{
    if (err->code == PJS_ERR_DRAINING)
        return PJS_ANSWER_DRAINING;
    if (err->not_run)
        return PJS_ANSWER_NOT_RUN;
    return plain_errors ? PJS_ANSWER_ERROR : NULL;
}

static inline int pjs_status_to_grpc(int status)
{
    switch (status) {
    case PJS_OK: return 0;                       /* OK */
    case PJS_ERR_INVALID_ARGUMENT: return 3;     /* INVALID_ARGUMENT */
    case PJS_ERR_DEADLINE_EXCEEDED: return 4;    /* DEADLINE_EXCEEDED */
    case PJS_ERR_PERMISSION_DENIED: return 7;    /* PERMISSION_DENIED */
    case PJS_ERR_UNAUTHENTICATED: return 16;     /* UNAUTHENTICATED */
    case PJS_ERR_NOT_FOUND: return 5;            /* NOT_FOUND */
    case PJS_ERR_RESOURCE_EXHAUSTED: return 8;   /* RESOURCE_EXHAUSTED */
    case PJS_ERR_FAILED_PRECONDITION: return 9;  /* FAILED_PRECONDITION */
    case PJS_ERR_UNSUPPORTED: return 12;         /* UNIMPLEMENTED */
    case PJS_ERR_UNAVAILABLE:
    case PJS_ERR_DRAINING: return 14;            /* UNAVAILABLE */
    default: return 13;                          /* INTERNAL */
    }
}

static inline int pjs_status_to_http(int status)
{
    switch (status) {
    case PJS_OK: return 200;
    case PJS_ERR_INVALID_ARGUMENT: return 400;
    case PJS_ERR_UNSUPPORTED: return 501;        /* Not Implemented, as Triton */
    case PJS_ERR_FAILED_PRECONDITION: return 400;
    case PJS_ERR_UNAUTHENTICATED: return 401;
    case PJS_ERR_PERMISSION_DENIED: return 403;
    case PJS_ERR_NOT_FOUND: return 404;
    case PJS_ERR_RESOURCE_EXHAUSTED: return 429;
    case PJS_ERR_UNAVAILABLE:
    case PJS_ERR_DRAINING: return 503;
    case PJS_ERR_DEADLINE_EXCEEDED: return 504;
    default: return 500;
    }
}

#endif
