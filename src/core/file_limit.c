/*
 * file_limit.c - raising RLIMIT_NOFILE and splitting it (see file_limit.h).
 * Called once by the main thread before any other thread starts.
 */
#include "core/file_limit.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/resource.h>

/* Used when the hard limit is unlimited and /proc says nothing. */
#define FILE_LIMIT_FALLBACK 1048576L

/* The kernel's ceiling on a process's descriptors (fs.nr_open). */
static long nr_open(void)
{
    long v = FILE_LIMIT_FALLBACK;
    FILE *fp = fopen("/proc/sys/fs/nr_open", "r");
    if (fp != NULL) {
        if (fscanf(fp, "%ld", &v) != 1 || v <= 0)
            v = FILE_LIMIT_FALLBACK;
        fclose(fp);
    }
    return v;
}

void pjs_file_limit_split(long soft, long *reserve, long *grpc_share)
{
    long r = soft / 8 < PJS_FILE_LIMIT_RESERVE ? soft / 8 : PJS_FILE_LIMIT_RESERVE;
    *reserve = r;
    *grpc_share = (soft - r) / 2;
}

void pjs_file_limit_raise(pjs_file_limit *out)
{
    struct rlimit rl;
    *out = (pjs_file_limit){0};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        out->set_errno = errno;
        rl.rlim_cur = rl.rlim_max = 1024;
    }
    rlim_t hard = rl.rlim_max == RLIM_INFINITY ? (rlim_t)nr_open() : rl.rlim_max;
    if (hard > INT_MAX)
        hard = INT_MAX;
    out->before = (long)(rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > hard ? hard : rl.rlim_cur);
    out->hard = (long)hard;
    out->soft = out->before;
    if ((rlim_t)out->before < hard) {
        struct rlimit want = {.rlim_cur = hard, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0) {
            out->soft = (long)hard;
            out->raised = true;
        } else {
            out->set_errno = errno;
        }
    }
    pjs_file_limit_split(out->soft, &out->reserve, &out->grpc_share);
}
