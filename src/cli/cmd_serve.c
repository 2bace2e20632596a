/*
 * cmd_serve.c - `pjserve serve`: load a model repository and serve it over
 * KServe V2 gRPC and HTTP/REST, with Prometheus metrics, until SIGINT or
 * SIGTERM.
 *
 * SIGINT and SIGTERM are blocked before any thread starts, so every thread
 * inherits the mask and the main thread alone receives them with sigwait.
 * Shutdown: the server stops admitting requests and waits for every accepted
 * one to be answered, then the front ends close, then the models go.
 *
 * The scheduler's and meta models' configuration is built after the command
 * line is read: defaults, then --config FILE, then PJSERVE_SCHEDULER_* and
 * PJSERVE_META_* variables, then their flags in the order given
 * (server/config.h), so a flag wins wherever it stands on the command line.
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/endpoint.h"
#include "core/file_limit.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "frontend/grpc/grpc_frontend.h"
#include "frontend/http/http_frontend.h"
#include "server/config.h"
#include "server/server.h"

static const char help[] =
    "usage: pjserve serve --model-repository DIR [OPTIONS]\n"
    "\n"
    "Loads and compiles every bundle directory in DIR, then serves them over the\n"
    "KServe V2 protocol on gRPC and HTTP/REST at once, with Prometheus metrics.\n"
    "A bundle that fails to load is reported and left out; the others serve.\n"
    "By default pjserve then follows DIR: bundles added, changed or removed there\n"
    "are loaded, reloaded or dropped while the others keep serving.\n"
    "SIGINT or SIGTERM stops accepting requests, answers every accepted one, and\n"
    "exits 0. Triton clients (tritonclient, perf_analyzer) work unchanged.\n"
    "\n"
    "options:\n"
    "  --model-repository DIR  directory of model bundles (required)\n"
    "  --allow-client-shm      let clients register system and CUDA shared memory\n"
    "                          regions (off by default: a client could point the\n"
    "                          server at any shared memory object it can name)\n"
    "  --max-shm-regions N     shared memory regions registered at once, 1 to 65536;\n"
    "                          more are refused with RESOURCE_EXHAUSTED / 429\n"
    "                          (default 1024)\n"
    "  --max-shm-bytes BYTES   total byte_size of the regions registered at once,\n"
    "                          with a suffix as --device-weight-budget (default 64Gi)\n"
    "  --server-name NAME      the name server metadata reports (GET /v2, gRPC\n"
    "                          ServerMetadata; default pjserve): `triton` for clients\n"
    "                          that check for Triton's; letters, digits, . _ -, at\n"
    "                          most 64\n"
    "  --node-status-file FILE answer GET /v2/pjserve/node and NodeStatus with this\n"
    "                          JSON file (set by pjserve node for its worker;\n"
    "                          default: 404 / NOT_FOUND)\n"
    "\n"
    PJS_CLI_ENDPOINT_HELP
    "\n"
    "model lifecycle (docs/serving.md, section Model lifecycle):\n"
    "  --model-control-mode dynamic|static|explicit  (default dynamic)\n"
    "                          dynamic: follow the repository; a bundle added,\n"
    "                          changed or removed is loaded, reloaded (requests in\n"
    "                          flight finish on the old version; a new version that\n"
    "                          fails to load leaves the old one serving) or dropped\n"
    "                          once seen unchanged on two scans in a row.\n"
    "                          static: load the repository once at start-up.\n"
    "                          explicit: load once, and never load or evict device\n"
    "                          weights on its own: a control plane pins models with\n"
    "                          the ModelControl gRPC service or the REST control\n"
    "                          endpoints; requests for a model whose weights are not\n"
    "                          on the device fail with FAILED_PRECONDITION\n"
    "  --repository-poll-ms MS dynamic: scan the repository every MS milliseconds\n"
    "                          (default 1000)\n"
    "  --repository-watch self|external  dynamic: who scans the repository. self\n"
    "                          (default): this process. external: another process\n"
    "                          applies its changes through the repository API (what\n"
    "                          pjserve node gives its workers: the node watches once\n"
    "                          for all of them)\n"
    "  --max-pending-loads N   model loads (API or repository changes) that may wait\n"
    "                          for the load thread at once, 1 to 4096; loads run one\n"
    "                          at a time off the request threads, a second request\n"
    "                          for a model waiting joins it, more are refused with\n"
    "                          RESOURCE_EXHAUSTED / 429 (default 64)\n"
    "  --device-weight-budget BYTES  device memory for model weights, in bytes or\n"
    "                          with a suffix K, M, G (powers of 1000) or Ki, Mi, Gi\n"
    "                          (powers of 1024), optionally then B (64MiB); 0:\n"
    "                          --weight-fraction of the device's memory, unlimited\n"
    "                          when the device reports none (the CPU plugin)\n"
    "                          (default 0)\n"
    "  --host-weight-budget BYTES|P%  host memory for the weights of models whose\n"
    "                          residency is host, in bytes (suffixes as\n"
    "                          --device-weight-budget) or a percentage of the\n"
    "                          memory this process may use: their floors are then\n"
    "                          read from their files when they are uploaded and\n"
    "                          evicted by --eviction-policy under this budget\n"
    "                          (default: none, every floor kept for its model's\n"
    "                          life; docs/residency.md)\n"
    "  --metrics-models N|all  models with series of their own in /metrics: past N,\n"
    "                          those with requests in flight, then on the device,\n"
    "                          then the most used; every model is still counted in\n"
    "                          the pjserve_all_models_* totals (default 1000)\n"
    "  --weight-fraction X     share of the device's memory for weights when no\n"
    "                          budget is given, 0 < X <= 1 (default 0.8)\n"
    "  --shared-weights DIR    share one host copy of each bundle's weights with\n"
    "                          the other workers of this machine through segments\n"
    "                          in DIR, a directory on a tmpfs (e.g.\n"
    "                          /dev/shm/pjserve-NODE; created 0700 when missing;\n"
    "                          a symbolic link, another user's directory or one\n"
    "                          others may write is refused; `pjserve node\n"
    "                          --shared-weights auto` makes a private one);\n"
    "                          segments nobody maps are removed\n"
    "                          (docs/shared-weights.md) (default: private)\n"
    "  --shared-weights-group GROUP  segments mode 0660 and of GROUP, for workers\n"
    "                          running as different users (default: 0600)\n"
    "\n"
    "scheduler: each setting comes from its default, then --config FILE, then its\n"
    "environment variable [in brackets], then its flag; later ones win. The file\n"
    "format and every key: docs/serving.md, section Configuration.\n"
    "  --config FILE           YAML file of scheduler settings and per-model policies\n"
    "  --scheduler-discipline fair|fifo|edf  (default fair)\n"
    "                          fair: weighted shares of recent device time; fifo:\n"
    "                          global arrival order; edf: earliest deadline first,\n"
    "                          shedding requests predicted to miss it\n"
    "                          [PJSERVE_SCHEDULER_DISCIPLINE]\n"
    "  --scheduler-half-life-ms MS  fair: half-life of the recent device time that\n"
    "                          shares are measured on (default 1000)\n"
    "                          [PJSERVE_SCHEDULER_HALF_LIFE_MS]\n"
    "  --coalesce-discount X   fair: how much cheaper a batched execution counts,\n"
    "                          from 0 (cost per execution) to 1 (per row)\n"
    "                          (default 0.5)\n"
    "                          [PJSERVE_SCHEDULER_COALESCE_DISCOUNT]\n"
    "  --fair-clamp X          fair: bound on a model's score, >= 1 (default 4)\n"
    "                          [PJSERVE_SCHEDULER_FAIR_CLAMP]\n"
    "  --cost-smoothing X      weight of a new execution-time measurement in the cost\n"
    "                          estimates, in (0, 1] (default 0.2)\n"
    "                          [PJSERVE_SCHEDULER_COST_SMOOTHING]\n"
    "  --edf-laxity-margin-us US  edf: shed a request when now + measured cost +\n"
    "                          margin passes its deadline (default 0)\n"
    "                          [PJSERVE_SCHEDULER_EDF_LAXITY_MARGIN_US]\n"
    "  --max-queue-depth N     requests one model may queue; more are refused with\n"
    "                          RESOURCE_EXHAUSTED / 429 (default 1024)\n"
    "                          [PJSERVE_SCHEDULER_MAX_QUEUE_DEPTH]\n"
    "  --default-timeout-us US deadline of requests that carry none; 0: none\n"
    "                          (default 0) [PJSERVE_SCHEDULER_DEFAULT_TIMEOUT_US]\n"
    "  --warmup-runs N         executions per variant and batch size at load, to\n"
    "                          measure costs, 0..100 (default 2); a model whose\n"
    "                          modules an earlier model ran takes its costs\n"
    "                          [PJSERVE_SCHEDULER_WARMUP_RUNS]\n"
    "  --cold-model-defer-ms MS  how long requests for a model whose weights are not\n"
    "                          on the device may wait while resident models have\n"
    "                          work, so one load serves more of them; never past a\n"
    "                          deadline; 0: off (default 10)\n"
    "                          [PJSERVE_SCHEDULER_COLD_MODEL_DEFER_MS]\n"
    "  --eviction-policy lfu|lru  which resident model's weights leave the device\n"
    "                          when another must load: lfu the one least used\n"
    "                          lately (uses decaying over 4096 requests) per what\n"
    "                          reloading it costs per byte; lru the least recently\n"
    "                          used (default lfu)\n"
    "                          [PJSERVE_SCHEDULER_EVICTION_POLICY]\n"
    "  --weight-prefetch true|false  while a model executes, copy the weights of the\n"
    "                          cold model that runs next (default true)\n"
    "                          [PJSERVE_SCHEDULER_WEIGHT_PREFETCH]\n"
    "  --hand-off on|off       when an execution ends and more work waits: on\n"
    "                          (default), a dispatcher thread is woken to run the\n"
    "                          next one while this one's requests are answered;\n"
    "                          off, the same thread answers, then runs it (a\n"
    "                          wake-up less per execution)\n"
    "                          [PJSERVE_SCHEDULER_HAND_OFF]\n"
    "  --model-weight NAME=W   fair-share weight of model NAME (default: its\n"
    "                          manifest's weight); repeatable; no environment form\n"
    "\n"
    "meta models (docs/serving.md, section Meta models); set like the scheduler's\n"
    "settings (file section meta, [variable], flag):\n"
    "  --meta-concurrency N    meta models (kind meta) that may run their stages at\n"
    "                          once, 1 to 1024. Each holds one of N permits for its\n"
    "                          whole run; the others wait, in arrival order, and one\n"
    "                          still waiting at its deadline is answered\n"
    "                          DEADLINE_EXCEEDED. Metas that call no sub-model take\n"
    "                          no permit (default 2) [PJSERVE_META_CONCURRENCY]\n"
    "  --meta-scratch-bytes BYTES  memory for the reuse buffers meta models take\n"
    "                          with pjserve_scratch, shared by every meta running, so\n"
    "                          size it for --meta-concurrency of them; suffixes as\n"
    "                          --device-weight-budget (256Mi). A meta waits for room\n"
    "                          until its deadline; one asking more than the whole\n"
    "                          pool is refused. 0: no pool, scratch buffers are plain\n"
    "                          heap memory (default 0) [PJSERVE_META_SCRATCH_BYTES]\n"
    "\n"
    "common:\n" PJS_CLI_COMMON_HELP
    "\n"
    "example:\n"
    "  make models && pjserve serve --model-repository models\n"
    "  curl localhost:8000/v2/models/mlp\n";

/* Most configuration flags one command line may give. */
#define MAX_SETTINGS 128

