/*
 * log.c - timestamped log lines on stderr (see log.h).
 *
 * The message is formatted into a scratch buffer first, then copied into the
 * line with its control characters escaped, so one call writes exactly one
 * line. A message longer than the line is cut, never wrapped.
 */
#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_threshold = PJS_LOG_INFO;

void pjs_log_set_level(pjs_log_level level) { atomic_store(&log_threshold, (int)level); }
pjs_log_level pjs_log_get_level(void) { return (pjs_log_level)atomic_load(&log_threshold); }

int pjs_log_parse_level(const char *name)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

size_t pjs_log_escape(const char *in, size_t len, char *out, size_t size)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    if (size == 0)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        char esc[4];
        size_t k = 0;
        if (c >= 0x20 && c != 0x7f) {
            esc[k++] = (char)c;
        } else {
            esc[k++] = '\\';
            switch (c) {
            case '\n': esc[k++] = 'n'; break;
            case '\r': esc[k++] = 'r'; break;
            case '\t': esc[k++] = 't'; break;
            default:
                esc[k++] = 'x';
                esc[k++] = hex[c >> 4];
                esc[k++] = hex[c & 15];
            }
        }
        if (n + k >= size)
            break;
        memcpy(out + n, esc, k);
        n += k;
    }
    out[n] = '\0';
    return n;
}

void pjs_log(pjs_log_level level, const char *fmt, ...)
{
    if ((int)level < atomic_load(&log_threshold))
        return;
    static const char *tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
    char msg[2048], line[2048];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t msg_len = m < 0 ? 0 : (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof line - n, ".%03ldZ %s ", ts.tv_nsec / 1000000L,
                          tags[level & 3]);
    /* One byte stays free for the newline. */
    n += pjs_log_escape(msg, msg_len, line + n, sizeof line - n - 1);
    line[n++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, n);
    (void)ignored;
}

void pjs_log_limited(pjs_log_limiter *l, pjs_log_level level, const char *fmt, ...)
{
    if ((int)level < atomic_load(&log_threshold))
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    int64_t next = atomic_load(&l->next_ms);
    if (now < next || !atomic_compare_exchange_strong(&l->next_ms, &next, now + 1000)) {
        atomic_fetch_add(&l->dropped, 1);
        return;
    }
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint64_t dropped = atomic_exchange(&l->dropped, 0);
    /* Lines are only dropped after one was written, at next - 1000. */
    if (dropped > 0)
        pjs_log(level, "%s (%llu more like this in the last %.1f s)", msg,
                (unsigned long long)dropped, (double)(now - (next - 1000)) / 1000.0);
    else
        pjs_log(level, "%s", msg);
}

const char *pjs_format_bytes(uint64_t n, char *buf, size_t size)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (n < 1024) {
        snprintf(buf, size, "%llu B", (unsigned long long)n);
        return buf;
    }
    double v = (double)n / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof units / sizeof *units) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}
