/*
 * status.h - the one error convention of pjserve.
 *
 * Every fallible function returns 0 on success or a negative pjs_status, and
 * fills a caller-owned pjs_error with a message that says what failed and on
 * which model, file or field. Protocol layers map pjs_status to gRPC and HTTP
 * codes in one place; everything below them only produces statuses.
 *
 * A pjs_error is plain memory owned by the caller (usually on its stack); it is
 * never allocated, so setting one cannot fail. Any thread may use these helpers
 * on its own pjs_error.
 */
#ifndef PJS_CORE_STATUS_H
#define PJS_CORE_STATUS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum pjs_status {
    PJS_OK = 0,
    PJS_ERR_INVALID_ARGUMENT = -1,   /* the caller's input is wrong */
    PJS_ERR_NOT_FOUND = -2,          /* a named model, file or field is absent */
    PJS_ERR_IO = -3,                 /* the operating system refused a read/write */
    PJS_ERR_NOMEM = -4,              /* an allocation failed */
    PJS_ERR_UNSUPPORTED = -5,        /* valid, but not something we do */
    PJS_ERR_FAILED_PRECONDITION = -6,/* the system is not in a state to do it */
    PJS_ERR_RUNTIME = -7,            /* the PJRT plugin reported an error */
    PJS_ERR_INTERNAL = -8,           /* a bug: an invariant did not hold */
    PJS_ERR_UNAVAILABLE = -9,        /* try again later */
    PJS_ERR_RESOURCE_EXHAUSTED = -10,/* a bound was reached */
    PJS_ERR_DEADLINE_EXCEEDED = -11, /* the caller's deadline passed */
    PJS_ERR_UNAUTHENTICATED = -12,   /* a credential is required and was not given */
    PJS_ERR_PERMISSION_DENIED = -13, /* the credential given does not allow the call */
    PJS_ERR_DRAINING = -14,          /* shutting down: refused before anything ran, so
                                        another server may take it (UNAVAILABLE to clients) */
} pjs_status;

/* Longest message kept; longer ones are truncated with "...". */
#define PJS_ERROR_MSG_MAX 1024

typedef struct pjs_error {
    pjs_status code;
    /* The request was refused before anything of it ran, for a reason of
     * this server's (the model is not here): another server may take it.
     * Set by pjs_error_not_run, cleared by pjs_error_set. */
    bool not_run;
    char msg[PJS_ERROR_MSG_MAX];
} pjs_error;

/* Sets err (which may be NULL) to code and a printf-formatted message, and
 * returns code so callers can write `return pjs_error_set(err, ...)`. */
int pjs_error_set(pjs_error *err, pjs_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends a printf-formatted context ("bundle mlp: ") to err's message and
 * returns err's code. A NULL err is allowed and returns PJS_ERR_INTERNAL. */
int pjs_error_prefix(pjs_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Marks err's refusal as one before anything ran (see not_run) and returns
 * its code: `return pjs_error_not_run(err)` after pjs_error_set. */
int pjs_error_not_run(pjs_error *err);

/* Resets err to PJS_OK with an empty message. */
void pjs_error_clear(pjs_error *err);

/* A short, stable name of a status ("INVALID_ARGUMENT"). */
const char *pjs_status_name(int status);

#endif
