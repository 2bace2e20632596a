/*
 * log.h - operator-readable log lines on stderr.
 *
 * Format: "2026-11-21T16:40:02.123Z INFO  message". The threshold is one
 * atomic integer set at start-up (--log-level / PJSERVE_LOG_LEVEL); any thread
 * may log. Lines are written with one write(2) so they do not interleave.
 *
 * One line per call, whatever the arguments hold: the formatted message has
 * its control characters escaped (pjs_log_escape), so text that came from a
 * client (a model name, a URL) cannot start a forged line or steer the
 * terminal.
 */
#ifndef PJS_CORE_LOG_H
#define PJS_CORE_LOG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef enum pjs_log_level {
    PJS_LOG_DEBUG = 0,
    PJS_LOG_INFO = 1,
    PJS_LOG_WARN = 2,
    PJS_LOG_ERROR = 3,
} pjs_log_level;

void pjs_log_set_level(pjs_log_level level);
pjs_log_level pjs_log_get_level(void);
/* Parses "debug" | "info" | "warn" | "error"; returns -1 for anything else. */
int pjs_log_parse_level(const char *name);

void pjs_log(pjs_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Copies the len bytes of in to out (size bytes, NUL-terminated when size >
 * 0) with every control character written as an escape: \n, \r and \t by
 * name, the other bytes below 0x20 and 0x7f (DEL) as \xHH; everything else,
 * UTF-8 included, unchanged. Stops before an escape that would not fit
 * whole. Returns the bytes written, without the NUL. */
size_t pjs_log_escape(const char *in, size_t len, char *out, size_t size);

/* A bound on how often one source of lines may log: at most one line per
 * second gets written, the rest are counted and the next line written ends
 * with how many were dropped since the one before it, "(N more like this in
 * the last X s)". For any line a client, a traffic pattern or the system can
 * repeat at will (a full connection table, a model loaded on every request,
 * a worker retried), so it can never flood the log. One limiter per call
 * site, kept in the struct that owns that site's work (a model, a front
 * end). Zero-initialize; any thread may use it. */
typedef struct pjs_log_limiter {
    _Atomic int64_t next_ms;  /* monotonic time before which lines are dropped */
    _Atomic uint64_t dropped; /* lines dropped since the last one written */
} pjs_log_limiter;

void pjs_log_limited(pjs_log_limiter *l, pjs_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A byte count for people: "512 B", "40.0 KiB", "1.5 GiB". Returns buf. */
const char *pjs_format_bytes(uint64_t n, char *buf, size_t size);

#define pjs_debug(...) pjs_log(PJS_LOG_DEBUG, __VA_ARGS__)
#define pjs_info(...) pjs_log(PJS_LOG_INFO, __VA_ARGS__)
#define pjs_warn(...) pjs_log(PJS_LOG_WARN, __VA_ARGS__)
#define pjs_error(...) pjs_log(PJS_LOG_ERROR, __VA_ARGS__)

#endif
