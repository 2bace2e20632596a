/*
 * cpus.h - how many CPUs this process may run on: its affinity mask, which
 * taskset, a cpuset or a container's CPU set narrows, not the machine's
 * count. Thread pools sized by default (gRPC, HTTP, the CPU plugin) follow it.
 */
#ifndef PJS_CORE_CPUS_H
#define PJS_CORE_CPUS_H

/* The CPUs in this process's affinity mask; the online CPUs when the mask
 * cannot be read; at least 1. */
int pjs_cpus_schedulable(void);

#endif
