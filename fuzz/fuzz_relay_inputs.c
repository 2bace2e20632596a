/*
 * fuzz_relay_inputs.c - libFuzzer driver for what a relayed request brings
 * that the relay code reads: the client it names (src/frontend/client_id.c)
 * and the REST path the gateway classifies (src/gateway/relay_policy.c).
 *
 * Input: one selector byte (modulo 3) then the bytes:
 *   0  a `pjserve-client` value for pjs_client_id_parse: when taken, the id
 *      is NUL-terminated within PJS_CLIENT_ID_MAX, is "unix" or an address,
 *      and parsing it again gives itself;
 *   1  a gRPC peer string for pjs_client_id_of_grpc_peer: the id is
 *      NUL-terminated within PJS_CLIENT_ID_MAX and, when not empty, parses
 *      as itself;
 *   2  a method line and a path (split at the first NUL; the path split at
 *      '/' into at most 16 segments) for pjs_gw_op_of_rest: an operation of
 *      the table, and the model's segment index within the path or n.
 * Anything else aborts. Seeds: fuzz/corpus/fuzz_relay_inputs/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/client_id.h"
#include "gateway/relay_policy.h"

#define MAX_SEGMENTS 16

static void check_id(const char *id)
{
    if (memchr(id, '\0', PJS_CLIENT_ID_MAX) == NULL)
        abort();
    if (id[0] == '\0')
        return;
    char again[PJS_CLIENT_ID_MAX];
    if (!pjs_client_id_parse(id, strlen(id), again) || strcmp(again, id) != 0)
        abort();
}

static void rest(const char *text, size_t len)
{
    const char *nul = memchr(text, '\0', len);
    if (nul == NULL)
        return;
    const char *method = text;
    char *path = strndup(nul + 1, len - (size_t)(nul + 1 - text));
    if (path == NULL)
        return;
    const char *seg[MAX_SEGMENTS];
    size_t n = 0;
    for (char *s = path, *slash; n < MAX_SEGMENTS; s = slash + 1) {
        seg[n++] = s;
        if ((slash = strchr(s, '/')) == NULL)
            break;
        *slash = '\0';
    }
    size_t model_at = SIZE_MAX;
    const pjs_gw_op *op = pjs_gw_op_of_rest(method, seg, n, &model_at);
    if (op == NULL || op < pjs_gw_ops || op >= pjs_gw_ops + PJS_GW_N_OPS || model_at > n)
        abort();
    free(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned selector = data[0] % 3;
    char *text = malloc(size); /* the bytes after the selector, NUL-terminated */
    if (text == NULL)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char id[PJS_CLIENT_ID_MAX];
    memset(id, 'x', sizeof id);
    switch (selector) {
    case 0:
        if (pjs_client_id_parse(text, size - 1, id))
            check_id(id);
        break;
    case 1:
        pjs_client_id_of_grpc_peer(text, id);
        check_id(id);
        break;
    default: rest(text, size - 1); break;
    }
    free(text);
    return 0;
}
