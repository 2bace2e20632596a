/*
 * cpus.c - the CPUs this process may run on (cpus.h).
 */
#include "core/cpus.h"

#include <sched.h>
#include <unistd.h>

int pjs_cpus_schedulable(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
