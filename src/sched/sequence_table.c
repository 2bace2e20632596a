/*
 * sequence_table.c - live sequences in a chained hash table keyed by
 * sequence_id (FNV-1a over the integer's bytes or the string), each with its
 * state bytes allocated behind it and a FIFO of waiting steps. The idle
 * sequences (nothing running or waiting) are also on a list in the order
 * their last step finished, oldest first, so expiry and eviction look only
 * at its head instead of scanning the table. Each client holding sequences
 * has a record in a second hash table (FNV-1a over its name) with its count
 * of live sequences and its own list of them idle, in the same order, so a
 * client at its cap finds its least recently used one at once; the record
 * is freed with its client's last sequence. Freed ids go to a ring of the
 * last PJS_SEQUENCE_RECENT, searched only to word the error of a step that
 * came too late.
 */
#include "sched/sequence_table.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum freed_reason {
    FREED_ENDED,
    FREED_EXPIRED,
    FREED_EVICTED,     /* for a new sequence of any client in a full table */
    FREED_EVICTED_OWN, /* for a new sequence of its client, at its cap */
} freed_reason;

typedef struct seq_client seq_client;

struct pjs_sequence {
    pjs_sequence_id id;
    seq_client *client;    /* who started it */
    bool running;          /* a step of it runs */
    bool ended;            /* a step with sequence_end was admitted, no start since */
    uint64_t last_used_ns; /* admission or finish of its latest step */
    pjs_sequence_step *waiting_head, *waiting_tail;
    pjs_sequence *bucket_next;
    bool on_idle_list; /* nothing runs or waits */
    pjs_sequence *idle_prev, *idle_next;
    pjs_sequence *client_idle_prev, *client_idle_next; /* on client->idle_* when on_idle_list */
    unsigned char state[]; /* state_bytes */
};

/* A client holding live sequences (live > 0; freed with the last one). */
struct seq_client {
    char name[PJS_SEQUENCE_CLIENT_MAX + 1];
    size_t live;
    pjs_sequence *idle_head, *idle_tail; /* its idle sequences, oldest finish first */
    seq_client *bucket_next;
};

typedef struct recent_id {
    pjs_sequence_id id;
    freed_reason reason;
    uint64_t idle_ns; /* FREED_EVICTED: how long it had been idle */
} recent_id;

struct pjs_sequence_table {
    char model[256];
    size_t state_bytes;
    unsigned char *initial; /* state_bytes */
    uint64_t idle_timeout_ns;
    size_t max_sequences;
    size_t max_per_client;
    uint64_t evict_after_idle_ns;
    size_t count;
    pjs_sequence *idle_head, *idle_tail; /* oldest finish first */
    size_t n_buckets; /* a power of two */
    pjs_sequence **buckets;
    seq_client **client_buckets; /* n_buckets of them: never more clients than sequences */
    recent_id recent[PJS_SEQUENCE_RECENT];
    size_t n_recent, recent_next;
};

const char *pjs_sequence_id_format(const pjs_sequence_id *id, char *buf, size_t size)
{
    if (id->is_string)
        snprintf(buf, size, "\"%s\"", id->string);
    else
        snprintf(buf, size, "%" PRIu64, id->number);
    return buf;
}

bool pjs_sequence_id_equal(const pjs_sequence_id *a, const pjs_sequence_id *b)
{
    if (a->is_string != b->is_string)
        return false;
    return a->is_string ? strcmp(a->string, b->string) == 0 : a->number == b->number;
}

static uint64_t id_hash(const pjs_sequence_id *id)
{
    uint64_t h = 1469598103934665603u;
    const unsigned char *p = id->is_string ? (const unsigned char *)id->string
                                           : (const unsigned char *)&id->number;
    size_t n = id->is_string ? strlen(id->string) : sizeof id->number;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211u;
    return h ^ (uint64_t)id->is_string;
}

