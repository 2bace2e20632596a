/*
 * exec_cache.h - the on-disk cache of compiled executables.
 *
 * Compiling a module with XLA takes seconds; loading a serialized executable
 * takes milliseconds. An entry is keyed by SHA-256 over everything that
 * decides the compiled code: the module bytes, the compile options, the
 * platform name and version, the plugin's identity (API version, XLA
 * version, file size and modification time) and, on the CPU plugin, its
 * thread count (the compiler partitions loops by it). Entries live one per file
 * (<key hex>.pjx) and carry a magic, the key and a SHA-256 of the payload; an
 * entry that fails any check is reported, deleted and treated as a miss, never
 * trusted. Writes are atomic (temporary file + rename), so concurrent
 * processes sharing a directory see whole entries or none.
 */
#ifndef PJS_RUNTIME_EXEC_CACHE_H
#define PJS_RUNTIME_EXEC_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define PJS_EXEC_CACHE_KEY_SIZE 32

typedef struct pjs_exec_cache pjs_exec_cache;

/* The directory used when none is given: $PJSERVE_CACHE_DIR, else
 * $XDG_CACHE_HOME/pjserve, else $HOME/.cache/pjserve. */
int pjs_exec_cache_default_dir(char *out, size_t outsize, pjs_error *err);

/* Opens (creating if needed) a cache directory. */
int pjs_exec_cache_open(const char *dir, pjs_exec_cache **out, pjs_error *err);
void pjs_exec_cache_close(pjs_exec_cache *cache);
/* The cache a command uses: `dir`, else the default directory; NULL with
 * no_cache. A cache that cannot be opened is logged as a warning and left
 * out, since it only saves compile time. */
pjs_exec_cache *pjs_exec_cache_open_or_warn(const char *dir, bool no_cache);
const char *pjs_exec_cache_dir(const pjs_exec_cache *cache);

/* Incremental key building: feed every part, each length-prefixed. */
typedef struct pjs_exec_cache_key_builder pjs_exec_cache_key_builder;
pjs_exec_cache_key_builder *pjs_exec_cache_key_begin(void);
void pjs_exec_cache_key_add(pjs_exec_cache_key_builder *b, const void *data, size_t size);
void pjs_exec_cache_key_finish(pjs_exec_cache_key_builder *b,
                               unsigned char key[PJS_EXEC_CACHE_KEY_SIZE]);

/* Returns 1 and a malloc'd payload on a hit, 0 on a miss. A corrupt or
 * unreadable entry is logged, removed and reported as a miss. */
int pjs_exec_cache_lookup(pjs_exec_cache *cache, const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE],
                          void **out_payload, size_t *out_size);
/* Stores a payload; failures are returned (callers usually just log them). */
int pjs_exec_cache_store(pjs_exec_cache *cache, const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE],
                         const void *payload, size_t size, pjs_error *err);
/* Removes the entry for key (used when a hit turns out unusable). */
void pjs_exec_cache_evict(pjs_exec_cache *cache, const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE]);

#endif
