/*
 * cmd_gateway.c - `pjserve gateway`: one public KServe V2 endpoint over
 * pjserve workers (gateway/gateway.h), until SIGINT or SIGTERM.
 *
 * Workers come from --worker (repeatable) and from a DNS name the pool
 * resolves again and again (--worker-dns, e.g. a Kubernetes headless
 * Service). The gateway
 * links no PJRT: it loads no plugin and compiles nothing.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/endpoint.h"
#include "core/file_limit.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "gateway/gateway.h"

static const char help[] =
    "usage: pjserve gateway (--worker ADDR ... | --worker-dns NAME) [OPTIONS]\n"
    "\n"
    "Serves KServe V2 over gRPC and HTTP/REST (with Prometheus metrics) in front of\n"
    "pjserve workers (`pjserve serve` processes): each request for a model goes to\n"
    "a worker holding it; repository loads and unloads and shared memory\n"
    "registrations go to every worker; the repository index and statistics are\n"
    "merged. Request bytes are forwarded as they are: tensors are never decoded.\n"
    "Workers are probed every 500 ms; one that fails 3 probes, or 5 requests in a\n"
    "row, gets no traffic until it answers again. A request is retried on another\n"
    "worker only when it never reached one (connection refused). SIGINT or SIGTERM\n"
    "answers the requests in flight and exits 0. `pjserve node` runs one of these\n"
    "for you over the workers it starts (docs/node.md).\n"
    "Readiness: ready while some worker takes traffic; with --strict-readiness true\n"
    "(the default) also only while every such worker answers ServerReady true, as\n"
    "serve over the same repository would (start the workers with the same flag).\n"
    "\n"
    "workers:\n"
    "  --worker ADDR           grpc=HOST:PORT,http=HOST:PORT[,metrics=HOST:PORT], or\n"
    "                          HOST for ports 8001, 8000 and 8002; repeatable (at\n"
    "                          most 64); /metrics includes the workers' metrics\n"
    "  --worker-dns NAME       every address NAME resolves to is a worker (a\n"
    "                          Kubernetes headless Service), with the ports below;\n"
    "                          resolved again every 10 s: new addresses join,\n"
    "                          vanished ones get no traffic (64 workers at most)\n"
    "  --worker-grpc-port N    gRPC port of --worker-dns workers (default 8001)\n"
    "  --worker-http-port N    HTTP port of --worker-dns workers (default 8000)\n"
    "  --worker-metrics-port N metrics port of --worker-dns workers (default 8002)\n"
    "  --worker-token-file F   token the workers take as admin token (their\n"
    "                          --admin-token-file): sent with every forwarded call\n"
    "  --routing POLICY        round_robin (default): a model's requests spread over\n"
    "                          every worker holding it; lpt_packing: each model on K\n"
    "                          workers, placed longest-processing-time first from the\n"
    "                          device time the workers measured (rebalanced every 5 s\n"
    "                          when that lowers the busiest worker's load by a tenth)\n"
    "  --lpt-devices-per-model K  workers per model under lpt_packing (default 1)\n"
    "\n"
    PJS_CLI_ENDPOINT_HELP
    "\n"
    "other:\n"
    "  --log-level LEVEL       debug | info | warn | error (default info)\n"
    "\n"
    "example:\n"
    "  pjserve gateway --worker grpc=127.0.0.1:9001,http=127.0.0.1:9000 \\\n"
    "                  --worker grpc=127.0.0.1:9011,http=127.0.0.1:9010\n";

enum {
    OPT_WORKER = 0x200,
    OPT_WORKER_DNS,
    OPT_WORKER_GRPC_PORT,
    OPT_WORKER_HTTP_PORT,
    OPT_WORKER_METRICS_PORT,
    OPT_WORKER_TOKEN,
    OPT_ROUTING,
    OPT_LPT_K,
    OPT_LOG_LEVEL,
    OPT_HELP,
};

typedef struct gateway_args {
    pjs_gw_worker_addr workers[PJS_GW_MAX_WORKERS];
    size_t n_workers;
    const char *worker_dns;
    int worker_grpc_port, worker_http_port, worker_metrics_port;
    const char *worker_token_file;
    pjs_gw_routing routing;
    unsigned lpt_k;
    pjs_cli_endpoint endpoint; /* the public ports, as serve's */
} gateway_args;

