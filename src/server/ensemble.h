/*
 * ensemble.h - kind: ensemble models: declared steps run by the meta engine.
 *
 * An ensemble is a meta model whose orchestration is data: the manifest's
 * ensemble.steps (core/manifest.h), each calling a model with named
 * ensemble tensors and publishing some of its outputs under new names, as
 * Triton's ensemble_scheduling does. The manifest parse checked the graph
 * (one writer per tensor, no cycle, every read written); pjs_ensemble_check
 * checks the steps against the models they call when the ensemble loads;
 * pjs_ensemble_run is the ensemble's pjserve_run, called by meta.c on the
 * meta gate's thread in place of a model.so's.
 */
#ifndef PJS_SERVER_ENSEMBLE_H
#define PJS_SERVER_ENSEMBLE_H

#include <stddef.h>

#include "core/manifest.h"
#include "core/status.h"
#include "server/hook_ctx.h"

/* Checks ensemble `ens` against step_models[s], the manifest of the model
 * steps[s] calls (a plain model, loaded): versions the server serves, every
 * input of the model mapped and nothing else, output_map naming its
 * outputs, and each ensemble tensor's dtype, rank and fixed extents the same
 * where it is written and where it is read (client tensors included).
 * INVALID_ARGUMENT "manifest.yaml: ensemble.steps[s]...: what differs". */
int pjs_ensemble_check(const pjs_manifest *ens, const pjs_manifest *const *step_models,
                       pjs_error *err);

/* Runs the steps of ctx's ensemble on the client inputs in[], filling the
 * client output slots out[] (as a pjserve_run does): steps whose inputs are
 * all written are started together, then waited for, wave after wave, each
 * through pjserve_call_start with tensors passed by reference. A step that
 * fails stops the run with its status and a message naming the step. */
int pjs_ensemble_run(pjs_hook_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                     pjserve_tensor *out, size_t n_out);

#endif