/* A configuration flag (scheduler, model policy, meta), applied after the
 * file and the environment. */
typedef struct serve_setting {
    const char *flag;
    char key[192];            /* "scheduler.discipline", "models.mlp.weight" */
    const char *value;
} serve_setting;

typedef struct serve_args {
    const char *repository;
    pjs_cli_endpoint endpoint; /* ports, TLS, credentials, client limits */
    bool allow_client_shm;
    const char *server_name;      /* NULL: not given */
    const char *node_status_file; /* NULL: not given */
    pjs_control_mode control_mode;
    uint64_t repository_poll_ms;
    bool repository_watched_outside; /* --repository-watch external */
    uint64_t max_pending_loads;
    uint64_t device_weight_budget; /* 0: derived from the device's memory */
    uint64_t host_weight_budget;   /* 0: no host tier */
    size_t metrics_models;         /* 0: the default; SIZE_MAX: every model */
    double weight_fraction;
    const char *shared_weights_dir, *shared_weights_group; /* NULL: not given */
    uint64_t max_shm_regions, max_shm_bytes;
    const char *config_path;
    serve_setting settings[MAX_SETTINGS];
    size_t n_settings;
    pjs_cli_common common;
} serve_args;

enum {
    OPT_REPOSITORY = 0x200,
    OPT_ALLOW_SHM,
    OPT_SERVER_NAME,
    OPT_NODE_STATUS_FILE,
    OPT_CONTROL_MODE,
    OPT_POLL_MS,
    OPT_REPOSITORY_WATCH,
    OPT_MAX_PENDING_LOADS,
    OPT_WEIGHT_BUDGET,
    OPT_HOST_WEIGHT_BUDGET,
    OPT_METRICS_MODELS,
    OPT_WEIGHT_FRACTION,
    OPT_MAX_SHM_REGIONS,
    OPT_MAX_SHM_BYTES,
    OPT_CONFIG,
    OPT_MODEL_WEIGHT,
    OPT_DISCIPLINE,
    OPT_HALF_LIFE,
    OPT_COALESCE_DISCOUNT,
    OPT_FAIR_CLAMP,
    OPT_COST_SMOOTHING,
    OPT_LAXITY_MARGIN,
    OPT_MAX_QUEUE_DEPTH,
    OPT_DEFAULT_TIMEOUT,
    OPT_WARMUP_RUNS,
    OPT_COLD_DEFER,
    OPT_EVICTION,
    OPT_PREFETCH,
    OPT_HAND_OFF,
    OPT_META_CONCURRENCY,
    OPT_META_SCRATCH_BYTES,
    OPT_SHARED_WEIGHTS,
    OPT_SHARED_WEIGHTS_GROUP,
};

