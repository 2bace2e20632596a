/*
 * evict_replay.c - replays recorded request traces through the weight
 * cache's eviction policies and prints their hit rates.
 *
 *   pjs_bench_evict_replay bench/results/residency_traces/N*_*pct.csv
 *
 * A trace is what bench/residency.py's curve part records: a CSV of
 * `t_s,thread,model`, the requests in the order the clients sent them, in a
 * file named N<models>_<budget>pct.csv. Every model of the benchmark has the
 * same size, so the budget holds models * budget / 100 of them (at least 1).
 * Each request acquires its model once, through the real pjs_wcache code
 * (src/sched/weight_cache.c) with callbacks that only count, and hits when
 * the model was resident. Next to lru and lfu, two references computed from
 * the whole trace: keeping the most requested models resident (the room's
 * worth, in hindsight), and Belady's policy (evict the resident model asked
 * for again furthest in the future), the best any policy can do when every
 * miss must load its model. What the server adds on top (coalescing, cold
 * deferral) is not modelled: requests are replayed one at a time.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/weight_cache.h"

#define MAX_MODELS 1024

typedef struct trace {
    char names[MAX_MODELS][64];
    int n_models;
    int *requests; /* model index per request */
    int n;
} trace;

static int model_index(trace *t, const char *name)
{
    for (int i = 0; i < t->n_models; i++)
        if (strcmp(t->names[i], name) == 0)
            return i;
    if (t->n_models == MAX_MODELS)
        return -1;
    snprintf(t->names[t->n_models], sizeof t->names[0], "%s", name);
    return t->n_models++;
}

static int read_trace(const char *path, trace *t)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    char line[256];
    int cap = 0, rc = 0;
    if (fgets(line, sizeof line, f) == NULL || strncmp(line, "t_s,thread,model", 16) != 0) {
        fprintf(stderr, "%s: not a trace (expected the header t_s,thread,model)\n", path);
        rc = -1;
    }
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        char *model = strrchr(line, ',');
        if (model == NULL) {
            fprintf(stderr, "%s: line %d has no model\n", path, t->n + 2);
            rc = -1;
            break;
        }
        model[strcspn(model, "\r\n")] = '\0';
        int m = model_index(t, model + 1);
        if (m < 0) {
            fprintf(stderr, "%s: more than %d models\n", path, MAX_MODELS);
            rc = -1;
            break;
        }
        if (t->n == cap) {
            cap = cap ? 2 * cap : 4096;
            int *grown = realloc(t->requests, (size_t)cap * sizeof *grown);
            if (grown == NULL) {
                rc = -1;
                break;
            }
            t->requests = grown;
        }
        t->requests[t->n++] = m;
    }
    fclose(f);
    return rc;
}

static int count_load(pjs_wcache_entry *e, void *ctx, pjs_error *err)
{
    (void)e;
    (void)err;
    (*(long *)ctx)++;
    return 0;
}

static void count_evict(pjs_wcache_entry *e, void *ctx)
{
    (void)e;
    (void)ctx;
}

static double replay_policy(const trace *t, int room, pjs_eviction policy)
{
    long loads = 0;
    pjs_wcache c;
    pjs_wcache_entry *e = calloc((size_t)t->n_models, sizeof *e);
    pjs_wcache_ops ops = {.load = count_load, .evict = count_evict, .ctx = &loads};
    pjs_wcache_init(&c, (uint64_t)room, true, policy, &ops);
    long hits = 0;
    for (int i = 0; i < t->n_models; i++)
        e[i].bytes = 1;
    for (int r = 0; r < t->n; r++) {
        pjs_wcache_entry *x = &e[t->requests[r]];
        bool over;
        pjs_error err;
        hits += x->resident;
        if (pjs_wcache_acquire(&c, x, 1, &over, &err) != 0) {
            fprintf(stderr, "replay: %s\n", err.msg);
            exit(1);
        }
    }
    pjs_wcache_destroy(&c);
    free(e);
    return (double)hits / t->n;
}

static int by_count_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

/* The share of requests to the `room` most requested models. */
static double most_requested(const trace *t, int room)
{
    long *count = calloc((size_t)t->n_models, sizeof *count);
    for (int r = 0; r < t->n; r++)
        count[t->requests[r]]++;
    qsort(count, (size_t)t->n_models, sizeof *count, by_count_desc);
    long top = 0;
    for (int i = 0; i < room && i < t->n_models; i++)
        top += count[i];
    free(count);
    return (double)top / t->n;
}

/* Belady: on a miss with no room, evict the resident model whose next
 * request comes last (or never). */
static double belady(const trace *t, int room)
{
    int *next = malloc((size_t)t->n * sizeof *next); /* next request of the same model */
    int *last = malloc((size_t)t->n_models * sizeof *last);
    bool *resident = calloc((size_t)t->n_models, sizeof *resident);
    int *upcoming = malloc((size_t)t->n_models * sizeof *upcoming);
    for (int i = 0; i < t->n_models; i++)
        last[i] = t->n;
    for (int r = t->n - 1; r >= 0; r--) {
        next[r] = last[t->requests[r]];
        last[t->requests[r]] = r;
    }
    int used = 0;
    long hits = 0;
    for (int r = 0; r < t->n; r++) {
        int m = t->requests[r];
        upcoming[m] = next[r];
        if (resident[m]) {
            hits++;
            continue;
        }
        if (used == room) {
            int victim = -1;
            for (int i = 0; i < t->n_models; i++)
                if (resident[i] && (victim < 0 || upcoming[i] > upcoming[victim]))
                    victim = i;
            resident[victim] = false;
            used--;
        }
        resident[m] = true;
        used++;
    }
    free(next);
    free(last);
    free(resident);
    free(upcoming);
    return (double)hits / t->n;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fprintf(stderr,
                "usage: %s TRACE.csv ...\n"
                "Replays request traces recorded by bench/residency.py (part curve, files\n"
                "N<models>_<budget>pct.csv) through the weight cache's eviction policies and\n"
                "prints hit rates per request: lru, lfu, the most requested models kept\n"
                "resident, and Belady's policy (the best possible when every miss loads).\n",
                argv[0]);
        return argc < 2 ? 2 : 0;
    }
    printf("| trace | models | room | requests | lru | lfu | most requested resident | "
           "Belady |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int a = 1; a < argc; a++) {
        const char *base = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
        int models = 0, pct = 0;
        if (sscanf(base, "N%d_%dpct.csv", &models, &pct) != 2 || models <= 0 || pct <= 0) {
            fprintf(stderr, "%s: the name must be N<models>_<budget>pct.csv\n", argv[a]);
            return 2;
        }
        trace *t = calloc(1, sizeof *t);
        if (t == NULL || read_trace(argv[a], t) != 0 || t->n == 0) {
            fprintf(stderr, "%s: no requests read\n", argv[a]);
            return 1;
        }
        int room = models * pct / 100 > 0 ? models * pct / 100 : 1;
        printf("| %s | %d | %d | %d | %.3f | %.3f | %.3f | %.3f |\n", base, models, room, t->n,
               replay_policy(t, room, PJS_EVICTION_LRU), replay_policy(t, room, PJS_EVICTION_LFU),
               most_requested(t, room), belady(t, room));
        free(t->requests);
        free(t);
    }
    return 0;
}
