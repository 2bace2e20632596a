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
 * The scheduler's configuration is built after the command line is read:
 * defaults, then --config FILE, then PJSERVE_SCHEDULER_* variables, then the
 * scheduler flags in the order given (server/config.h), so a flag wins
 * wherever it stands on the command line.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
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
    "SIGINT or SIGTERM stops accepting requests, answers every accepted one, and\n"
    "exits 0. Triton clients (tritonclient, perf_analyzer) work unchanged.\n"
    "\n"
    "options:\n"
    "  --model-repository DIR  directory of model bundles (required)\n"
    "  --host ADDR             address to listen on (default 0.0.0.0)\n"
    "  --grpc-port N           gRPC port (default 8001; 0 turns gRPC off)\n"
    "  --http-port N           HTTP/REST port (default 8000; 0 turns HTTP off)\n"
    "  --metrics-port N        Prometheus /metrics port (default 8002; 0: off)\n"
    "  --allow-client-shm      let clients register system shared memory regions\n"
    "                          (off by default: a client could point the server at\n"
    "                          any shared memory object it can name)\n"
    "  --grpc-tls-cert FILE    serve gRPC over TLS with this PEM certificate chain\n"
    "  --grpc-tls-key FILE     ... and this PEM private key\n"
    "  --grpc-tls-ca FILE      require client certificates signed by this CA (mTLS)\n"
    "  --grpc-keepalive-time-ms N     ping idle connections every N ms\n"
    "  --grpc-keepalive-timeout-ms N  close a connection whose ping gets no answer\n"
    "  --grpc-keepalive-permit-without-calls  allow client pings with no call open\n"
    "  --grpc-threads N        gRPC completion-queue threads (default 4)\n"
    "  --http-threads N        HTTP connection threads (default 4)\n"
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
    "                          measure costs, 0..100 (default 2)\n"
    "                          [PJSERVE_SCHEDULER_WARMUP_RUNS]\n"
    "  --model-weight NAME=W   fair-share weight of model NAME (default: its\n"
    "                          manifest's weight); repeatable; no environment form\n"
    "\n"
    "common:\n" PJS_CLI_COMMON_HELP
    "\n"
    "example:\n"
    "  make models && pjserve serve --model-repository models\n"
    "  curl localhost:8000/v2/models/mlp\n";

/* Most scheduler flags one command line may give. */
#define MAX_SETTINGS 128

/* A scheduler flag, applied after the file and the environment. */
typedef struct serve_setting {
    const char *flag;
    char key[192];            /* "scheduler.discipline", "models.mlp.weight" */
    const char *value;
} serve_setting;

typedef struct serve_args {
    const char *repository;
    const char *host;
    int grpc_port, http_port, metrics_port;
    bool allow_client_shm;
    pjs_grpc_options grpc;
    int http_threads;
    const char *config_path;
    serve_setting settings[MAX_SETTINGS];
    size_t n_settings;
    pjs_cli_common common;
} serve_args;

enum {
    OPT_REPOSITORY = 0x200,
    OPT_HOST,
    OPT_GRPC_PORT,
    OPT_HTTP_PORT,
    OPT_METRICS_PORT,
    OPT_ALLOW_SHM,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TLS_CA,
    OPT_KEEPALIVE_TIME,
    OPT_KEEPALIVE_TIMEOUT,
    OPT_KEEPALIVE_PERMIT,
    OPT_GRPC_THREADS,
    OPT_HTTP_THREADS,
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
};

/* The flags that set one scheduler key each. */
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
};
#define N_SCHED_FLAGS (sizeof sched_flags / sizeof sched_flags[0])

/* Parses a non-negative integer option no larger than max. */
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

