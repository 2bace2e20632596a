/*
 * fuzz_config.c - libFuzzer driver for the server configuration file
 * (src/server/config.c, on src/core/yaml_strict.c).
 *
 * Applies arbitrary bytes over the defaults with pjs_server_config_parse and
 * frees the result, so crashes, sanitizer reports and leaks on any accept or
 * reject path surface. An accepted configuration must pass
 * pjs_server_config_check and name each model once; a rejected one must be
 * left as it was. The seed corpus is fuzz/corpus/fuzz_config/, replayed by
 * fuzz_config_replay in `make test`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pjs_server_config c;
    pjs_server_config_init(&c);
    pjs_error err;
    if (pjs_server_config_parse(&c, (const char *)data, size, "fuzz", &err) == 0) {
        if (pjs_server_config_check(&c, &err) != 0)
            abort();
        for (size_t i = 0; i < c.n_models; i++)
            for (size_t j = i + 1; j < c.n_models; j++)
                if (strcmp(c.models[i].name, c.models[j].name) == 0)
                    abort();
    } else if (c.n_models != 0 || err.msg[0] == '\0') {
        abort();
    }
    pjs_server_config_free(&c);
    return 0;
}