static int parse_port(const char *flag, const char *arg, int *out)
{
    char *end;
    long v = strtol(arg, &end, 10);
    if (*arg == '\0' || *end != '\0' || v < 0 || v > 65535)
        return pjs_cli_usage_error("gateway", "%s %s: expected a port, 0 to 65535", flag, arg);
    *out = (int)v;
    return 0;
}

static int add_worker(gateway_args *a, const char *spec)
{
    if (a->n_workers == PJS_GW_MAX_WORKERS)
        return pjs_cli_usage_error("gateway", "at most %d workers", PJS_GW_MAX_WORKERS);
    pjs_error err;
    if (pjs_gw_worker_addr_parse(spec, &a->workers[a->n_workers], &err) != 0)
        return pjs_cli_usage_error("gateway", "%s", err.msg);
    a->n_workers++;
    return 0;
}

static int parse_args(int argc, char **argv, gateway_args *a)
{
    static const struct option opts[] = {
        PJS_CLI_ENDPOINT_LONG_OPTIONS,
        {"worker", required_argument, NULL, OPT_WORKER},
        {"worker-dns", required_argument, NULL, OPT_WORKER_DNS},
        {"worker-grpc-port", required_argument, NULL, OPT_WORKER_GRPC_PORT},
        {"worker-http-port", required_argument, NULL, OPT_WORKER_HTTP_PORT},
        {"worker-metrics-port", required_argument, NULL, OPT_WORKER_METRICS_PORT},
        {"worker-token-file", required_argument, NULL, OPT_WORKER_TOKEN},
        {"routing", required_argument, NULL, OPT_ROUTING},
        {"lpt-devices-per-model", required_argument, NULL, OPT_LPT_K},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"help", no_argument, NULL, OPT_HELP},
        {0},
    };
    a->worker_grpc_port = 8001;
    a->worker_http_port = 8000;
    a->worker_metrics_port = 8002;
    pjs_cli_endpoint_init(&a->endpoint);
    a->lpt_k = 1;
    int opt, bad = 0;
    optind = 1;
    while (!bad && (opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case OPT_WORKER: bad = add_worker(a, optarg); break;
        case OPT_WORKER_DNS: a->worker_dns = optarg; break;
        case OPT_WORKER_GRPC_PORT:
            bad = parse_port("--worker-grpc-port", optarg, &a->worker_grpc_port);
            break;
        case OPT_WORKER_HTTP_PORT:
            bad = parse_port("--worker-http-port", optarg, &a->worker_http_port);
            break;
        case OPT_WORKER_METRICS_PORT:
            bad = parse_port("--worker-metrics-port", optarg, &a->worker_metrics_port);
            break;
        case OPT_WORKER_TOKEN: a->worker_token_file = optarg; break;
        case OPT_ROUTING:
            if (pjs_gw_routing_parse(optarg, &a->routing) != 0)
                bad = pjs_cli_usage_error("gateway",
                                          "--routing %s: expected round_robin or lpt_packing",
                                          optarg);
            break;
        case OPT_LPT_K: {
            char *end;
            long k = strtol(optarg, &end, 10);
            if (*end != '\0' || k < 1 || k > PJS_GW_MAX_WORKERS)
                bad = pjs_cli_usage_error("gateway", "--lpt-devices-per-model %s: expected 1 to %d",
                                          optarg, PJS_GW_MAX_WORKERS);
            a->lpt_k = (unsigned)k;
            break;
        }
        case OPT_LOG_LEVEL: {
            int level = pjs_log_parse_level(optarg);
            if (level < 0)
                bad = pjs_cli_usage_error("gateway",
                                          "--log-level %s: expected debug, info, warn or error",
                                          optarg);
            else
                pjs_log_set_level((pjs_log_level)level);
            break;
        }
        case OPT_HELP: fputs(help, stdout); return -1;
        default: {
            int r = pjs_cli_endpoint_option(&a->endpoint, "gateway", opt, optarg);
            if (r <= 0)
                return r < 0 ? PJS_EXIT_USAGE
                             : pjs_cli_usage_error("gateway", "unknown option %s",
                                                   argv[optind - 1]);
        }
        }
    }
    if (bad)
        return PJS_EXIT_USAGE;
    if (optind < argc)
        return pjs_cli_usage_error("gateway", "unexpected argument '%s'", argv[optind]);
    if (a->n_workers == 0 && a->worker_dns == NULL)
        return pjs_cli_usage_error("gateway", "no workers: give --worker ADDR (repeatable) or "
                                              "--worker-dns NAME");
    return pjs_cli_endpoint_check(&a->endpoint, "gateway");
}

