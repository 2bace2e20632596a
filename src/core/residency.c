/*
 * residency.c - the table of residencies (see residency.h).
 */
#include "core/residency.h"

#include <stddef.h>
#include <string.h>

const pjs_residency_info pjs_residencies[PJS_N_RESIDENCIES] = {
    {PJS_RESIDENCY_DEVICE, "device", 1, true, true,
     "pinned on the device, outside the device budget"},
    {PJS_RESIDENCY_HOST, "host", 2, true, false,
     "kept in host memory, on the device on demand"},
    {PJS_RESIDENCY_UNPINNED, "unpinned", 3, false, false,
     "no host copy: read from the bundle's file when uploaded"},
};

const pjs_residency_info *pjs_residency_info_of(pjs_residency r)
{
    for (size_t i = 0; i < PJS_N_RESIDENCIES; i++)
        if (pjs_residencies[i].residency == r)
            return &pjs_residencies[i];
    return NULL;
}

const char *pjs_residency_name(pjs_residency r)
{
    const pjs_residency_info *info = pjs_residency_info_of(r);
    return info != NULL ? info->name : "invalid";
}

bool pjs_residency_from_name(const char *name, pjs_residency *out)
{
    for (size_t i = 0; name != NULL && i < PJS_N_RESIDENCIES; i++) {
        if (strcmp(name, pjs_residencies[i].name) == 0) {
            *out = pjs_residencies[i].residency;
            return true;
        }
    }
    return false;
}

bool pjs_residency_from_wire(int wire, pjs_residency *out)
{
    for (size_t i = 0; i < PJS_N_RESIDENCIES; i++) {
        if (pjs_residencies[i].wire == wire) {
            *out = pjs_residencies[i].residency;
            return true;
        }
    }
    return false;
}

int pjs_residency_wire(pjs_residency r)
{
    const pjs_residency_info *info = pjs_residency_info_of(r);
    return info != NULL ? info->wire : 0;
}

bool pjs_residency_has_floor(pjs_residency r)
{
    const pjs_residency_info *info = pjs_residency_info_of(r);
    return info != NULL && info->has_floor;
}

bool pjs_residency_device_pinned(pjs_residency r)
{
    const pjs_residency_info *info = pjs_residency_info_of(r);
    return info != NULL && info->device_pinned;
}

const char *pjs_tier_name(pjs_tier t)
{
    static const char *const names[PJS_N_TIERS] = {"device", "host", "file"};
    return (unsigned)t < PJS_N_TIERS ? names[t] : "invalid";
}

const char *pjs_residency_choices(void)
{
    return "\"device\", \"host\" or \"unpinned\"";
}
