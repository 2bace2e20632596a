/*
 * lifecycle.h - the names of the model lifecycle: who decides what is loaded
 * (the control mode) and where a repository entry stands (its state).
 *
 * In core so the codecs that write these names into protocol documents
 * (REST and gRPC model control, the repository index) link no server.
 */
#ifndef PJS_CORE_LIFECYCLE_H
#define PJS_CORE_LIFECYCLE_H

/* Who decides which models are loaded and resident (--model-control-mode). */
typedef enum pjs_control_mode {
    PJS_CONTROL_DYNAMIC = 0,  /* load at start, then follow the repository (watcher) */
    PJS_CONTROL_STATIC = 1,   /* load at start, never again on its own */
    PJS_CONTROL_EXPLICIT = 2, /* load at start with no device weights; a control plane pins */
} pjs_control_mode;

const char *pjs_control_mode_name(pjs_control_mode m); /* "dynamic", "static", "explicit" */
int pjs_control_mode_parse(const char *s);             /* -1 when unknown */

/* A bundle directory of the repository: its state. */
typedef enum pjs_model_state {
    PJS_MODEL_READY = 0,
    PJS_MODEL_UNAVAILABLE = 1, /* unloaded, or failed to load (reason says) */
    PJS_MODEL_LOADING = 2,
} pjs_model_state;

const char *pjs_model_state_name(pjs_model_state st); /* "READY", "UNAVAILABLE", "LOADING" */

#endif
