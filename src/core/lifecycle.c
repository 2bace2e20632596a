/*
 * lifecycle.c - names of control modes and model states (lifecycle.h).
 */
#include "core/lifecycle.h"

#include <string.h>

const char *pjs_control_mode_name(pjs_control_mode m)
{
    switch (m) {
    case PJS_CONTROL_STATIC: return "static";
    case PJS_CONTROL_EXPLICIT: return "explicit";
    default: return "dynamic";
    }
}

int pjs_control_mode_parse(const char *s)
{
    static const pjs_control_mode all[] = {PJS_CONTROL_DYNAMIC, PJS_CONTROL_STATIC,
                                           PJS_CONTROL_EXPLICIT};
    for (size_t i = 0; s != NULL && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, pjs_control_mode_name(all[i])) == 0)
            return (int)all[i];
    return -1;
}

const char *pjs_model_state_name(pjs_model_state st)
{
    switch (st) {
    case PJS_MODEL_READY: return "READY";
    case PJS_MODEL_LOADING: return "LOADING";
    default: return "UNAVAILABLE";
    }
}