static uint64_t name_hash(const char *name)
{
    uint64_t h = 1469598103934665603u;
    for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; p++)
        h = (h ^ *p) * 1099511628211u;
    return h;
}

pjs_sequence_table *pjs_sequence_table_create(const char *model, size_t state_bytes,
                                              const void *initial_state,
                                              uint64_t idle_timeout_ns, size_t max_sequences,
                                              size_t max_per_client,
                                              uint64_t evict_after_idle_ns)
{
    pjs_sequence_table *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    snprintf(t->model, sizeof t->model, "%s", model);
    t->state_bytes = state_bytes;
    t->idle_timeout_ns = idle_timeout_ns;
    t->max_sequences = max_sequences;
    t->max_per_client = max_per_client;
    t->evict_after_idle_ns = evict_after_idle_ns;
    t->n_buckets = 16;
    while (t->n_buckets < 2 * max_sequences && t->n_buckets < ((size_t)1 << 20))
        t->n_buckets *= 2;
    t->buckets = calloc(t->n_buckets, sizeof *t->buckets);
    t->client_buckets = calloc(t->n_buckets, sizeof *t->client_buckets);
    t->initial = calloc(1, state_bytes ? state_bytes : 1);
    if (t->buckets == NULL || t->client_buckets == NULL || t->initial == NULL) {
        pjs_sequence_table_destroy(t);
        return NULL;
    }
    if (initial_state != NULL && state_bytes > 0)
        memcpy(t->initial, initial_state, state_bytes);
    return t;
}

void pjs_sequence_table_destroy(pjs_sequence_table *t)
{
    if (t == NULL)
        return;
    for (size_t b = 0; t->buckets != NULL && b < t->n_buckets; b++) {
        pjs_sequence *s = t->buckets[b];
        while (s != NULL) {
            pjs_sequence *next = s->bucket_next;
            free(s);
            s = next;
        }
    }
    for (size_t b = 0; t->client_buckets != NULL && b < t->n_buckets; b++) {
        seq_client *c = t->client_buckets[b];
        while (c != NULL) {
            seq_client *next = c->bucket_next;
            free(c);
            c = next;
        }
    }
    free(t->buckets);
    free(t->client_buckets);
    free(t->initial);
    free(t);
}

static pjs_sequence **find_slot(pjs_sequence_table *t, const pjs_sequence_id *id)
{
    pjs_sequence **slot = &t->buckets[id_hash(id) & (t->n_buckets - 1)];
    while (*slot != NULL && !pjs_sequence_id_equal(&(*slot)->id, id))
        slot = &(*slot)->bucket_next;
    return slot;
}

/* The client's name as kept: "" for NULL, cut to PJS_SEQUENCE_CLIENT_MAX. */
static void client_name(const char *client, char name[PJS_SEQUENCE_CLIENT_MAX + 1])
{
    snprintf(name, PJS_SEQUENCE_CLIENT_MAX + 1, "%s", client != NULL ? client : "");
}

static seq_client **find_client(const pjs_sequence_table *t, const char *name)
{
    seq_client **slot = &t->client_buckets[name_hash(name) & (t->n_buckets - 1)];
    while (*slot != NULL && strcmp((*slot)->name, name) != 0)
        slot = &(*slot)->bucket_next;
    return slot;
}

/* Counts a new sequence to its client, making the record if there is none. */
static seq_client *client_join(pjs_sequence_table *t, const char *name)
{
    seq_client **slot = find_client(t, name);
    if (*slot == NULL) {
        if ((*slot = calloc(1, sizeof **slot)) == NULL)
            return NULL;
        snprintf((*slot)->name, sizeof (*slot)->name, "%s", name);
    }
    (*slot)->live++;
    return *slot;
}

static void client_leave(pjs_sequence_table *t, seq_client *c)
{
    if (--c->live > 0)
        return;
    seq_client **slot = find_client(t, c->name);
    *slot = c->bucket_next;
    free(c);
}