/* The token in `path` (one line), malloc'd, or NULL with a message. */
static char *read_token(const char *path)
{
    pjs_error err;
    char *text = NULL;
    size_t len = 0;
    if (pjs_read_file(path, 4096, &text, &len, &err) != 0) {
        pjs_cli_fail("--worker-token-file %s: %s", path, err.msg);
        return NULL;
    }
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        text[--len] = '\0';
    if (len == 0) {
        pjs_cli_fail("--worker-token-file %s: the file is empty", path);
        free(text);
        return NULL;
    }
    return text;
}

int pjs_cmd_gateway(int argc, char **argv)
{
    gateway_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? PJS_EXIT_OK : rc;
    char *token = NULL;
    if (a.worker_token_file != NULL && (token = read_token(a.worker_token_file)) == NULL)
        return PJS_EXIT_FAILURE;
    pjs_access *access = NULL;
    pjs_error err;
    if (pjs_access_create(a.endpoint.admin_token_file, a.endpoint.infer_token_file, &access,
                          &err) != 0) {
        free(token);
        return pjs_cli_fail("%s", err.msg);
    }
    pjs_file_limit files;
    pjs_file_limit_raise(&files);

    sigset_t stop_signals;
    pjs_cli_block_stop_signals(&stop_signals);

    pjs_gateway_options o;
    memset(&o, 0, sizeof o);
    o.pool.workers = a.workers;
    o.pool.n_workers = a.n_workers;
    o.pool.routing = a.routing;
    o.pool.lpt_devices_per_model = a.lpt_k;
    o.pool.worker_token = token;
    o.pool.dns_name = a.worker_dns;
    o.pool.dns_grpc_port = a.worker_grpc_port;
    o.pool.dns_http_port = a.worker_http_port;
    o.pool.dns_metrics_port = a.worker_metrics_port;
    o.pool.strict_readiness = a.endpoint.strict_readiness;
    pjs_cli_endpoint_ports(&a.endpoint, access, files.grpc_share, &o.grpc, &o.http,
                           &o.metrics);
    o.max_request_bytes = a.endpoint.max_request_bytes;
    o.max_inflight_request_bytes = a.endpoint.max_inflight_request_bytes;
    pjs_tracer *tracer = NULL;
    rc = pjs_cli_endpoint_tracer(&a.endpoint, "pjserve-gateway", &tracer);
    if (rc != PJS_EXIT_OK) {
        pjs_access_destroy(access);
        free(token);
        return rc;
    }
    o.tracer = tracer;
    pjs_gateway *g = NULL;
    if (pjs_gateway_start(&o, &g, &err) != 0) {
        pjs_access_destroy(access);
        free(token);
        pjs_tracer_destroy(tracer);
        return pjs_cli_fail("%s", err.msg);
    }
    pjs_info("serving: gRPC %s:%d, HTTP %s:%d, metrics %s:%d/metrics over %zu workers%s%s "
             "(ctrl-c stops)",
             o.grpc.host, o.grpc.port, o.http.host, o.http.port, o.metrics.host, o.metrics.port,
             a.n_workers,
             a.worker_dns ? " and those of " : "", a.worker_dns ? a.worker_dns : "");
    int sig = 0;
    sigwait(&stop_signals, &sig);
    pjs_info("%s received: answering the requests in flight, then stopping",
             sig == SIGINT ? "SIGINT" : "SIGTERM");
    pjs_gateway_stop(g);
    pjs_tracer_destroy(tracer);
    pjs_access_destroy(access);
    free(token);
    pjs_info("stopped");
    return PJS_EXIT_OK;
}
