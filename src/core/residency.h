/*
 * residency.h - where a model's weights live between executions: the one
 * table of residencies that the manifest, both control protocols, the
 * gateway, `pjserve top` and the dispatcher read (docs/residency.md).
 *
 * Weights sit in up to three tiers: the bundle's file (always), host
 * memory (the model's floor) and the device. A residency says which of
 * them a model keeps:
 *
 *   name       wire  floor in host memory                 device weights
 *   device     1     kept (pinned, outside a host budget)  kept, outside the budget
 *   host       2     kept; with a host budget, a cache     on demand, a cache
 *   unpinned   3     none: read from the file on upload    on demand, a cache
 *
 * "wire" is pjserve.control.v1.Residency's value.
 */
#ifndef PJS_CORE_RESIDENCY_H
#define PJS_CORE_RESIDENCY_H

#include <stdbool.h>

typedef enum pjs_residency {
    PJS_RESIDENCY_HOST = 0, /* the default */
    PJS_RESIDENCY_DEVICE = 1,
    PJS_RESIDENCY_UNPINNED = 2,
} pjs_residency;

#define PJS_N_RESIDENCIES 3

typedef struct pjs_residency_info {
    pjs_residency residency;
    const char *name;     /* the manifest's, REST's and top's word */
    int wire;             /* pjserve.control.v1.Residency */
    bool has_floor;       /* a floor in host memory (for host: while a host budget has room) */
    bool device_pinned;   /* its device weights are loaded once and kept */
    const char *meaning;  /* one line, for messages and help */
} pjs_residency_info;

/* Every residency, in wire order (device, host, unpinned). */
extern const pjs_residency_info pjs_residencies[PJS_N_RESIDENCIES];

const pjs_residency_info *pjs_residency_info_of(pjs_residency r);
/* "host", "device", "unpinned" ("invalid" for anything else). */
const char *pjs_residency_name(pjs_residency r);
/* By name or by wire value; false when none has it. */
bool pjs_residency_from_name(const char *name, pjs_residency *out);
bool pjs_residency_from_wire(int wire, pjs_residency *out);
/* Wire value of r (0, unspecified, for an invalid one). */
int pjs_residency_wire(pjs_residency r);
/* The table's columns for r (false for an invalid one). */
bool pjs_residency_has_floor(pjs_residency r);
bool pjs_residency_device_pinned(pjs_residency r);
/* The tier a request found its model's weights in when its execution was
 * planned: on the device, in host memory only, or in the bundle's file
 * only (read, then uploaded). */
typedef enum pjs_tier {
    PJS_TIER_DEVICE = 0,
    PJS_TIER_HOST = 1,
    PJS_TIER_FILE = 2,
} pjs_tier;

#define PJS_N_TIERS 3

/* "device", "host", "file". */
const char *pjs_tier_name(pjs_tier t);

/* The names, as `"device", "host" or "unpinned"`, for messages. */
const char *pjs_residency_choices(void);

#endif