/* Records a scheduler flag (opt one of sched_flags, or --model-weight). */
static int add_setting(serve_args *a, int opt, const char *arg)
{
    if (a->n_settings == MAX_SETTINGS)
        return pjs_cli_usage_error("serve", "at most %d scheduler flags", MAX_SETTINGS);
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
        {"model-repository", required_argument, NULL, OPT_REPOSITORY},
        {"host", required_argument, NULL, OPT_HOST},
        {"grpc-port", required_argument, NULL, OPT_GRPC_PORT},
        {"http-port", required_argument, NULL, OPT_HTTP_PORT},
        {"metrics-port", required_argument, NULL, OPT_METRICS_PORT},
        {"allow-client-shm", no_argument, NULL, OPT_ALLOW_SHM},
        {"grpc-tls-cert", required_argument, NULL, OPT_TLS_CERT},
        {"grpc-tls-key", required_argument, NULL, OPT_TLS_KEY},
        {"grpc-tls-ca", required_argument, NULL, OPT_TLS_CA},
        {"grpc-keepalive-time-ms", required_argument, NULL, OPT_KEEPALIVE_TIME},
        {"grpc-keepalive-timeout-ms", required_argument, NULL, OPT_KEEPALIVE_TIMEOUT},
        {"grpc-keepalive-permit-without-calls", no_argument, NULL, OPT_KEEPALIVE_PERMIT},
        {"grpc-threads", required_argument, NULL, OPT_GRPC_THREADS},
        {"http-threads", required_argument, NULL, OPT_HTTP_THREADS},
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
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    a->host = "0.0.0.0";
    a->grpc_port = 8001;
    a->http_port = 8000;
    a->metrics_port = 8002;
    int opt;
    long v = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *flag = optind > 1 ? argv[optind - 1] : "";
        int bad = 0;
        switch (opt) {
        case 'h': fputs(help, stdout); return -1;
        case OPT_REPOSITORY: a->repository = optarg; break;
        case OPT_HOST: a->host = optarg; break;
        case OPT_GRPC_PORT:
            bad = parse_int("--grpc-port", optarg, 65535, &v);
            a->grpc_port = (int)v;
            break;
        case OPT_HTTP_PORT:
            bad = parse_int("--http-port", optarg, 65535, &v);
            a->http_port = (int)v;
            break;
        case OPT_METRICS_PORT:
            bad = parse_int("--metrics-port", optarg, 65535, &v);
            a->metrics_port = (int)v;
            break;
        case OPT_ALLOW_SHM: a->allow_client_shm = true; break;
        case OPT_TLS_CERT: a->grpc.tls_cert = optarg; break;
        case OPT_TLS_KEY: a->grpc.tls_key = optarg; break;
        case OPT_TLS_CA: a->grpc.tls_ca = optarg; break;
        case OPT_KEEPALIVE_TIME:
            bad = parse_int("--grpc-keepalive-time-ms", optarg, 1L << 30, &v);
            a->grpc.keepalive_time_ms = (int)v;
            break;
        case OPT_KEEPALIVE_TIMEOUT:
            bad = parse_int("--grpc-keepalive-timeout-ms", optarg, 1L << 30, &v);
            a->grpc.keepalive_timeout_ms = (int)v;
            break;
        case OPT_KEEPALIVE_PERMIT: a->grpc.keepalive_permit_without_calls = true; break;
        case OPT_GRPC_THREADS:
            bad = parse_int("--grpc-threads", optarg, 256, &v);
            a->grpc.threads = (int)v;
            break;
        case OPT_HTTP_THREADS:
            bad = parse_int("--http-threads", optarg, 256, &v);
            a->http_threads = (int)v;
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
        case OPT_WARMUP_RUNS: bad = add_setting(a, opt, optarg); break;
        default: {
            int r = pjs_cli_common_option(&a->common, opt, optarg);
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
    if ((a->grpc.tls_cert == NULL) != (a->grpc.tls_key == NULL))
        return pjs_cli_usage_error("serve", "--grpc-tls-cert and --grpc-tls-key go together");
    if (a->grpc.tls_ca != NULL && a->grpc.tls_cert == NULL)
        return pjs_cli_usage_error("serve",
                                   "--grpc-tls-ca needs --grpc-tls-cert and --grpc-tls-key");
    return PJS_EXIT_OK;
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

/* Logs the effective scheduler settings and model policies, once. */
static void log_config(const pjs_server_config *c)
{
    char line[512];
    pjs_server_config_describe(c, line, sizeof line);
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
    log_config(&config);

    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    pjs_server_options so = {
        .repository = a.repository,
        .plugin_path = a.common.plugin_path,
        .cache_dir = a.common.cache_dir,
        .no_cache = a.common.no_cache,
        .pjrt_options = a.common.pjrt_options,
        .n_pjrt_options = a.common.n_pjrt_options,
        .allow_client_shm = a.allow_client_shm,
        .config = &config,
    };
    pjs_error err;
    pjs_server *server = NULL;
    pjs_grpc_frontend *grpc = NULL;
    pjs_http_frontend *http = NULL, *metrics = NULL;
    if (pjs_server_create(&so, &server, &err) != 0) {
        pjs_server_config_free(&config);
        return pjs_cli_fail("%s", err.msg);
    }

    a.grpc.host = a.host;
    a.grpc.port = a.grpc_port;
    pjs_http_options ho = {.host = a.host, .port = a.http_port, .threads = a.http_threads};
    pjs_http_options mo = {.host = a.host, .port = a.metrics_port, .threads = 1};
    rc = PJS_EXIT_OK;
    if (a.grpc_port != 0 && pjs_grpc_frontend_start(server, &a.grpc, &grpc, &err) != 0)
        rc = pjs_cli_fail("gRPC on %s:%d: %s", a.host, a.grpc_port, err.msg);
    if (rc == PJS_EXIT_OK && a.http_port != 0 &&
        pjs_http_frontend_start(server, &ho, &http, &err) != 0)
        rc = pjs_cli_fail("HTTP on %s:%d: %s", a.host, a.http_port, err.msg);
    if (rc == PJS_EXIT_OK && a.metrics_port != 0 &&
        pjs_metrics_frontend_start(server, &mo, &metrics, &err) != 0)
        rc = pjs_cli_fail("metrics on %s:%d: %s", a.host, a.metrics_port, err.msg);

    if (rc == PJS_EXIT_OK) {
        pjs_info("serving: gRPC %s:%d%s, HTTP %s:%d, metrics %s:%d/metrics (ctrl-c stops)",
                 a.host, a.grpc_port, a.grpc.tls_cert ? " (TLS)" : "", a.host, a.http_port,
                 a.host, a.metrics_port);
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
    pjs_server_config_free(&config);
    if (rc == PJS_EXIT_OK)
        pjs_info("stopped");
    return rc;
}
