/*
 * route_key.h - what the gateway reads of a client's protobuf request to
 * route it: the model name (field 1 of every per-model KServe request) and,
 * for an inference request, its `sequence_id` parameter. Nothing else of
 * the message is decoded; tensors are skipped by their lengths.
 */
#ifndef PJS_GATEWAY_ROUTE_KEY_H
#define PJS_GATEWAY_ROUTE_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct pjs_gw_route_key {
    char model[256];    /* "" when the message names none */
    char sequence[128]; /* the sequence_id parameter as text; "" when absent */
} pjs_gw_route_key;

/* Reads the key of a message. `inference` also looks for the sequence_id
 * parameter (ModelInferRequest field 4). A message that is not well-formed
 * protobuf, or whose name does not fit, is INVALID_ARGUMENT. */
int pjs_gw_route_key_read(const uint8_t *msg, size_t len, bool inference, pjs_gw_route_key *out,
                          pjs_error *err);

#endif
