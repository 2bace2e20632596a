/*
 * cmd_node.c - `pjserve node`: one `pjserve serve` worker process per
 * device under a supervisor (node/node.h), behind one endpoint.
 *
 * The command line is serve's plus the node's own flags. Serve's flags are
 * sorted by where they act (serve_flags below): worker flags (repository,
 * scheduler, plugin, cache, weights) go to every worker as given; public
 * flags (addresses, ports, TLS, client limits, tokens) go to the one worker
 * when there is one, which then serves the public ports itself, and to the
 * gateway when there are more. Workers behind a gateway listen on private
 * loopback ports picked once at start and accept admin calls only with the
 * node's own token. Serve checks the values of the flags passed to it: a
 * worker that refuses its command line stops the node with exit status 2.
 * In dynamic mode behind a gateway the node runs the one repository watcher
 * (registry/repo_watch.h) and the workers do not watch (--repository-watch
 * external): each settled change goes to every worker through the
 * gateway's pool.
 *
 * Signals: SIGINT and SIGTERM are blocked before any thread starts and
 * waited for in pjs_node_run; then every worker is told to drain and stop.
 */
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/endpoint.h"
#include "core/cpus.h"
#include "core/file_limit.h"
#include "core/log.h"
#include "core/unix_addr.h"
#include "gateway/gateway.h"
#include "node/node.h"
#include "node/setup.h"
#include "registry/repo_watch.h"
#include "registry/weight_store.h"
#include "runtime/cpu_threads.h"
#include "server/config.h"
#include "server/server.h"

static const char help[] =
    "usage: pjserve node --model-repository DIR [--workers N | --devices auto|LIST]\n"
    "                    [OPTIONS]\n"
    "\n"
    "Runs one `pjserve serve` worker process per device and keeps them serving:\n"
    "a worker that exits, or stops answering its health probes, is killed and\n"
    "started again after a backoff (100 ms, doubling to 5 s), within a restart\n"
    "budget. With one worker, that worker serves the public ports itself; with\n"
    "more, a gateway in the node serves them and routes each request to a worker\n"
    "that holds its model. GET /v2/pjserve/node on the REST port shows every\n"
    "worker (docs/node.md). SIGINT or SIGTERM drains every worker and exits 0.\n"
    "Worker logs appear on the node's stderr, each line behind '[worker N]'.\n"
    "\n"
    "workers:\n"
    "  --workers N             N workers on the plugin's first device, 1 to 64\n"
    "                          (default 1); on the CPU plugin, N CPU workers\n"
    "  --devices auto|LIST     one worker per device: auto = every device the GPU\n"
    "                          plugin sees (CUDA_VISIBLE_DEVICES when set), 1 on\n"
    "                          the CPU plugin; LIST = device ids such as 0,1,3.\n"
    "                          Each worker sees only its own device: it starts with\n"
    "                          CUDA_VISIBLE_DEVICES=<id> (HIP_VISIBLE_DEVICES on\n"
    "                          ROCm)\n"
    "  --worker-threads N      threads of each worker: gRPC threads at most min(N, 2),\n"
    "                          HTTP threads at most min(N, 4), CPU plugin threads at\n"
    "                          most N (default:\n"
    "                          CPUs / workers, at most 16; flags --grpc-threads,\n"
    "                          --http-threads, --cpu-intra-op-threads win)\n"
    "  --routing round_robin|lpt_packing  how the gateway spreads a model's requests\n"
    "                          over the workers (default round_robin)\n"
    "  --lpt-devices-per-model K  lpt_packing: workers each model is placed on\n"
    "                          (default 1)\n"
    "  --run-dir DIR           where the node keeps its status file and the workers'\n"
    "                          admin token: a directory of this user's, mode 0700\n"
    "                          (made so if absent; a symbolic link, or one open to\n"
    "                          group or others, is refused). Default: a fresh\n"
    "                          pjserve-node-XXXXXX under $XDG_RUNTIME_DIR, else\n"
    "                          /tmp. The node's files there are removed at exit,\n"
    "                          the directory too when the node made it\n"
    "\n"
    "supervision:\n"
    "  --health-interval-ms MS probe GET /v2/health/live of every worker this often\n"
    "                          (default 500)\n"
    "  --health-timeout-ms MS  a probe not answered within MS fails (default 1000)\n"
    "  --unhealthy-after N     failed probes in a row after which a worker that was\n"
    "                          ready is killed and restarted (default 3)\n"
    "  --max-restarts N        restarts of one worker allowed within\n"
    "                          --restart-window-s; past them the worker is 'failed'\n"
    "                          and left down, the others serve on (default 5; 0:\n"
    "                          never restart). With every worker failed the node\n"
    "                          exits 1\n"
    "  --restart-window-s S    (default 60)\n"
    "  --restart-stable-s S    a worker that stayed ready S seconds before it went\n"
    "                          down restarts after the first delay again, 100 ms\n"
    "                          (default 30)\n"
    "  --stop-timeout-s S      on SIGINT/SIGTERM, time a worker gets to answer what\n"
    "                          it accepted and exit before SIGKILL (default 30)\n"
    "\n"
    "public endpoint (the worker's with one worker, the gateway's with more; as in\n"
    "'pjserve serve --help'):\n"
    "  --host --grpc-port --http-port --metrics-port --grpc-host --http-host\n"
    "  --metrics-host --grpc-tls-cert --grpc-tls-key --grpc-tls-ca --http-tls-cert\n"
    "  --http-tls-key --http-tls-ca --admin-token-file --infer-token-file\n"
    "  --grpc-keepalive-* --grpc-max-concurrent-streams --grpc-max-connection-idle-ms\n"
    "  --grpc-handshake-timeout-ms --grpc-memory-quota --grpc-threads --http-threads\n"
    "  --http-max-connections --http-max-connections-per-ip --http-*-timeout-s\n"
    "  --max-request-bytes --max-inflight-request-bytes\n"
    "  --grpc-stream-write-timeout-ms --strict-readiness (these four: workers too;\n"
    "  with --strict-readiness true, the default, the node is ready only while\n"
    "  every model that should be loaded is READY, as serve; docs/node.md)\n"
    "\n"
    "every other flag of 'pjserve serve' (model control, weights, shared weights,\n"
    "client shared memory, scheduler, meta models, --config, plugin and cache)\n"
    "goes to every worker. In dynamic model control mode (the default) with more\n"
    "than one worker, the node itself watches the repository (every\n"
    "--repository-poll-ms) and has every worker load, reload or drop a bundle\n"
    "that changed; the workers do not watch (docs/node.md). --shared-weights auto: the node makes a private\n"
    "directory for its workers' shared weights, /dev/shm/pjserve-weights-XXXXXX\n"
    "(mode 0700, removed at exit); a DIR given is checked before any worker starts.\n"
    "\n"
    "examples:\n"
    "  pjserve node --model-repository models                # one worker\n"
    "  pjserve node --model-repository models --workers 2    # gateway + 2 workers\n"
    "  pjserve node --model-repository models --devices auto # one per GPU\n"
    "  curl localhost:8000/v2/pjserve/node\n";