static void idle_append(pjs_sequence_table *t, pjs_sequence *s)
{
    s->on_idle_list = true;
    s->idle_next = NULL;
    s->idle_prev = t->idle_tail;
    if (t->idle_tail != NULL)
        t->idle_tail->idle_next = s;
    else
        t->idle_head = s;
    t->idle_tail = s;
    seq_client *c = s->client;
    s->client_idle_next = NULL;
    s->client_idle_prev = c->idle_tail;
    if (c->idle_tail != NULL)
        c->idle_tail->client_idle_next = s;
    else
        c->idle_head = s;
    c->idle_tail = s;
}

static void idle_remove(pjs_sequence_table *t, pjs_sequence *s)
{
    if (!s->on_idle_list)
        return;
    if (s->idle_prev != NULL)
        s->idle_prev->idle_next = s->idle_next;
    else
        t->idle_head = s->idle_next;
    if (s->idle_next != NULL)
        s->idle_next->idle_prev = s->idle_prev;
    else
        t->idle_tail = s->idle_prev;
    seq_client *c = s->client;
    if (s->client_idle_prev != NULL)
        s->client_idle_prev->client_idle_next = s->client_idle_next;
    else
        c->idle_head = s->client_idle_next;
    if (s->client_idle_next != NULL)
        s->client_idle_next->client_idle_prev = s->client_idle_prev;
    else
        c->idle_tail = s->client_idle_prev;
    s->on_idle_list = false;
    s->idle_prev = s->idle_next = NULL;
    s->client_idle_prev = s->client_idle_next = NULL;
}

/* How long s has been idle at now_ns (0 when the clock says it has not). */
static uint64_t idle_for(const pjs_sequence *s, uint64_t now_ns)
{
    return now_ns > s->last_used_ns ? now_ns - s->last_used_ns : 0;
}

static void remember_freed(pjs_sequence_table *t, const pjs_sequence_id *id, freed_reason why,
                           uint64_t idle_ns)
{
    t->recent[t->recent_next] = (recent_id){.id = *id, .reason = why, .idle_ns = idle_ns};
    t->recent_next = (t->recent_next + 1) % PJS_SEQUENCE_RECENT;
    if (t->n_recent < PJS_SEQUENCE_RECENT)
        t->n_recent++;
}

static void free_sequence(pjs_sequence_table *t, pjs_sequence *s, freed_reason why,
                          uint64_t idle_ns)
{
    pjs_sequence **slot = find_slot(t, &s->id);
    *slot = s->bucket_next;
    idle_remove(t, s);
    remember_freed(t, &s->id, why, idle_ns);
    client_leave(t, s->client);
    free(s);
    t->count--;
}

/* The error of a step without sequence_start on a sequence that is not
 * live: why it is not (ended, expired, or never seen among the recent). */
