/*
 * host_memory.h - how much memory this process may use: the machine's
 * physical memory, or less where a cgroup limits it (a container's
 * --memory, systemd's MemoryMax=). Sizes a budget given as a percentage.
 */
#ifndef PJS_CORE_HOST_MEMORY_H
#define PJS_CORE_HOST_MEMORY_H

#include <stdint.h>

/* Bytes of memory available to the process: physical memory, or the
 * cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes) when lower.
 * 0 when neither can be read. */
uint64_t pjs_host_memory_bytes(void);

#endif