/* The flags that set one configuration key each. */
static const struct {
    int opt;
    const char *flag;
    const char *key;
} sched_flags[] = {
    {OPT_DISCIPLINE, "--scheduler-discipline", "scheduler.discipline"},
    {OPT_HALF_LIFE, "--scheduler-half-life-ms", "scheduler.half_life_ms"},
    {OPT_COALESCE_DISCOUNT, "--coalesce-discount", "scheduler.coalesce_discount"},
    {OPT_FAIR_CLAMP, "--fair-clamp", "scheduler.fair_clamp"},
    {OPT_COST_SMOOTHING, "--cost-smoothing", "scheduler.cost_smoothing"},
    {OPT_LAXITY_MARGIN, "--edf-laxity-margin-us", "scheduler.edf_laxity_margin_us"},
    {OPT_MAX_QUEUE_DEPTH, "--max-queue-depth", "scheduler.max_queue_depth"},
    {OPT_DEFAULT_TIMEOUT, "--default-timeout-us", "scheduler.default_timeout_us"},
    {OPT_WARMUP_RUNS, "--warmup-runs", "scheduler.warmup_runs"},
    {OPT_COLD_DEFER, "--cold-model-defer-ms", "scheduler.cold_model_defer_ms"},
    {OPT_EVICTION, "--eviction-policy", "scheduler.eviction_policy"},
    {OPT_PREFETCH, "--weight-prefetch", "scheduler.weight_prefetch"},
    {OPT_HAND_OFF, "--hand-off", "scheduler.hand_off"},
    {OPT_META_CONCURRENCY, "--meta-concurrency", "meta.concurrency"},
    {OPT_META_SCRATCH_BYTES, "--meta-scratch-bytes", "meta.scratch_bytes"},
};
#define N_SCHED_FLAGS (sizeof sched_flags / sizeof sched_flags[0])

