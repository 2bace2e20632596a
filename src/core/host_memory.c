/*
 * host_memory.c - the memory this process may use (see host_memory.h).
 */
#include "core/host_memory.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The number in a cgroup limit file, or UINT64_MAX ("max", unreadable). */
static uint64_t cgroup_limit(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return UINT64_MAX;
    char line[64] = "";
    bool read = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!read || strncmp(line, "max", 3) == 0)
        return UINT64_MAX;
    char *end;
    unsigned long long v = strtoull(line, &end, 10);
    return end == line || v == 0 ? UINT64_MAX : (uint64_t)v;
}

uint64_t pjs_host_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t physical = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    uint64_t limit = cgroup_limit("/sys/fs/cgroup/memory.max");
    uint64_t v1 = cgroup_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (v1 < limit)
        limit = v1;
    if (physical == 0)
        return limit == UINT64_MAX ? 0 : limit;
    return limit < physical ? limit : physical;
}