/* Where a serve flag acts. */
typedef enum flag_place {
    TO_WORKERS, /* every worker */
    TO_PUBLIC,  /* the public endpoint: the one worker, or the gateway */
    TO_BOTH,    /* the public endpoint and every worker */
} flag_place;

/* Every flag of `pjserve serve` (cmd_serve.c; cli.h for the common ones). A
 * flag added to serve must be added here; tests/node checks that both
 * agree. */
static const struct serve_flag {
    const char *name;
    int has_arg;
    flag_place place;
} serve_flags[] = {
    {"model-repository", required_argument, TO_WORKERS},
    {"host", required_argument, TO_PUBLIC},
    {"grpc-port", required_argument, TO_PUBLIC},
    {"http-port", required_argument, TO_PUBLIC},
    {"metrics-port", required_argument, TO_PUBLIC},
    {"allow-client-shm", no_argument, TO_WORKERS},
    {"server-name", required_argument, TO_WORKERS},
    {"grpc-stream-write-timeout-ms", required_argument, TO_BOTH},
    {"strict-readiness", required_argument, TO_BOTH},
    {"trace-endpoint", required_argument, TO_BOTH},
    {"trace-rate", required_argument, TO_BOTH},
    {"admin-token-file", required_argument, TO_PUBLIC},
    {"infer-token-file", required_argument, TO_PUBLIC},
    {"grpc-tls-cert", required_argument, TO_PUBLIC},
    {"grpc-tls-key", required_argument, TO_PUBLIC},
    {"grpc-tls-ca", required_argument, TO_PUBLIC},
    {"grpc-keepalive-time-ms", required_argument, TO_PUBLIC},
    {"grpc-keepalive-timeout-ms", required_argument, TO_PUBLIC},
    {"grpc-keepalive-permit-without-calls", no_argument, TO_PUBLIC},
    {"grpc-threads", required_argument, TO_PUBLIC},
    {"grpc-host", required_argument, TO_PUBLIC},
    {"grpc-max-concurrent-streams", required_argument, TO_PUBLIC},
    {"grpc-max-connection-idle-ms", required_argument, TO_PUBLIC},
    {"grpc-handshake-timeout-ms", required_argument, TO_PUBLIC},
    {"grpc-memory-quota", required_argument, TO_PUBLIC},
    {"http-threads", required_argument, TO_PUBLIC},
    {"http-host", required_argument, TO_PUBLIC},
    {"metrics-host", required_argument, TO_PUBLIC},
    {"http-max-connections", required_argument, TO_PUBLIC},
    {"http-max-connections-per-ip", required_argument, TO_PUBLIC},
    {"http-idle-timeout-s", required_argument, TO_PUBLIC},
    {"http-header-timeout-s", required_argument, TO_PUBLIC},
    {"http-body-timeout-s", required_argument, TO_PUBLIC},
    {"http-tls-cert", required_argument, TO_PUBLIC},
    {"http-tls-key", required_argument, TO_PUBLIC},
    {"http-tls-ca", required_argument, TO_PUBLIC},
    {"model-control-mode", required_argument, TO_WORKERS},
    {"repository-poll-ms", required_argument, TO_WORKERS},
    {"repository-watch", required_argument, TO_WORKERS},
    {"max-pending-loads", required_argument, TO_WORKERS},
    {"device-weight-budget", required_argument, TO_WORKERS},
    {"host-weight-budget", required_argument, TO_WORKERS},
    {"metrics-models", required_argument, TO_WORKERS},
    {"weight-fraction", required_argument, TO_WORKERS},
    {"shared-weights", required_argument, TO_WORKERS},
    {"shared-weights-group", required_argument, TO_WORKERS},
    {"max-request-bytes", required_argument, TO_BOTH},
    {"max-inflight-request-bytes", required_argument, TO_BOTH},
    {"max-shm-regions", required_argument, TO_WORKERS},
    {"max-shm-bytes", required_argument, TO_WORKERS},
    {"config", required_argument, TO_WORKERS},
    {"model-weight", required_argument, TO_WORKERS},
    {"scheduler-discipline", required_argument, TO_WORKERS},
    {"scheduler-half-life-ms", required_argument, TO_WORKERS},
    {"coalesce-discount", required_argument, TO_WORKERS},
    {"fair-clamp", required_argument, TO_WORKERS},
    {"cost-smoothing", required_argument, TO_WORKERS},
    {"edf-laxity-margin-us", required_argument, TO_WORKERS},
    {"max-queue-depth", required_argument, TO_WORKERS},
    {"default-timeout-us", required_argument, TO_WORKERS},
    {"warmup-runs", required_argument, TO_WORKERS},
    {"cold-model-defer-ms", required_argument, TO_WORKERS},
    {"eviction-policy", required_argument, TO_WORKERS},
    {"weight-prefetch", required_argument, TO_WORKERS},
    {"hand-off", required_argument, TO_WORKERS},
    {"meta-concurrency", required_argument, TO_WORKERS},
    {"meta-scratch-bytes", required_argument, TO_WORKERS},
    {"pjrt-plugin", required_argument, TO_WORKERS},
    {"cache-dir", required_argument, TO_WORKERS},
    {"no-cache", no_argument, TO_WORKERS},
    {"pjrt-option", required_argument, TO_WORKERS},
    {"log-level", required_argument, TO_WORKERS},
    {"cpu-intra-op-threads", required_argument, TO_WORKERS},
    {"device-schedule", required_argument, TO_WORKERS},
    {"xla-flags", required_argument, TO_WORKERS},
    {"execution-wait", required_argument, TO_WORKERS},
    {"weight-upload", required_argument, TO_WORKERS},
};
#define N_SERVE_FLAGS (sizeof serve_flags / sizeof serve_flags[0])
#define OPT_SERVE_BASE 0x1000