static int not_live(const pjs_sequence_table *t, const pjs_sequence_id *id, bool ending,
                    pjs_error *err)
{
    char name[PJS_SEQUENCE_ID_MAX + 8];
    pjs_sequence_id_format(id, name, sizeof name);
    const char *why = NULL;
    if (ending) {
        why = "it was ended by an earlier request with sequence_end";
    } else {
        for (size_t k = 1; k <= t->n_recent && why == NULL; k++) {
            const recent_id *r =
                &t->recent[(t->recent_next + PJS_SEQUENCE_RECENT - k) % PJS_SEQUENCE_RECENT];
            if (!pjs_sequence_id_equal(&r->id, id))
                continue;
            if (r->reason == FREED_EVICTED_OWN)
                return pjs_error_set(
                    err, PJS_ERR_INVALID_ARGUMENT,
                    "model %s: sequence %s is not active (it was evicted after %llu ms idle to "
                    "make room for a new sequence of the same client, which held %zu, the most "
                    "one client may (sequence.max_sequences_per_client)); end sequences with "
                    "sequence_end when done, send a sequence's steps less than %llu ms apart "
                    "(sequence.evict_after_idle_ms), and start it again with sequence_start set",
                    t->model, name, (unsigned long long)(r->idle_ns / 1000000u),
                    t->max_per_client, (unsigned long long)(t->evict_after_idle_ns / 1000000u));
            if (r->reason == FREED_EVICTED)
                return pjs_error_set(
                    err, PJS_ERR_INVALID_ARGUMENT,
                    "model %s: sequence %s is not active (it was evicted after %llu ms idle to "
                    "make room for a new sequence: the model's %zu-slot sequence table was "
                    "full); send a sequence's steps less than %llu ms apart "
                    "(sequence.evict_after_idle_ms) or raise the model's "
                    "sequence.max_sequences, and start it again with sequence_start set",
                    t->model, name, (unsigned long long)(r->idle_ns / 1000000u),
                    t->max_sequences, (unsigned long long)(t->evict_after_idle_ns / 1000000u));
            why = r->reason == FREED_ENDED
                      ? "it was ended by an earlier request with sequence_end"
                      : "it was freed after being idle longer than the model's "
                        "idle_timeout_ms";
        }
    }
    if (why == NULL)
        why = "no sequence with this id is live";
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "model %s: sequence %s is not active (%s); start a sequence with "
                         "sequence_start set on its first request",
                         t->model, name, why);
}

static void begin_run(pjs_sequence_table *t, pjs_sequence *s, pjs_sequence_step *step)
{
    s->running = true;
    if (step->start)
        memcpy(s->state, t->initial, t->state_bytes);
}

/* Frees client c's least recently used idle sequence for its new one if
 * it has been idle longer than the eviction floor; RESOURCE_EXHAUSTED
 * otherwise. */
static int make_room_for_client(pjs_sequence_table *t, seq_client *c, uint64_t now_ns,
                                pjs_sequence_eviction *evicted, pjs_error *err)
{
    pjs_sequence *lru = c->idle_head;
    if (lru == NULL || idle_for(lru, now_ns) <= t->evict_after_idle_ns)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "model %s: client %s holds %zu live sequences, the most one client "
                             "may (sequence.max_sequences_per_client), and each ran a step "
                             "within the last %llu ms (sequence.evict_after_idle_ms), so none "
                             "of them can be evicted for a new one; end sequences with "
                             "sequence_end before starting more, or raise the model's "
                             "sequence.max_sequences_per_client",
                             t->model, c->name[0] ? c->name : "(unnamed)", c->live,
                             (unsigned long long)(t->evict_after_idle_ns / 1000000u));
    uint64_t idle_ns = idle_for(lru, now_ns);
    if (evicted != NULL)
        *evicted = (pjs_sequence_eviction){
            .happened = true, .own = true, .id = lru->id, .idle_ns = idle_ns};
    free_sequence(t, lru, FREED_EVICTED_OWN, idle_ns);
    return 0;
}

/* Frees the least recently used idle sequence for a new one if it has been
 * idle longer than the eviction floor; UNAVAILABLE otherwise. */
static int make_room(pjs_sequence_table *t, uint64_t now_ns, pjs_sequence_eviction *evicted,
                     pjs_error *err)
{
    pjs_sequence *lru = t->idle_head;
    if (lru == NULL || idle_for(lru, now_ns) <= t->evict_after_idle_ns)
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                             "model %s: all %zu sequence slots are taken and every sequence ran "
                             "a step within the last %llu ms (sequence.evict_after_idle_ms), so "
                             "none can be evicted for a new one; retry later, end sequences "
                             "with sequence_end, or raise the model's sequence.max_sequences",
                             t->model, t->count,
                             (unsigned long long)(t->evict_after_idle_ns / 1000000u));
    uint64_t idle_ns = idle_for(lru, now_ns);
    if (evicted != NULL)
        *evicted = (pjs_sequence_eviction){.happened = true, .id = lru->id, .idle_ns = idle_ns};
    free_sequence(t, lru, FREED_EVICTED, idle_ns);
    return 0;
}