/* Parses a non-negative integer option no larger than max. */
/* --server-name: 1..PJS_SERVER_NAME_MAX of [A-Za-z0-9._-]. */
static bool server_name_ok(const char *name)
{
    size_t n = strlen(name);
    return n >= 1 && n <= PJS_SERVER_NAME_MAX &&
           strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

static int parse_int(const char *flag, const char *arg, long max, long *out)
{
    char *end;
    long v = strtol(arg, &end, 10);
    if (*arg == '\0' || *end != '\0' || v < 0 || v > max)
        return pjs_cli_usage_error("serve", "%s %s: expected an integer in 0..%ld", flag, arg,
                                   max);
    *out = v;
    return 0;
}

/* Parses a byte count (pjs_server_config_parse_bytes: an integer,
 * optionally followed by K, M, G or Ki, Mi, Gi, and B), as the
 * configuration file reads meta.scratch_bytes. */
static int parse_bytes(const char *flag, const char *arg, uint64_t *out)
{
    if (pjs_server_config_parse_bytes(arg, out))
        return 0;
    return pjs_cli_usage_error("serve",
                               "%s %s: expected a number of bytes, optionally followed by K, M, "
                               "G (powers of 1000) or Ki, Mi, Gi (powers of 1024) and B",
                               flag, arg);
}

/* Parses --host-weight-budget: bytes, or a percentage of the memory this
 * process may use (core/host_memory.h); at least one byte. */
static int parse_host_budget(const char *arg, uint64_t *out)
{
    size_t n = strlen(arg);
    if (n > 1 && arg[n - 1] == '%') {
        char *end;
        double pct = strtod(arg, &end);
        uint64_t memory = pjs_host_memory_bytes();
        if (end != arg + n - 1 || !isfinite(pct) || pct <= 0 || pct > 100)
            return pjs_cli_usage_error("serve", "--host-weight-budget %s: expected a percentage "
                                       "in (0, 100]", arg);
        if (memory == 0)
            return pjs_cli_usage_error("serve", "--host-weight-budget %s: this machine's memory "
                                       "size cannot be read; give the budget in bytes", arg);
        *out = (uint64_t)((double)memory * pct / 100.0);
    } else if (parse_bytes("--host-weight-budget", arg, out) != 0) {
        return PJS_EXIT_USAGE;
    }
    if (*out == 0)
        return pjs_cli_usage_error("serve", "--host-weight-budget %s: expected at least one byte "
                                   "(a model with no host floor at all is residency unpinned)",
                                   arg);
    return 0;
}

/* Parses --weight-fraction: a number in (0, 1]. */
static int parse_fraction(const char *flag, const char *arg, double *out)
{
    char *end;
    double v = strtod(arg, &end);
    if (*arg == '\0' || *end != '\0' || !isfinite(v) || v <= 0 || v > 1)
        return pjs_cli_usage_error("serve", "%s %s: expected a number in (0, 1]", flag, arg);
    *out = v;
    return 0;
}

/* Records a configuration flag (opt one of sched_flags, or --model-weight). */
static int add_setting(serve_args *a, int opt, const char *arg)
{
    if (a->n_settings == MAX_SETTINGS)
        return pjs_cli_usage_error("serve", "at most %d configuration flags", MAX_SETTINGS);
    serve_setting *st = &a->settings[a->n_settings];
    if (opt == OPT_MODEL_WEIGHT) {
        const char *eq = strchr(arg, '=');
        if (eq == NULL || eq == arg)
            return pjs_cli_usage_error("serve", "--model-weight %s: expected NAME=WEIGHT", arg);
        *st = (serve_setting){.flag = "--model-weight", .value = eq + 1};
        int n = snprintf(st->key, sizeof st->key, "models.%.*s.weight", (int)(eq - arg), arg);
        if (n < 0 || (size_t)n >= sizeof st->key)
            return pjs_cli_usage_error("serve", "--model-weight: the model name is too long");
    } else {
        size_t i = 0;
        while (i + 1 < N_SCHED_FLAGS && sched_flags[i].opt != opt)
            i++;
        *st = (serve_setting){.flag = sched_flags[i].flag, .value = arg};
        snprintf(st->key, sizeof st->key, "%s", sched_flags[i].key);
    }
    a->n_settings++;
    return 0;
}

static int parse_args(int argc, char **argv, serve_args *a)
{
    static const struct option opts[] = {
        PJS_CLI_COMMON_LONG_OPTIONS,
        PJS_CLI_ENDPOINT_LONG_OPTIONS,
        {"model-repository", required_argument, NULL, OPT_REPOSITORY},
        {"allow-client-shm", no_argument, NULL, OPT_ALLOW_SHM},
        {"server-name", required_argument, NULL, OPT_SERVER_NAME},
        {"node-status-file", required_argument, NULL, OPT_NODE_STATUS_FILE},
        {"model-control-mode", required_argument, NULL, OPT_CONTROL_MODE},
        {"repository-poll-ms", required_argument, NULL, OPT_POLL_MS},
        {"repository-watch", required_argument, NULL, OPT_REPOSITORY_WATCH},
        {"max-pending-loads", required_argument, NULL, OPT_MAX_PENDING_LOADS},
        {"device-weight-budget", required_argument, NULL, OPT_WEIGHT_BUDGET},
        {"host-weight-budget", required_argument, NULL, OPT_HOST_WEIGHT_BUDGET},
        {"metrics-models", required_argument, NULL, OPT_METRICS_MODELS},
        {"weight-fraction", required_argument, NULL, OPT_WEIGHT_FRACTION},
        {"shared-weights", required_argument, NULL, OPT_SHARED_WEIGHTS},
        {"shared-weights-group", required_argument, NULL, OPT_SHARED_WEIGHTS_GROUP},
        {"max-shm-regions", required_argument, NULL, OPT_MAX_SHM_REGIONS},
        {"max-shm-bytes", required_argument, NULL, OPT_MAX_SHM_BYTES},
        {"config", required_argument, NULL, OPT_CONFIG},
        {"model-weight", required_argument, NULL, OPT_MODEL_WEIGHT},
        {"scheduler-discipline", required_argument, NULL, OPT_DISCIPLINE},
        {"scheduler-half-life-ms", required_argument, NULL, OPT_HALF_LIFE},
        {"coalesce-discount", required_argument, NULL, OPT_COALESCE_DISCOUNT},
        {"fair-clamp", required_argument, NULL, OPT_FAIR_CLAMP},
        {"cost-smoothing", required_argument, NULL, OPT_COST_SMOOTHING},
        {"edf-laxity-margin-us", required_argument, NULL, OPT_LAXITY_MARGIN},
        {"max-queue-depth", required_argument, NULL, OPT_MAX_QUEUE_DEPTH},
        {"default-timeout-us", required_argument, NULL, OPT_DEFAULT_TIMEOUT},
        {"warmup-runs", required_argument, NULL, OPT_WARMUP_RUNS},
        {"cold-model-defer-ms", required_argument, NULL, OPT_COLD_DEFER},
        {"eviction-policy", required_argument, NULL, OPT_EVICTION},
        {"weight-prefetch", required_argument, NULL, OPT_PREFETCH},
        {"hand-off", required_argument, NULL, OPT_HAND_OFF},
        {"meta-concurrency", required_argument, NULL, OPT_META_CONCURRENCY},
        {"meta-scratch-bytes", required_argument, NULL, OPT_META_SCRATCH_BYTES},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    pjs_cli_endpoint_init(&a->endpoint);
    a->control_mode = PJS_CONTROL_DYNAMIC;
    a->repository_poll_ms = 1000;
    a->weight_fraction = 0.8;
    int opt;
    long v = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *flag = optind > 1 ? argv[optind - 1] : "";
        int bad = 0;
        switch (opt) {
        case 'h': fputs(help, stdout); return -1;
        case OPT_REPOSITORY: a->repository = optarg; break;
        case OPT_ALLOW_SHM: a->allow_client_shm = true; break;
        case OPT_SERVER_NAME: a->server_name = optarg; break;
        case OPT_NODE_STATUS_FILE: a->node_status_file = optarg; break;
        case OPT_SHARED_WEIGHTS: a->shared_weights_dir = optarg; break;
        case OPT_SHARED_WEIGHTS_GROUP: a->shared_weights_group = optarg; break;
        case OPT_CONTROL_MODE: {
            int mode = pjs_control_mode_parse(optarg);
            if (mode < 0)
                return pjs_cli_usage_error("serve",
                                           "--model-control-mode %s: expected dynamic, static "
                                           "or explicit",
                                           optarg);
            a->control_mode = (pjs_control_mode)mode;
            break;
        }
        case OPT_POLL_MS:
            bad = parse_int("--repository-poll-ms", optarg, 86400000, &v);
            if (!bad && v == 0)
                bad = pjs_cli_usage_error("serve", "--repository-poll-ms 0: expected at least 1");
            a->repository_poll_ms = (uint64_t)v;
            break;
        case OPT_REPOSITORY_WATCH:
            if (strcmp(optarg, "self") != 0 && strcmp(optarg, "external") != 0)
                return pjs_cli_usage_error("serve",
                                           "--repository-watch %s: expected self or external",
                                           optarg);
            a->repository_watched_outside = strcmp(optarg, "external") == 0;
            break;
        case OPT_MAX_PENDING_LOADS:
            bad = parse_int("--max-pending-loads", optarg, 4096, &v);
            if (!bad && v == 0)
                bad = pjs_cli_usage_error("serve", "--max-pending-loads 0: expected at least 1");
            a->max_pending_loads = (uint64_t)v;
            break;
        case OPT_WEIGHT_BUDGET:
            bad = parse_bytes("--device-weight-budget", optarg, &a->device_weight_budget);
            break;
        case OPT_HOST_WEIGHT_BUDGET:
            bad = parse_host_budget(optarg, &a->host_weight_budget);
            break;
        case OPT_METRICS_MODELS:
            if (strcmp(optarg, "all") == 0) {
                a->metrics_models = SIZE_MAX;
            } else {
                bad = parse_int("--metrics-models", optarg, 1000000, &v);
                if (!bad && v == 0)
                    bad = pjs_cli_usage_error("serve", "--metrics-models 0: expected at least "
                                                       "1, or all");
                a->metrics_models = (size_t)v;
            }
            break;
        case OPT_WEIGHT_FRACTION:
            bad = parse_fraction("--weight-fraction", optarg, &a->weight_fraction);
            break;
        case OPT_MAX_SHM_REGIONS:
            bad = parse_int("--max-shm-regions", optarg, 65536, &v);
            if (!bad && v == 0)
                bad = pjs_cli_usage_error("serve", "--max-shm-regions 0: expected at least 1");
            a->max_shm_regions = (uint64_t)v;
            break;
        case OPT_MAX_SHM_BYTES:
            bad = parse_bytes("--max-shm-bytes", optarg, &a->max_shm_bytes);
            if (!bad && a->max_shm_bytes == 0)
                bad = pjs_cli_usage_error("serve", "--max-shm-bytes 0: expected at least 1");
            break;
        case OPT_CONFIG: a->config_path = optarg; break;
        case OPT_MODEL_WEIGHT:
        case OPT_DISCIPLINE:
        case OPT_HALF_LIFE:
        case OPT_COALESCE_DISCOUNT:
        case OPT_FAIR_CLAMP:
        case OPT_COST_SMOOTHING:
        case OPT_LAXITY_MARGIN:
        case OPT_MAX_QUEUE_DEPTH:
        case OPT_DEFAULT_TIMEOUT:
        case OPT_WARMUP_RUNS:
        case OPT_COLD_DEFER:
        case OPT_EVICTION:
        case OPT_PREFETCH:
        case OPT_HAND_OFF:
        case OPT_META_CONCURRENCY:
        case OPT_META_SCRATCH_BYTES: bad = add_setting(a, opt, optarg); break;
        default: {
            int r = pjs_cli_endpoint_option(&a->endpoint, "serve", opt, optarg);
            if (r == 0)
                r = pjs_cli_common_option(&a->common, opt, optarg);
            if (r < 0)
                return PJS_EXIT_USAGE;
            if (r == 0)
                return pjs_cli_usage_error("serve", "unknown option %s", flag);
        }
        }
        if (bad)
            return bad;
    }
    if (optind < argc)
        return pjs_cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
    if (a->repository == NULL)
        return pjs_cli_usage_error("serve", "--model-repository DIR is required");
    if (a->shared_weights_dir != NULL && strcmp(a->shared_weights_dir, "auto") == 0)
        return pjs_cli_usage_error("serve", "--shared-weights auto: only `pjserve node` makes a "
                                            "directory for its workers; name a DIR on a tmpfs");
    if (a->shared_weights_group != NULL && a->shared_weights_dir == NULL)
        return pjs_cli_usage_error("serve", "--shared-weights-group needs --shared-weights DIR");
    if (a->server_name != NULL && !server_name_ok(a->server_name))
        return pjs_cli_usage_error("serve",
                                   "--server-name '%.80s': 1 to %d letters, digits, '.', '_' "
                                   "or '-'",
                                   a->server_name, PJS_SERVER_NAME_MAX);
    return pjs_cli_endpoint_check(&a->endpoint, "serve");
}

/* Builds the configuration: defaults < file < environment < flags. A bad
 * file or variable is a failure, a bad flag value a usage error. */
static int build_config(const serve_args *a, pjs_server_config *c)
{
    pjs_error err;
    pjs_server_config_init(c);
    if (a->config_path != NULL && pjs_server_config_load_file(c, a->config_path, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    if (pjs_server_config_apply_env(c, environ, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    for (size_t i = 0; i < a->n_settings; i++) {
        const serve_setting *st = &a->settings[i];
        if (pjs_server_config_set(c, st->key, st->value, st->flag, &err) != 0)
            return pjs_cli_usage_error("serve", "%s", err.msg);
    }
    if (pjs_server_config_check(c, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    return PJS_EXIT_OK;
}

/* Logs who decides which models are loaded and resident, once. */
static void log_control_mode(const serve_args *a)
{
    switch (a->control_mode) {
    case PJS_CONTROL_STATIC:
        pjs_info("model control mode static: the repository is loaded once, at start-up");
        break;
    case PJS_CONTROL_EXPLICIT:
        pjs_info("model control mode explicit: the repository is loaded at start-up; device "
                 "weights are loaded and evicted only on request of a control plane");
        break;
    default:
        if (a->repository_watched_outside)
            pjs_info("model control mode dynamic: the repository is loaded at start-up; another "
                     "process watches it and applies its changes here (--repository-watch "
                     "external)");
        else
            pjs_info("model control mode dynamic: bundles added, changed or removed in %s are "
                     "loaded, reloaded or dropped (scanned every %llu ms)",
                     a->repository, (unsigned long long)a->repository_poll_ms);
    }
}

/* Logs what readiness means here, once. */
static void log_readiness(bool strict)
{
    if (strict)
        pjs_info("readiness strict: /v2/health/ready answers 200 only while every model that "
                 "should be loaded is READY (--strict-readiness false: while serving)");
    else
        pjs_info("readiness not strict: /v2/health/ready answers 200 while the server serves, "
                 "whatever loaded");
}

/* Logs which access rules hold, once. */
static void log_access(const pjs_access *access)
{
    char line[512];
    pjs_access_describe_admin(access, line, sizeof line);
    pjs_info("%s", line);
    pjs_access_describe_infer(access, line, sizeof line);
    pjs_info("%s", line);
}

/* Raises the descriptor limit and logs how it is shared, once. */
static void raise_file_limit(pjs_file_limit *files)
{
    pjs_file_limit_raise(files);
    if (files->set_errno != 0)
        pjs_warn("file limit: cannot raise the soft limit %ld to the hard limit %ld: %s",
                 files->before, files->hard, strerror(files->set_errno));
    pjs_info("file limit %ld descriptors%s: gRPC connections within the lowest %ld, HTTP "
             "and metrics connections within their caps, %ld kept in reserve",
             files->soft, files->raised ? " (soft limit raised to the hard limit)" : "",
             files->grpc_share, files->reserve);
}

/* Logs the effective scheduler settings, model policies and meta settings,
 * once. */
static void log_config(const pjs_server_config *c)
{
    char line[512];
    pjs_server_config_describe(c, line, sizeof line);
    pjs_info("%s", line);
    pjs_meta_config_describe(&c->meta, line, sizeof line);
    pjs_info("%s", line);
    for (size_t i = 0; i < c->n_models; i++) {
        pjs_model_policy_describe(&c->models[i], line, sizeof line);
        pjs_info("%s", line);
    }
}

int pjs_cmd_serve(int argc, char **argv)
{
    serve_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? PJS_EXIT_OK : rc;
    pjs_server_config config;
    rc = build_config(&a, &config);
    if (rc != PJS_EXIT_OK) {
        pjs_server_config_free(&config);
        return rc;
    }
    pjs_access *access = NULL;
    pjs_error access_err;
    if (pjs_access_create(a.endpoint.admin_token_file, a.endpoint.infer_token_file, &access,
                          &access_err) != 0) {
        pjs_server_config_free(&config);
        return pjs_cli_fail("%s", access_err.msg);
    }
    log_config(&config);
    log_control_mode(&a);
    log_access(access);
    log_readiness(a.endpoint.strict_readiness);
    pjs_file_limit files;
    raise_file_limit(&files);

    sigset_t stop_signals;
    pjs_cli_block_stop_signals(&stop_signals);

    /* The CPU plugin's threads are sized by the models the repository
     * holds at start-up; models added later do not change them. */
    pjs_tracer *tracer = NULL;
    rc = pjs_cli_endpoint_tracer(&a.endpoint, "pjserve", &tracer);
    if (rc != PJS_EXIT_OK) {
        pjs_server_config_free(&config);
        pjs_access_destroy(access);
        return rc;
    }
    pjs_rt_option client_options[PJS_CLI_MAX_PJRT_OPTIONS + 1];
    char *repository[1] = {(char *)a.repository};
    size_t n_client_options = pjs_cli_client_options(&a.common, repository, 1, client_options);
    pjs_server_options so = {
        .repository = a.repository,
        .plugin_path = a.common.plugin_path,
        .cache_dir = a.common.cache_dir,
        .no_cache = a.common.no_cache,
        .pjrt_options = client_options,
        .n_pjrt_options = n_client_options,
        .allow_client_shm = a.allow_client_shm,
        .server_name = a.server_name,
        .config = &config,
        .control_mode = a.control_mode,
        .repository_poll_ms = a.repository_poll_ms,
        .repository_watched_outside = a.repository_watched_outside,
        .max_pending_loads = a.max_pending_loads,
        .device_weight_budget = a.device_weight_budget,
        .host_weight_budget = a.host_weight_budget,
        .metrics_models = a.metrics_models,
        .weight_fraction = a.weight_fraction,
        .max_request_bytes = a.endpoint.max_request_bytes,
        .max_inflight_request_bytes = a.endpoint.max_inflight_request_bytes,
        .max_shm_regions = a.max_shm_regions,
        .max_shm_bytes = a.max_shm_bytes,
        .meta_concurrency = config.meta.concurrency,
        .meta_scratch_bytes = config.meta.scratch_bytes,
        .shared_weights_dir = a.shared_weights_dir,
        .shared_weights_group = a.shared_weights_group,
        .strict_readiness = a.endpoint.strict_readiness,
        .tracer = tracer,
    };
    pjs_error err;
    pjs_server *server = NULL;
    pjs_grpc_frontend *grpc = NULL;
    pjs_http_frontend *http = NULL, *metrics = NULL;
    if (pjs_server_create(&so, &server, &err) != 0) {
        pjs_server_config_free(&config);
        pjs_access_destroy(access);
        pjs_tracer_destroy(tracer);
        return pjs_cli_fail("%s", err.msg);
    }

    pjs_grpc_options go;
    pjs_http_options ho, mo;
    pjs_cli_endpoint_ports(&a.endpoint, access, files.grpc_share, &go, &ho, &mo);
    go.node_status_file = ho.node_status_file = a.node_status_file;
    /* REST starts last: its health probes are what orchestrators and tests
     * wait on, so once they answer every other port is already listening. */
    rc = PJS_EXIT_OK;
    char g_addr[PJS_CLI_ADDRESS_MAX], h_addr[PJS_CLI_ADDRESS_MAX], m_addr[PJS_CLI_ADDRESS_MAX];
    pjs_cli_address(g_addr, sizeof g_addr, go.host, go.port);
    pjs_cli_address(h_addr, sizeof h_addr, ho.host, ho.port);
    pjs_cli_address(m_addr, sizeof m_addr, mo.host, mo.port);
    if (mo.port != 0 && pjs_metrics_frontend_start(server, &mo, &metrics, &err) != 0)
        rc = pjs_cli_fail("metrics on %s: %s", m_addr, err.msg);
    if (rc == PJS_EXIT_OK && go.port != 0 && pjs_grpc_frontend_start(server, &go, &grpc, &err) != 0)
        rc = pjs_cli_fail("gRPC on %s: %s", g_addr, err.msg);
    if (rc == PJS_EXIT_OK && ho.port != 0 && pjs_http_frontend_start(server, &ho, &http, &err) != 0)
        rc = pjs_cli_fail("HTTP on %s: %s", h_addr, err.msg);

    if (rc == PJS_EXIT_OK) {
        pjs_info("serving: gRPC %s%s, HTTP %s%s, metrics %s/metrics (ctrl-c stops)", g_addr,
                 go.tls_cert ? " (TLS)" : "", h_addr, ho.tls_cert ? " (HTTPS)" : "", m_addr);
        int sig = 0;
        sigwait(&stop_signals, &sig);
        pjs_server_counters c;
        pjs_server_get_counters(server, &c);
        pjs_info("%s received: answering %llu accepted requests, then stopping",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", (unsigned long long)c.in_flight);
    }
    pjs_server_drain(server);
    pjs_grpc_frontend_stop(grpc);
    pjs_http_frontend_stop(http);
    pjs_http_frontend_stop(metrics);
    pjs_server_destroy(server);
    pjs_tracer_destroy(tracer); /* after the server: its last spans are exported */
    pjs_server_config_free(&config);
    pjs_access_destroy(access);
    if (rc == PJS_EXIT_OK)
        pjs_info("stopped");
    return rc;
}
