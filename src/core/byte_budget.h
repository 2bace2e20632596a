/*
 * byte_budget.h - a bound on bytes held at once by untrusted work (request
 * bodies being received, decoded tensors waiting for the device).
 *
 * A front end takes bytes from the budget as they arrive and gives them back
 * when the request is answered; a take that would pass the limit fails and
 * the caller answers RESOURCE_EXHAUSTED / 429, so a crowd of large requests
 * cannot balloon the server. One lock-free counter; any thread may call.
 */
#ifndef PJS_CORE_BYTE_BUDGET_H
#define PJS_CORE_BYTE_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

typedef struct pjs_byte_budget {
    uint64_t limit;          /* 0: unlimited */
    _Atomic uint64_t used;   /* bytes taken and not given back */
    _Atomic uint64_t refused; /* takes refused since start */
} pjs_byte_budget;

void pjs_byte_budget_init(pjs_byte_budget *b, uint64_t limit);
/* Takes n bytes; false (and nothing taken) when used + n would pass the limit. */
bool pjs_byte_budget_take(pjs_byte_budget *b, uint64_t n);
/* Gives back n bytes taken before. */
void pjs_byte_budget_give(pjs_byte_budget *b, uint64_t n);
/* pjs_byte_budget_take, with a RESOURCE_EXHAUSTED error naming `what` and
 * the limit when refused. */
int pjs_byte_budget_take_or_fail(pjs_byte_budget *b, uint64_t n, const char *what,
                                 pjs_error *err);
uint64_t pjs_byte_budget_used(pjs_byte_budget *b);

#endif
