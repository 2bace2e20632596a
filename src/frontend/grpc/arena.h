/*
 * arena.h - per-call memory for the gRPC front end.
 *
 * A call unpacks its request, converts typed tensor contents and builds its
 * response in one arena, and frees it all at once when the call ends. The
 * arena is also a ProtobufCAllocator, so protobuf-c unpacks straight into
 * it. Every arena has a hard limit on the bytes it hands out: a hostile
 * message cannot make one call take more than that.
 *
 * An arena belongs to one call and is used by one thread at a time.
 */
#ifndef PJS_FRONTEND_GRPC_ARENA_H
#define PJS_FRONTEND_GRPC_ARENA_H

#include <stdbool.h>
#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

typedef struct pjs_grpc_arena_block pjs_grpc_arena_block;

typedef struct pjs_grpc_arena {
    pjs_grpc_arena_block *blocks; /* newest first; the head is being filled */
    size_t used;                  /* bytes handed out from the head block */
    size_t total;                 /* bytes handed out in all, <= limit */
    size_t limit;
    bool exhausted;               /* an allocation was refused for the limit */
    ProtobufCAllocator allocator; /* allocates from this arena; free is a no-op */
} pjs_grpc_arena;

void pjs_grpc_arena_init(pjs_grpc_arena *a, size_t limit);
/* Frees every block; the arena can be used again afterwards. */
void pjs_grpc_arena_reset(pjs_grpc_arena *a);
/* Frees every block but one of the standard size, which the next
 * allocations fill again: an arena that serves one call after another
 * allocates nothing for small calls. pjs_grpc_arena_reset frees that one. */
void pjs_grpc_arena_rewind(pjs_grpc_arena *a);

/* n bytes aligned for any type, or NULL when out of memory or over the
 * limit (then `exhausted` tells which). */
void *pjs_grpc_arena_alloc(pjs_grpc_arena *a, size_t n);
/* Zeroed n * size bytes; NULL on overflow as well. */
void *pjs_grpc_arena_calloc(pjs_grpc_arena *a, size_t n, size_t size);
char *pjs_grpc_arena_strdup(pjs_grpc_arena *a, const char *s);

#endif