int pjs_sequence_admit(pjs_sequence_table *t, pjs_sequence_step *step, uint64_t now_ns,
                       bool *run_now, pjs_sequence_eviction *evicted, pjs_error *err)
{
    *run_now = false;
    step->next = NULL;
    step->sequence = NULL;
    if (evicted != NULL)
        evicted->happened = false;
    pjs_sequence *s = *find_slot(t, &step->id);
    if (s == NULL) {
        if (!step->start)
            return not_live(t, &step->id, false, err);
        char name[PJS_SEQUENCE_CLIENT_MAX + 1];
        client_name(step->client, name);
        seq_client *c = *find_client(t, name);
        /* A cap as large as the table leaves only the table's bound (the
         * client holding every slot evicts its own sequences there). */
        bool at_cap = c != NULL && c->live >= t->max_per_client &&
                      t->max_per_client < t->max_sequences;
        int rc = at_cap ? make_room_for_client(t, c, now_ns, evicted, err)
                 : t->count >= t->max_sequences ? make_room(t, now_ns, evicted, err)
                                                 : 0;
        if (rc != 0)
            return rc;
        s = calloc(1, sizeof *s + t->state_bytes);
        if (s == NULL || (s->client = client_join(t, name)) == NULL) {
            free(s);
            return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                                 "model %s: out of memory starting a sequence", t->model);
        }
        s->id = step->id;
        *find_slot(t, &step->id) = s; /* after make_room, which may unlink this chain's tail */
        t->count++;
    } else if (s->ended && !step->start) {
        return not_live(t, &step->id, true, err);
    }
    idle_remove(t, s);
    s->ended = step->end;
    s->last_used_ns = now_ns;
    step->sequence = s;
    if (s->running || s->waiting_head != NULL) {
        if (s->waiting_tail != NULL)
            s->waiting_tail->next = step;
        else
            s->waiting_head = step;
        s->waiting_tail = step;
        return 0;
    }
    begin_run(t, s, step);
    *run_now = true;
    return 0;
}

void *pjs_sequence_state(pjs_sequence_step *step)
{
    return step->sequence->state;
}

pjs_sequence_step *pjs_sequence_finish(pjs_sequence_table *t, pjs_sequence_step *step,
                                       uint64_t now_ns)
{
    pjs_sequence *s = step->sequence;
    s->running = false;
    s->last_used_ns = now_ns;
    pjs_sequence_step *next = s->waiting_head;
    if (next != NULL) {
        s->waiting_head = next->next;
        if (s->waiting_head == NULL)
            s->waiting_tail = NULL;
        next->next = NULL;
        begin_run(t, s, next);
        return next;
    }
    if (step->end && s->ended)
        free_sequence(t, s, FREED_ENDED, 0);
    else
        idle_append(t, s);
    return NULL;
}

size_t pjs_sequence_expire(pjs_sequence_table *t, uint64_t now_ns, pjs_sequence_id *expired,
                           size_t max)
{
    size_t freed = 0;
    while (t->idle_head != NULL && idle_for(t->idle_head, now_ns) > t->idle_timeout_ns) {
        if (freed < max)
            expired[freed] = t->idle_head->id;
        freed++;
        free_sequence(t, t->idle_head, FREED_EXPIRED, idle_for(t->idle_head, now_ns));
    }
    return freed;
}

size_t pjs_sequence_count(const pjs_sequence_table *t)
{
    return t->count;
}

size_t pjs_sequence_client_count(const pjs_sequence_table *t, const char *client)
{
    char name[PJS_SEQUENCE_CLIENT_MAX + 1];
    client_name(client, name);
    const seq_client *c = *find_client(t, name);
    return c != NULL ? c->live : 0;
}