enum {
    OPT_WORKERS = 0x300,
    OPT_DEVICES,
    OPT_WORKER_THREADS,
    OPT_ROUTING,
    OPT_LPT_K,
    OPT_RUN_DIR,
    OPT_HEALTH_INTERVAL,
    OPT_HEALTH_TIMEOUT,
    OPT_UNHEALTHY_AFTER,
    OPT_MAX_RESTARTS,
    OPT_RESTART_WINDOW,
    OPT_RESTART_STABLE,
    OPT_STOP_TIMEOUT,
};

static const struct option node_flags[] = {
    {"workers", required_argument, NULL, OPT_WORKERS},
    {"devices", required_argument, NULL, OPT_DEVICES},
    {"worker-threads", required_argument, NULL, OPT_WORKER_THREADS},
    {"routing", required_argument, NULL, OPT_ROUTING},
    {"lpt-devices-per-model", required_argument, NULL, OPT_LPT_K},
    {"run-dir", required_argument, NULL, OPT_RUN_DIR},
    {"health-interval-ms", required_argument, NULL, OPT_HEALTH_INTERVAL},
    {"health-timeout-ms", required_argument, NULL, OPT_HEALTH_TIMEOUT},
    {"unhealthy-after", required_argument, NULL, OPT_UNHEALTHY_AFTER},
    {"max-restarts", required_argument, NULL, OPT_MAX_RESTARTS},
    {"restart-window-s", required_argument, NULL, OPT_RESTART_WINDOW},
    {"restart-stable-s", required_argument, NULL, OPT_RESTART_STABLE},
    {"stop-timeout-s", required_argument, NULL, OPT_STOP_TIMEOUT},
};
#define N_NODE_FLAGS (sizeof node_flags / sizeof node_flags[0])

/* A serve flag as given: "--name" and its value (NULL: none). */
typedef struct given_flag {
    const struct serve_flag *flag;
    const char *value;
} given_flag;

#define MAX_GIVEN 512

typedef struct node_args {
    given_flag given[MAX_GIVEN];
    size_t n_given;
    /* The node's own. */
    long workers;          /* 0: not given */
    const char *devices;   /* NULL: not given */
    long worker_threads;   /* 0: the share */
    const char *routing;
    long lpt_k;
    const char *run_dir;
    long health_interval_ms, health_timeout_ms, unhealthy_after;
    long max_restarts, restart_window_s, restart_stable_s, stop_timeout_s;
    pjs_cli_common common; /* validated copies of the common flags */
} node_args;

/* The value of the last `name` given, or NULL. */
static const char *given_value(const node_args *a, const char *name)
{
    const char *v = NULL;
    for (size_t i = 0; i < a->n_given; i++)
        if (strcmp(a->given[i].flag->name, name) == 0)
            v = a->given[i].value ? a->given[i].value : "";
    return v;
}

static int parse_long(const char *flag, const char *arg, long min, long max, long *out)
{
    char *end;
    long v = strtol(arg, &end, 10);
    if (*arg == '\0' || *end != '\0' || v < min || v > max)
        return pjs_cli_usage_error("node", "--%s %s: expected an integer in %ld..%ld", flag,
                                   arg, min, max);
    *out = v;
    return 0;
}

/* Handles one of the node's own flags. */
static int node_option(node_args *a, int opt, const char *arg)
{
    switch (opt) {
    case OPT_WORKERS: return parse_long("workers", arg, 1, PJS_NODE_MAX_WORKERS, &a->workers);
    case OPT_DEVICES: a->devices = arg; return 0;
    case OPT_WORKER_THREADS:
        return parse_long("worker-threads", arg, 1, PJS_RT_CPU_THREADS_MAX, &a->worker_threads);
    case OPT_ROUTING:
        if (strcmp(arg, "round_robin") != 0 && strcmp(arg, "lpt_packing") != 0)
            return pjs_cli_usage_error("node", "--routing %s: expected round_robin or "
                                               "lpt_packing",
                                       arg);
        a->routing = arg;
        return 0;
    case OPT_LPT_K:
        return parse_long("lpt-devices-per-model", arg, 1, PJS_NODE_MAX_WORKERS, &a->lpt_k);
    case OPT_RUN_DIR: a->run_dir = arg; return 0;
    case OPT_HEALTH_INTERVAL:
        return parse_long("health-interval-ms", arg, 10, 3600000, &a->health_interval_ms);
    case OPT_HEALTH_TIMEOUT:
        return parse_long("health-timeout-ms", arg, 10, 3600000, &a->health_timeout_ms);
    case OPT_UNHEALTHY_AFTER:
        return parse_long("unhealthy-after", arg, 1, 1000, &a->unhealthy_after);
    case OPT_MAX_RESTARTS:
        return parse_long("max-restarts", arg, 0, PJS_NODE_MAX_RESTARTS_LIMIT, &a->max_restarts);
    case OPT_RESTART_WINDOW:
        return parse_long("restart-window-s", arg, 1, 86400, &a->restart_window_s);
    case OPT_RESTART_STABLE:
        return parse_long("restart-stable-s", arg, 1, 86400, &a->restart_stable_s);
    case OPT_STOP_TIMEOUT: return parse_long("stop-timeout-s", arg, 1, 86400, &a->stop_timeout_s);
    }
    return pjs_cli_usage_error("node", "unknown option");
}

