/*
 * log.h - operator-readable log lines on stderr.
 *
 * Format: "2026-11-21T16:40:02.123Z INFO  message". The threshold is one
 * atomic integer set at start-up (--log-level / PJSERVE_LOG_LEVEL); any thread
 * may log. Lines are written with one write(2) so they do not interleave.
 */
#ifndef PJS_CORE_LOG_H
#define PJS_CORE_LOG_H

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

/* A byte count for people: "512 B", "40.0 KiB", "1.5 GiB". Returns buf. */
const char *pjs_format_bytes(uint64_t n, char *buf, size_t size);

#define pjs_debug(...) pjs_log(PJS_LOG_DEBUG, __VA_ARGS__)
#define pjs_info(...) pjs_log(PJS_LOG_INFO, __VA_ARGS__)
#define pjs_warn(...) pjs_log(PJS_LOG_WARN, __VA_ARGS__)
#define pjs_error(...) pjs_log(PJS_LOG_ERROR, __VA_ARGS__)

#endif
