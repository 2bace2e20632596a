/*
 * sequence_table.h - the live sequences of one stateful model.
 *
 * A stateful model (a manifest with a `sequence:` section) is called in
 * sequences: a client's first request sets sequence_start, every request
 * carries the same sequence_id (an integer or a string), the last one sets
 * sequence_end. The table keeps, per live sequence, its state (a fixed
 * number of bytes: the model's state tensors, one row each) and orders its
 * steps: one step of a sequence runs at a time, later ones wait in arrival
 * order and are handed back, one by one, as the running step finishes.
 *
 * A step is admitted (pjs_sequence_admit), runs, and is finished
 * (pjs_sequence_finish). Admission refuses, with INVALID_ARGUMENT naming the
 * sequence id, a step of a sequence that is not live (never started, ended,
 * or freed after its idle timeout) unless it sets sequence_start; a step
 * with sequence_start on a live sequence starts it over from the initial
 * state once the steps before it have run. A sequence is freed when a step
 * with sequence_end finishes and nothing is waiting behind it, or by
 * pjs_sequence_expire once it has been idle (no step running or waiting)
 * for longer than the idle timeout.
 *
 * A full table makes room by eviction: a new sequence that finds every slot
 * taken frees the least recently used idle sequence, if that one has been
 * idle longer than the eviction floor (evict_after_idle_ns, well under the
 * idle timeout); when every sequence has run a step within the floor the
 * new one is refused UNAVAILABLE. So a client that starts sequences until
 * the table is full and leaves them there no longer locks everyone else out
 * until they expire: to keep a slot it must send that sequence a step at
 * least once per floor, and each such step is a full request the model
 * executes.
 *
 * Each client (the address the front end names in the step, see
 * frontend/client_id.h) may hold at most max_per_client live sequences:
 * the ones it started. A client at that cap that starts another sequence
 * frees its own least recently used idle sequence, under the same floor,
 * and is refused RESOURCE_EXHAUSTED when all of its sequences are fresher
 * than that; it never evicts another client's sequence to go past its cap.
 * So one client cannot hold more than its share of the table however fast
 * it steps its sequences, and the slots of everyone else's sequences are
 * taken by eviction only while the table is full, for a client under its
 * cap. A sequence started over (sequence_start on a live id) stays its
 * first client's. A cap of max_sequences is no cap: only the table's bound
 * applies (as before there were caps).
 *
 * The last ids freed are remembered so that a late step is told whether
 * its sequence ended, expired or was evicted (and how long it had been
 * idle).
 *
 * The table holds no lock and reads no clock: the caller serialises calls
 * and passes the monotonic time in nanoseconds (never going back from one
 * call to the next: idle sequences are kept in the order their last step
 * finished), so tests drive it with a virtual clock.
 */
#ifndef PJS_SCHED_SEQUENCE_TABLE_H
#define PJS_SCHED_SEQUENCE_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Longest string sequence_id accepted, in bytes (without the NUL). */
#define PJS_SEQUENCE_ID_MAX 127
/* Freed sequence ids remembered for the error a late step gets. */
#define PJS_SEQUENCE_RECENT 256

/* A sequence_id as sent: an integer (not 0) or a string (not ""). */
typedef struct pjs_sequence_id {
    bool is_string;
    uint64_t number;
    char string[PJS_SEQUENCE_ID_MAX + 1];
} pjs_sequence_id;

/* "42" or "\"abc\"" into buf (size >= PJS_SEQUENCE_ID_MAX + 3); returns buf. */
const char *pjs_sequence_id_format(const pjs_sequence_id *id, char *buf, size_t size);
bool pjs_sequence_id_equal(const pjs_sequence_id *a, const pjs_sequence_id *b);

typedef struct pjs_sequence pjs_sequence;

/* Longest client name kept, in bytes (without the NUL); longer ones are cut. */
#define PJS_SEQUENCE_CLIENT_MAX 63

/* One request of a sequence, embedded in whatever the caller queues. */
typedef struct pjs_sequence_step {
    pjs_sequence_id id;
    bool start;
    bool end;
    const char *client;            /* who sent it (a starting step is counted to it); NULL: "" */
    void *owner;                   /* the caller's request */
    pjs_sequence *sequence;        /* set by admission */
    struct pjs_sequence_step *next; /* the sequence's waiting steps */
} pjs_sequence_step;

typedef struct pjs_sequence_table pjs_sequence_table;

/* The sequence an admission evicted to make room, if any. */
typedef struct pjs_sequence_eviction {
    bool happened;
    bool own;         /* the starting client's own, at its cap; else the table was full */
    pjs_sequence_id id;
    uint64_t idle_ns; /* how long it had been idle */
} pjs_sequence_eviction;

/* A table for `model` (named in messages) whose sequences each hold
 * state_bytes of state, set to initial_state (copied; NULL: zeros) when a
 * sequence starts; idle_timeout_ns > 0; at most max_sequences live at once
 * and max_per_client (1..max_sequences) of one client, the least recently
 * used of them evicted for a new one once idle longer than
 * evict_after_idle_ns. NULL when out of memory. */
pjs_sequence_table *pjs_sequence_table_create(const char *model, size_t state_bytes,
                                              const void *initial_state,
                                              uint64_t idle_timeout_ns, size_t max_sequences,
                                              size_t max_per_client,
                                              uint64_t evict_after_idle_ns);
void pjs_sequence_table_destroy(pjs_sequence_table *t);

/* Admits step (id, start, end and owner set by the caller) at now_ns.
 * *run_now: true when the step may run at once (its sequence has no step
 * running or waiting); false when it waits, to be handed back by
 * pjs_sequence_finish. A step that starts a new sequence for a client at
 * its cap evicts that client's least recently used idle sequence, and one
 * in a full table the table's, when that one has been idle longer than the
 * eviction floor, and says which in *evicted (when not NULL; happened is
 * false otherwise). Errors: INVALID_ARGUMENT for a step without
 * sequence_start on a sequence that is not live (the message names the id
 * and says whether it ended, expired or was evicted), RESOURCE_EXHAUSTED
 * when the client holds max_per_client sequences and none has been idle
 * longer than the floor, UNAVAILABLE when the table is full and no sequence
 * has been idle longer than the floor. */
int pjs_sequence_admit(pjs_sequence_table *t, pjs_sequence_step *step, uint64_t now_ns,
                       bool *run_now, pjs_sequence_eviction *evicted, pjs_error *err);

/* The state a running step reads and replaces (state_bytes long): the
 * initial state for a step with sequence_start. */
void *pjs_sequence_state(pjs_sequence_step *step);

/* Marks the running step done at now_ns (whether it succeeded or not; the
 * caller wrote the new state into pjs_sequence_state on success). Returns
 * the sequence's next waiting step, now running (the caller runs it), or
 * NULL; frees the sequence when step ended it and nothing waits. */
pjs_sequence_step *pjs_sequence_finish(pjs_sequence_table *t, pjs_sequence_step *step,
                                       uint64_t now_ns);

/* Frees every sequence idle (nothing running or waiting) for longer than
 * the idle timeout at now_ns; their ids go to expired[] (up to max of
 * them, for logs). Returns how many were freed. */
size_t pjs_sequence_expire(pjs_sequence_table *t, uint64_t now_ns, pjs_sequence_id *expired,
                           size_t max);

/* Live sequences. */
size_t pjs_sequence_count(const pjs_sequence_table *t);
/* Live sequences started by `client` (NULL: ""). */
size_t pjs_sequence_client_count(const pjs_sequence_table *t, const char *client);

#endif