static int parse_args(int argc, char **argv, node_args *a)
{
    static struct option opts[N_SERVE_FLAGS + N_NODE_FLAGS + 2];
    size_t k = 0;
    for (size_t i = 0; i < N_SERVE_FLAGS; i++)
        opts[k++] = (struct option){serve_flags[i].name, serve_flags[i].has_arg, NULL,
                                    OPT_SERVE_BASE + (int)i};
    for (size_t i = 0; i < N_NODE_FLAGS; i++)
        opts[k++] = node_flags[i];
    opts[k++] = (struct option){"help", no_argument, NULL, 'h'};
    opts[k] = (struct option){NULL, 0, NULL, 0};
    a->routing = "round_robin";
    a->lpt_k = 1;
    a->max_restarts = 5;
    a->restart_window_s = 60;
    a->restart_stable_s = 30;
    a->stop_timeout_s = 30;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        const char *flag = argv[optind - 1];
        if (opt == 'h') {
            fputs(help, stdout);
            return -1;
        }
        if (opt == '?')
            return pjs_cli_usage_error("node", "unknown option %s", flag);
        if (opt == ':')
            return pjs_cli_usage_error("node", "%s needs a value", flag);
        if (opt < OPT_SERVE_BASE) {
            int bad = node_option(a, opt, optarg);
            if (bad)
                return bad;
            continue;
        }
        const struct serve_flag *sf = &serve_flags[opt - OPT_SERVE_BASE];
        if (a->n_given == MAX_GIVEN)
            return pjs_cli_usage_error("node", "at most %d serve flags", MAX_GIVEN);
        a->given[a->n_given++] = (given_flag){sf, optarg};
        /* The common flags are checked here too: the node's own log level,
         * and the plugin flags it opens the plugin with. --xla-flags is the
         * workers' alone: applied here, it would reach them twice (once
         * through the environment they inherit). */
        static const struct {
            const char *name;
            int code; /* pjs_cli_common_option's */
        } common[] = {{"pjrt-plugin", 0x100},     {"cache-dir", 0x101},
                      {"no-cache", 0x102},        {"pjrt-option", 0x103},
                      {"log-level", 0x104},       {"cpu-intra-op-threads", 0x105},
                      {"device-schedule", 0x106}, {"execution-wait", 0x108},
                      {"weight-upload", 0x109}};
        for (size_t c = 0; c < sizeof common / sizeof *common; c++)
            if (strcmp(sf->name, common[c].name) == 0 &&
                pjs_cli_common_option(&a->common, common[c].code, optarg) < 0)
                return PJS_EXIT_USAGE;
    }
    if (optind < argc)
        return pjs_cli_usage_error("node", "unexpected argument '%s'", argv[optind]);
    const char *repo = given_value(a, "model-repository");
    if (repo == NULL)
        return pjs_cli_usage_error("node", "--model-repository DIR is required");
    struct stat st;
    if (stat(repo, &st) != 0 || !S_ISDIR(st.st_mode))
        return pjs_cli_usage_error("node", "--model-repository %s: not a directory", repo);
    if (a->workers != 0 && a->devices != NULL)
        return pjs_cli_usage_error("node", "--workers and --devices exclude each other: "
                                           "--workers N for CPU workers, --devices for one "
                                           "worker per GPU");
    if (a->health_timeout_ms == 0)
        a->health_timeout_ms = 1000;
    return PJS_EXIT_OK;
}

/* ---- the workers ---------------------------------------------------------------- */

/* One worker as this command builds it. */
typedef struct node_worker {
    char device[64];
    char env_entry[96];   /* "CUDA_VISIBLE_DEVICES=1"; "" none */
    char *env[2];
    int grpc_port, http_port; /* one worker: its public ports */
    /* "host:port", or "unix:/path" behind a gateway; as pjs_gw_worker_addr holds them */
    char grpc[280], http[280], metrics[280];
    const char *probe_host;
    char **argv;
    size_t argc;
} node_worker;

/* Everything the node runs on. */
typedef struct node_plan {
    char exe[PATH_MAX];
    pjs_node_platform platform;
    node_worker workers[PJS_NODE_MAX_WORKERS];
    size_t n_workers;
    int threads;           /* each worker's share */
    int cpu_plugin_threads; /* 0: not passed */
    pjs_node_run_dir run_dir; /* fd -1 until made */
    char status_file[PATH_MAX + 32]; /* paths into it, for the workers */
    char token_file[PATH_MAX + 32];
    char token[65];
    char shared_weights[PATH_MAX]; /* the store's directory the workers get; "" none */
    bool shared_weights_made;      /* made here (--shared-weights auto): removed at exit */
    /* Dynamic mode behind a gateway: the node watches the repository every
     * poll_ms and the workers do not (--repository-watch external). */
    bool node_watches;
    long poll_ms;
} node_plan;

/* The plugin flags `pjserve info` needs. */
static size_t plugin_args(const node_args *a, char **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < a->n_given && n + 2 <= max; i++) {
        const char *name = a->given[i].flag->name;
        if (strcmp(name, "pjrt-plugin") == 0 || strcmp(name, "pjrt-option") == 0) {
            out[n++] = (char *)(strcmp(name, "pjrt-plugin") == 0 ? "--pjrt-plugin"
                                                                  : "--pjrt-option");
            out[n++] = (char *)a->given[i].value;
        }
    }
    return n;
}

