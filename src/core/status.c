/*
 * status.c - formatting of pjs_error messages (see status.h).
 */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void mark_truncated(char *msg, int written)
{
    if (written >= PJS_ERROR_MSG_MAX)
        memcpy(msg + PJS_ERROR_MSG_MAX - 4, "...", 4);
}

int pjs_error_set(pjs_error *err, pjs_status code, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    err->not_run = false;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    mark_truncated(err->msg, n);
    return code;
}

int pjs_error_prefix(pjs_error *err, const char *fmt, ...)
{
    if (err == NULL)
        return PJS_ERR_INTERNAL;
    char prefix[PJS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[PJS_ERROR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    int n = snprintf(err->msg, sizeof err->msg, "%s%s", prefix, old);
    mark_truncated(err->msg, n);
    return err->code;
}

int pjs_error_not_run(pjs_error *err)
{
    if (err == NULL)
        return PJS_ERR_INTERNAL;
    err->not_run = true;
    return err->code;
}

void pjs_error_clear(pjs_error *err)
{
    if (err == NULL)
        return;
    err->code = PJS_OK;
    err->not_run = false;
    err->msg[0] = '\0';
}

const char *pjs_status_name(int status)
{
    switch (status) {
    case PJS_OK: return "OK";
    case PJS_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case PJS_ERR_NOT_FOUND: return "NOT_FOUND";
    case PJS_ERR_IO: return "IO";
    case PJS_ERR_NOMEM: return "NOMEM";
    case PJS_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case PJS_ERR_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case PJS_ERR_RUNTIME: return "RUNTIME";
    case PJS_ERR_INTERNAL: return "INTERNAL";
    case PJS_ERR_UNAVAILABLE: return "UNAVAILABLE";
    case PJS_ERR_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case PJS_ERR_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case PJS_ERR_UNAUTHENTICATED: return "UNAUTHENTICATED";
    case PJS_ERR_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case PJS_ERR_DRAINING: return "UNAVAILABLE";
    }
    return "UNKNOWN";
}
