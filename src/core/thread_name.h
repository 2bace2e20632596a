/*
 * thread_name.h - names a thread for operators.
 *
 * Every thread of a process is called after its executable until named, so
 * `top -H`, `ps -L` and /proc/PID/task/TID/comm would show a dozen "pjserve"
 * threads; named, they show which one burns the CPU (pjs-grpc, pjs-device,
 * pjs-prefetch, ...). Linux keeps 15 bytes of a name: longer ones are cut,
 * never refused, and a failure to name changes nothing else.
 */
#ifndef PJS_CORE_THREAD_NAME_H
#define PJS_CORE_THREAD_NAME_H

#include <pthread.h>
#include <stdio.h>

static inline void pjs_thread_name(pthread_t thread, const char *name)
{
    char cut[16];
    snprintf(cut, sizeof cut, "%.15s", name);
    (void)pthread_setname_np(thread, cut);
}

#endif