/* Decides the workers and their devices. */
static int plan_devices(const node_args *a, node_plan *p)
{
    char *args[2 * PJS_CLI_MAX_PJRT_OPTIONS + 4];
    size_t n_args = plugin_args(a, args, sizeof args / sizeof args[0]);
    pjs_error err;
    if (pjs_node_platform_probe(p->exe, args, n_args, &p->platform, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    const char *platform = p->platform.name;
    const char *var = pjs_node_visible_devices_variable(platform);
    char ids[PJS_NODE_MAX_WORKERS][32];
    int n = 0;
    if (a->devices == NULL) {
        n = a->workers > 0 ? (int)a->workers : 1;
        for (int i = 0; i < n; i++)
            snprintf(ids[i], sizeof ids[i], "%d", i);
        if (n > 1 && var != NULL)
            pjs_warn("--workers %d on the %s plugin: every worker uses the same device; "
                     "--devices runs one worker per device",
                     n, platform);
        var = NULL;
    } else if (strcmp(a->devices, "auto") == 0) {
        const char *visible = var ? getenv(var) : NULL;
        if (var == NULL) {
            n = 1;
            snprintf(ids[0], sizeof ids[0], "0");
        } else if (visible != NULL && visible[0] != '\0') {
            n = pjs_node_parse_device_list(visible, ids, PJS_NODE_MAX_WORKERS, &err);
            if (n < 0)
                return pjs_cli_fail("%s: %s", var, err.msg);
        } else {
            n = (int)(p->platform.devices < PJS_NODE_MAX_WORKERS ? p->platform.devices
                                                                  : PJS_NODE_MAX_WORKERS);
            for (int i = 0; i < n; i++)
                snprintf(ids[i], sizeof ids[i], "%d", i);
        }
        if (n == 0)
            return pjs_cli_fail("--devices auto: the %s plugin reports no device", platform);
    } else {
        n = pjs_node_parse_device_list(a->devices, ids, PJS_NODE_MAX_WORKERS, &err);
        if (n < 0)
            return pjs_cli_usage_error("node", "--devices %s", err.msg);
    }
    p->n_workers = (size_t)n;
    for (int i = 0; i < n; i++) {
        node_worker *w = &p->workers[i];
        snprintf(w->device, sizeof w->device, "%.31s:%.31s", platform, ids[i]);
        if (var != NULL)
            snprintf(w->env_entry, sizeof w->env_entry, "%s=%.31s", var, ids[i]);
        w->env[0] = w->env_entry[0] ? w->env_entry : NULL;
        w->env[1] = NULL;
    }
    return PJS_EXIT_OK;
}

/* The thread share of each worker and the CPU plugin threads it gets. */
static void plan_threads(const node_args *a, node_plan *p)
{
    int cpus = pjs_cpus_schedulable();
    int share = (int)(a->worker_threads > 0 ? a->worker_threads
                                            : cpus / (int)p->n_workers);
    if (a->worker_threads == 0 && share > 16)
        share = 16;
    if (share < 1)
        share = 1;
    p->threads = share;
    bool given = given_value(a, "cpu-intra-op-threads") != NULL;
    for (size_t i = 0; i < a->common.n_pjrt_options; i++)
        given = given || strcmp(a->common.pjrt_options[i].key, PJS_RT_OPTION_CPU_THREADS) == 0;
    if (given || strcmp(p->platform.name, "cpu") != 0)
        return;
    /* Serve's own choice for the repository (one thread for small models,
     * every CPU for large ones), bounded by the share. */
    pjs_rt_option options[PJS_CLI_MAX_PJRT_OPTIONS + 1];
    char *repo[1] = {(char *)given_value(a, "model-repository")};
    size_t n = pjs_cli_client_options(&a->common, repo, 1, options);
    int auto_threads = n > 0 ? (int)options[n - 1].int_value : share;
    p->cpu_plugin_threads = auto_threads < share ? auto_threads : share;
}

/* A worker's gRPC and HTTP threads: its share, at most these many (serve's
 * own defaults; docs/runtime.md, "CPU cost per request on few cores"). */
#define WORKER_GRPC_THREADS_MAX 2
#define WORKER_HTTP_THREADS_MAX 4

static int capped(int threads, int max)
{
    return threads < max ? threads : max;
}

/* The thread count a worker gets for `flag` ("grpc-threads"), as text. */
static void io_threads(const node_args *a, const node_plan *p, const char *flag, int max,
                       char *buf, size_t size)
{
    const char *given = given_value(a, flag);
    if (p->n_workers == 1 && given != NULL)
        snprintf(buf, size, "%s (--%s)", given, flag);
    else
        snprintf(buf, size, "%d", capped(p->threads, max));
}

static void describe_threads(const node_args *a, const node_plan *p)
{
    char grpc[64], http[64], cpu[64] = "as given";
    io_threads(a, p, "grpc-threads", WORKER_GRPC_THREADS_MAX, grpc, sizeof grpc);
    io_threads(a, p, "http-threads", WORKER_HTTP_THREADS_MAX, http, sizeof http);
    if (p->cpu_plugin_threads > 0)
        snprintf(cpu, sizeof cpu, "%d", p->cpu_plugin_threads);
    else if (strcmp(p->platform.name, "cpu") != 0)
        snprintf(cpu, sizeof cpu, "none (%s plugin)", p->platform.name);
    pjs_info("node: %zu worker%s on the %s plugin; each: a share of %d thread%s (%s), gRPC "
             "threads %s, HTTP threads %s, CPU plugin threads %s",
             p->n_workers, p->n_workers == 1 ? "" : "s", p->platform.name, p->threads,
             p->threads == 1 ? "" : "s",
             a->worker_threads > 0 ? "--worker-threads" : "CPUs / workers, at most 16", grpc,
             http, cpu);
}

/* Appends one argument to a worker's argv (room was made for every one). */
static void push(node_worker *w, const char *s)
{
    w->argv[w->argc++] = strdup(s);
}

static void push_int(node_worker *w, const char *flag, int v)
{
    char num[16];
    snprintf(num, sizeof num, "%d", v);
    push(w, flag);
    push(w, num);
}

/* Who follows the repository in dynamic mode: the one worker itself, or,
 * behind a gateway, the node alone (one watcher, so every worker changes
 * together; workers that each polled would switch one by one). A mode other
 * than dynamic goes to the workers as given (they check its value). */
static int plan_lifecycle(const node_args *a, node_plan *p)
{
    const char *mode = given_value(a, "model-control-mode");
    const char *watch = given_value(a, "repository-watch"); /* external: nobody here watches */
    p->node_watches = p->n_workers > 1 && (mode == NULL || strcmp(mode, "dynamic") == 0) &&
                      (watch == NULL || strcmp(watch, "external") != 0);
    p->poll_ms = 1000;
    const char *poll = given_value(a, "repository-poll-ms");
    if (p->node_watches && poll != NULL)
        return parse_long("repository-poll-ms", poll, 1, 86400000, &p->poll_ms);
    return PJS_EXIT_OK;
}

/* Builds each worker's command line. */
static int plan_argv(const node_args *a, node_plan *p)
{
    bool single = p->n_workers == 1;
    for (size_t i = 0; i < p->n_workers; i++) {
        node_worker *w = &p->workers[i];
        w->argv = calloc(2 * a->n_given + 40, sizeof *w->argv);
        if (w->argv == NULL)
            return pjs_cli_fail("out of memory");
        push(w, p->exe);
        push(w, "serve");
        for (size_t k = 0; k < a->n_given; k++) {
            const given_flag *g = &a->given[k];
            if (!single && g->flag->place == TO_PUBLIC)
                continue;
            if (p->node_watches && (strcmp(g->flag->name, "model-control-mode") == 0 ||
                                    strcmp(g->flag->name, "repository-poll-ms") == 0 ||
                                    strcmp(g->flag->name, "repository-watch") == 0))
                continue;
            char name[96];
            snprintf(name, sizeof name, "--%s", g->flag->name);
            push(w, name);
            if (strcmp(g->flag->name, "shared-weights") == 0)
                push(w, p->shared_weights); /* `auto` made into a directory */
            else if (g->value != NULL)
                push(w, g->value);
        }
        if (!single || given_value(a, "grpc-threads") == NULL)
            push_int(w, "--grpc-threads", capped(p->threads, WORKER_GRPC_THREADS_MAX));
        if (!single || given_value(a, "http-threads") == NULL)
            push_int(w, "--http-threads", capped(p->threads, WORKER_HTTP_THREADS_MAX));
        if (p->cpu_plugin_threads > 0)
            push_int(w, "--cpu-intra-op-threads", p->cpu_plugin_threads);
        if (p->node_watches) {
            push(w, "--repository-watch");
            push(w, "external");
        }
        if (single) {
            push(w, "--node-status-file");
            push(w, p->status_file);
        } else {
            push(w, "--grpc-host");
            push(w, w->grpc);
            push(w, "--http-host");
            push(w, w->http);
            push(w, "--metrics-host");
            push(w, w->metrics);
            push(w, "--admin-token-file");
            push(w, p->token_file);
        }
        if (single && w->http_port != 0 && given_value(a, "http-port") != NULL &&
            strcmp(given_value(a, "http-port"), "0") == 0) {
            /* REST off in public: a loopback port for the node's probes. */
            push(w, "--http-host");
            push(w, "127.0.0.1");
            push_int(w, "--http-port", w->http_port);
        }
        for (size_t k = 0; k < w->argc; k++)
            if (w->argv[k] == NULL)
                return pjs_cli_fail("out of memory");
    }
    return PJS_EXIT_OK;
}

/* A port flag's value (checked by the worker; here only read). */
static int port_value(const node_args *a, const char *name, int dflt)
{
    const char *v = given_value(a, name);
    return v != NULL ? atoi(v) : dflt;
}

/* Where the node reaches a bind address from this host. */
static const char *loopback_for(const char *host)
{
    if (host == NULL || strcmp(host, "0.0.0.0") == 0 || host[0] == '\0')
        return "127.0.0.1";
    if (strcmp(host, "::") == 0 || strcmp(host, "[::]") == 0)
        return "::1";
    return host;
}

/* Ports and addresses of every worker. */
static int plan_ports(const node_args *a, node_plan *p)
{
    pjs_error err;
    /* The public ports are bound later (by the one worker, or by the
     * gateway once the workers run): free now, and not to be picked. */
    int public_ports[3] = {port_value(a, "grpc-port", 8001), port_value(a, "http-port", 8000),
                           port_value(a, "metrics-port", 8002)};
    if (p->n_workers == 1) {
        node_worker *w = &p->workers[0];
        const char *host = given_value(a, "host") ? given_value(a, "host") : "0.0.0.0";
        const char *http_host = given_value(a, "http-host") ? given_value(a, "http-host") : host;
        const char *grpc_host = given_value(a, "grpc-host") ? given_value(a, "grpc-host") : host;
        w->grpc_port = public_ports[0];
        w->http_port = public_ports[1];
        w->probe_host = loopback_for(http_host);
        if (w->http_port == 0) {
            int port[1];
            if (pjs_node_free_ports(port, 1, public_ports, 3, &err) != 0)
                return pjs_cli_fail("%s", err.msg);
            w->http_port = port[0];
            w->probe_host = "127.0.0.1";
            http_host = "127.0.0.1";
        }
        snprintf(w->grpc, sizeof w->grpc, "%s:%d", grpc_host, w->grpc_port);
        snprintf(w->http, sizeof w->http, "%s:%d", http_host, w->http_port);
        return PJS_EXIT_OK;
    }
    /* Behind the gateway: Unix sockets in the private run directory, no
     * TCP port (nothing another user can reach, take first or probe). */
    for (size_t i = 0; i < p->n_workers; i++) {
        node_worker *w = &p->workers[i];
        char *addrs[3] = {w->grpc, w->http, w->metrics};
        static const char *const kinds[3] = {"grpc", "http", "metrics"};
        for (size_t k = 0; k < 3; k++) {
            char name[64];
            pjs_node_worker_socket_name(name, sizeof name, i, kinds[k]);
            int n = snprintf(addrs[k], sizeof w->grpc, PJS_UNIX_PREFIX "%s/%s", p->run_dir.path,
                             name);
            if (n < 0 || (size_t)n - strlen(PJS_UNIX_PREFIX) > PJS_UNIX_PATH_MAX)
                return pjs_cli_fail("run directory %s: too long a path for the workers' Unix "
                                    "sockets (at most %zu bytes with \"/%s\"); give a shorter "
                                    "--run-dir",
                                    p->run_dir.path, (size_t)PJS_UNIX_PATH_MAX, name);
        }
        w->probe_host = w->http;
    }
    return PJS_EXIT_OK;
}

/* The run directory and the worker token in it. The workers are told the
 * paths of their files there and open them by path: the directory is this
 * user's and mode 0700 (checked on its descriptor), so nobody else can put
 * anything at those paths. */
static int plan_run_dir(const node_args *a, node_plan *p)
{
    pjs_error err;
    if (pjs_node_run_dir_create(a->run_dir, &p->run_dir, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    snprintf(p->status_file, sizeof p->status_file, "%s/%s", p->run_dir.path,
             PJS_NODE_STATUS_NAME);
    snprintf(p->token_file, sizeof p->token_file, "%s/%s", p->run_dir.path,
             PJS_NODE_TOKEN_NAME);
    if (p->n_workers > 1 &&
        pjs_node_write_token(p->run_dir.fd, PJS_NODE_TOKEN_NAME, p->token, &err) != 0)
        return pjs_cli_fail("run directory %s: %s", p->run_dir.path, err.msg);
    return PJS_EXIT_OK;
}

static void plan_cleanup(node_plan *p)
{
    pjs_node_run_dir_close(&p->run_dir);
    if (p->shared_weights_made)
        pjs_wstore_dir_remove(p->shared_weights);
    for (size_t i = 0; i < p->n_workers; i++) {
        for (size_t k = 0; k < p->workers[i].argc; k++)
            free(p->workers[i].argv[k]);
        free(p->workers[i].argv);
    }
}

/* --shared-weights: `auto` makes a fresh private directory for this node's
 * workers (a fixed name under /dev/shm could be made first by another
 * user, and would then be refused); a DIR given is opened and checked here
 * as the workers will, so one they would refuse stops the node at once,
 * with the store's message, rather than every worker in turn. */
static int plan_shared_weights(const node_args *a, node_plan *p)
{
    const char *dir = given_value(a, "shared-weights");
    const char *group = given_value(a, "shared-weights-group");
    if (dir == NULL)
        return PJS_EXIT_OK;
    pjs_error err;
    if (strcmp(dir, "auto") == 0) {
        if (group != NULL)
            return pjs_cli_usage_error("node", "--shared-weights auto makes a directory for "
                                               "this node's workers alone; "
                                               "--shared-weights-group needs a DIR that "
                                               "workers of other users share");
        if (pjs_wstore_dir_make_private("/dev/shm", p->shared_weights,
                                        sizeof p->shared_weights, &err) != 0)
            return pjs_cli_fail("%s", err.msg);
        p->shared_weights_made = true;
    } else {
        snprintf(p->shared_weights, sizeof p->shared_weights, "%s", dir);
    }
    pjs_wstore_options o = {.dir = p->shared_weights, .group = group};
    pjs_wstore *store = NULL;
    if (pjs_wstore_open(&o, &store, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    pjs_wstore_close(store);
    return PJS_EXIT_OK;
}

/* ---- the gateway (more than one worker) ---------------------------------------- */

/* What the gateway's callbacks reach: the gateway and, once started, the
 * node. */
typedef struct node_gateway {
    pjs_gateway *gw;
    _Atomic(pjs_node *) node;
    pjs_access *access;
    pjs_repo_watch *watch; /* the repository's one watcher (plan.node_watches) */
    pjs_tracer *tracer;    /* the gateway's (--trace-endpoint); NULL: off */
} node_gateway;

static char *gateway_node_status(void *ctx)
{
    node_gateway *g = ctx;
    pjs_node *n = atomic_load(&g->node);
    return n != NULL ? pjs_node_status_json(n) : strdup("{\"routing\": null, \"workers\": []}");
}

static char **gateway_models(void *ctx, size_t worker, size_t *n)
{
    node_gateway *g = ctx;
    return pjs_gw_pool_models(pjs_gateway_pool(g->gw), worker, n);
}

/* A restarted worker gets no traffic until the gateway has sent it the
 * changes made through it (pjs_gw_pool_probe_worker, when it answers). */
static void gateway_restarted(void *ctx, size_t worker)
{
    node_gateway *g = ctx;
    pjs_gw_pool_worker_restarted(pjs_gateway_pool(g->gw), worker);
}

/* A worker is ready for the node once the gateway routes to it. */
static bool gateway_worker_ready(void *ctx, size_t worker)
{
    node_gateway *g = ctx;
    return pjs_gw_pool_probe_worker(pjs_gateway_pool(g->gw), worker);
}

/* The node's repository watcher: a settled change of bundle `name` made on
 * every worker through the gateway's pool, which remembers it for a worker
 * restarted later and routes the model only to workers that can serve it
 * meanwhile. Acted on whatever the outcome, as serve's watcher does. */
static bool repository_changed(void *ctx, const char *name, uint64_t before, uint64_t now)
{
    node_gateway *g = ctx;
    pjs_gw_change change = {.kind = now == 0 ? PJS_GW_CHANGE_UNLOAD : PJS_GW_CHANGE_LOAD,
                            .model = name, .repository = true};
    const char *what = now == 0      ? "removed, dropping it"
                       : before == 0 ? "added, loading it"
                                     : "changed, reloading it";
    pjs_info("repository: model %s %s on every worker", name, what);
    pjs_gw_applied r;
    pjs_gw_pool_apply_change(pjs_gateway_pool(g->gw), &change, &r);
    if (r.accepted == 0 && r.refused > 0 && now != 0 && before != 0)
        pjs_warn("repository: changed model %s failed to load, the previous version keeps "
                 "serving on every worker; not retried until its bundle changes again: %s",
                 name, r.refusal);
    else if (r.accepted == 0 && r.refused > 0 && now != 0)
        pjs_warn("repository: new model %s failed to load; not retried until its bundle "
                 "changes: %s",
                 name, r.refusal);
    else
        pjs_info("repository: model %s: %u workers took the change, %u refused it, %u not "
                 "reached, %u still starting (they get it once up)",
                 name, r.accepted, r.refused, r.unreached, r.later);
    return true;
}

/* Fills the gateway's options from the public flags. */
static int gateway_options(const node_args *a, const node_plan *p, pjs_gw_worker_addr *addrs,
                           node_gateway *ng, pjs_gateway_options *o)
{
    memset(o, 0, sizeof *o);
    for (size_t i = 0; i < p->n_workers; i++) {
        snprintf(addrs[i].grpc, sizeof addrs[i].grpc, "%s", p->workers[i].grpc);
        snprintf(addrs[i].http, sizeof addrs[i].http, "%s", p->workers[i].http);
        snprintf(addrs[i].metrics, sizeof addrs[i].metrics, "%s", p->workers[i].metrics);
    }
    o->pool.workers = addrs;
    o->pool.n_workers = p->n_workers;
    pjs_gw_routing_parse(a->routing, &o->pool.routing);
    o->pool.lpt_devices_per_model = (unsigned)a->lpt_k;
    o->pool.worker_token = p->token;
    /* The public flags, parsed as serve and the gateway parse them. */
    pjs_cli_endpoint ep;
    pjs_cli_endpoint_init(&ep);
    for (size_t i = 0; i < a->n_given; i++)
        if (a->given[i].flag->place != TO_WORKERS &&
            pjs_cli_endpoint_option_named(&ep, "node", a->given[i].flag->name,
                                          a->given[i].value) < 0)
            return PJS_EXIT_USAGE;
    int rc = pjs_cli_endpoint_check(&ep, "node");
    if (rc != PJS_EXIT_OK)
        return rc;
    pjs_error err;
    if (pjs_access_create(ep.admin_token_file, ep.infer_token_file, &ng->access, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    pjs_file_limit files;
    pjs_file_limit_raise(&files);
    pjs_cli_endpoint_ports(&ep, ng->access, files.grpc_share, &o->grpc, &o->http, &o->metrics);
    o->max_request_bytes = ep.max_request_bytes;
    o->max_inflight_request_bytes = ep.max_inflight_request_bytes;
    o->pool.strict_readiness = ep.strict_readiness;
    o->node_status = gateway_node_status;
    o->node_ctx = ng;
    rc = pjs_cli_endpoint_tracer(&ep, "pjserve-gateway", &ng->tracer);
    o->tracer = ng->tracer;
    return rc;
}

/* ---- running ------------------------------------------------------------------ */

static int run(const node_args *a, node_plan *p, const sigset_t *stop_signals)
{
    pjs_node_worker_spec specs[PJS_NODE_MAX_WORKERS];
    for (size_t i = 0; i < p->n_workers; i++) {
        node_worker *w = &p->workers[i];
        specs[i] = (pjs_node_worker_spec){.device = w->device, .argv = w->argv, .env = w->env,
                                          .probe_host = w->probe_host,
                                          .probe_port = w->http_port, .grpc = w->grpc,
                                          .http = w->http};
    }
    pjs_node_options o = {
        .workers = specs,
        .n_workers = p->n_workers,
        .routing = a->routing,
        .status_dir_fd = p->run_dir.fd,
        .status_name = p->n_workers == 1 ? PJS_NODE_STATUS_NAME : NULL,
        .probe_interval_ms = (unsigned)a->health_interval_ms,
        .probe_timeout_ms = (unsigned)a->health_timeout_ms,
        .unhealthy_after = (unsigned)a->unhealthy_after,
        .stop_timeout_ms = (unsigned)a->stop_timeout_s * 1000,
    };
    pjs_node_restart_policy_init(&o.restart);
    o.restart.max_restarts = (unsigned)a->max_restarts;
    o.restart.window_ms = (unsigned)a->restart_window_s * 1000;
    o.restart.stable_ms = (unsigned)a->restart_stable_s * 1000;

    static node_gateway ng;
    static pjs_gw_worker_addr addrs[PJS_NODE_MAX_WORKERS];
    pjs_error err;
    char where[320];
    snprintf(where, sizeof where, "%s", p->workers[0].http);
    if (p->n_workers > 1) {
        pjs_gateway_options go;
        int rc = gateway_options(a, p, addrs, &ng, &go);
        if (rc == PJS_EXIT_OK && pjs_gateway_start(&go, &ng.gw, &err) != 0)
            rc = pjs_cli_fail("gateway: %s", err.msg);
        if (rc != PJS_EXIT_OK) {
            pjs_access_destroy(ng.access);
            pjs_tracer_destroy(ng.tracer);
            return rc;
        }
        pjs_info("gateway: gRPC %s:%d, HTTP %s:%d, metrics %s:%d over %zu workers (%s)",
                 go.grpc.host, go.grpc.port, go.http.host, go.http.port, go.metrics.host,
                 go.metrics.port, p->n_workers, a->routing);
        snprintf(where, sizeof where, "%s:%d", go.http.host, go.http.port);
        o.models = gateway_models;
        o.restarted = gateway_restarted;
        o.ready = gateway_worker_ready;
        o.ctx = &ng;
    }
    if (p->node_watches) {
        /* Before the workers start: what they load at start is the state
         * it counts as acted on. */
        pjs_info("model control mode dynamic: the node watches %s and has every worker load, "
                 "reload or drop what changed (workers: --repository-watch external)",
                 given_value(a, "model-repository"));
        if (pjs_repo_watch_start(given_value(a, "model-repository"), (uint64_t)p->poll_ms,
                                 repository_changed, &ng, &ng.watch, &err) != 0) {
            pjs_gateway_stop(ng.gw);
            pjs_access_destroy(ng.access);
            pjs_tracer_destroy(ng.tracer);
            return pjs_cli_fail("%s", err.msg);
        }
    }
    pjs_node *node = NULL;
    int rc = PJS_EXIT_OK;
    if (pjs_node_start(&o, &node, &err) != 0)
        rc = pjs_cli_fail("%s", err.msg);
    if (rc == PJS_EXIT_OK) {
        atomic_store(&ng.node, node);
        pjs_info("node: supervising %zu worker%s (status: GET /v2/pjserve/node on %s; ctrl-c "
                 "stops)",
                 p->n_workers, p->n_workers == 1 ? "" : "s", where);
        int sig = 0;
        rc = pjs_node_run(node, stop_signals, &sig);
        if (rc == 0)
            pjs_info("%s received: draining every worker, then stopping",
                     sig == SIGINT ? "SIGINT" : "SIGTERM");
        else
            pjs_info("stopping the workers");
    }
    /* The watcher first (it waits for a change in progress), then the
     * gateway: it refuses new requests and lets those in flight finish on
     * the workers, which then drain and stop. */
    pjs_repo_watch_stop(ng.watch);
    ng.watch = NULL;
    if (ng.gw != NULL)
        pjs_gateway_stop(ng.gw);
    atomic_store(&ng.node, NULL);
    pjs_node_stop(node);
    pjs_node_destroy(node);
    pjs_access_destroy(ng.access);
    pjs_tracer_destroy(ng.tracer);
    if (rc == 0)
        pjs_info("node stopped");
    return rc;
}

int pjs_cmd_node(int argc, char **argv)
{
    static node_args a;
    static node_plan p;
    memset(&a, 0, sizeof a);
    memset(&p, 0, sizeof p);
    p.run_dir.fd = p.run_dir.parent_fd = -1;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? PJS_EXIT_OK : rc;
    ssize_t len = readlink("/proc/self/exe", p.exe, sizeof p.exe - 1);
    if (len <= 0)
        return pjs_cli_fail("cannot find the pjserve binary (/proc/self/exe)");
    p.exe[len] = '\0';

    sigset_t stop_signals;
    pjs_cli_block_stop_signals(&stop_signals);

    rc = plan_devices(&a, &p);
    if (rc == PJS_EXIT_OK) {
        plan_threads(&a, &p);
        describe_threads(&a, &p);
        rc = plan_run_dir(&a, &p);
    }
    if (rc == PJS_EXIT_OK)
        rc = plan_ports(&a, &p);
    if (rc == PJS_EXIT_OK)
        rc = plan_shared_weights(&a, &p);
    if (rc == PJS_EXIT_OK)
        rc = plan_lifecycle(&a, &p);
    if (rc == PJS_EXIT_OK)
        rc = plan_argv(&a, &p);
    if (rc == PJS_EXIT_OK)
        rc = run(&a, &p, &stop_signals);
    plan_cleanup(&p);
    return rc;
}
