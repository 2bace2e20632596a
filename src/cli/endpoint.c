/*
 * endpoint.c - parsing the public endpoint's flags (endpoint.h) for serve,
 * gateway and node alike, with the same checks and the same messages.
 */
#include "cli/endpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/unix_addr.h"
#include "server/config.h"
#include "server/server.h"

/* gRPC's memory quota over the request budget by default: room for its own
 * buffers (HTTP/2 frames, metadata, responses being written). */
#define GRPC_QUOTA_SLACK ((uint64_t)64 << 20)

enum {
    EP_HOST = PJS_CLI_ENDPOINT_OPT_BASE,
    EP_GRPC_PORT,
    EP_HTTP_PORT,
    EP_METRICS_PORT,
    EP_ADMIN_TOKEN,
    EP_INFER_TOKEN,
    EP_GRPC_TLS_CERT,
    EP_GRPC_TLS_KEY,
    EP_GRPC_TLS_CA,
    EP_KEEPALIVE_TIME,
    EP_KEEPALIVE_TIMEOUT,
    EP_KEEPALIVE_PERMIT,
    EP_GRPC_THREADS,
    EP_GRPC_HOST,
    EP_GRPC_STREAMS,
    EP_GRPC_IDLE,
    EP_GRPC_HANDSHAKE,
    EP_GRPC_QUOTA,
    EP_HTTP_THREADS,
    EP_HTTP_HOST,
    EP_METRICS_HOST,
    EP_HTTP_MAX_CONNECTIONS,
    EP_HTTP_MAX_PER_IP,
    EP_HTTP_IDLE_TIMEOUT,
    EP_HTTP_HEADER_TIMEOUT,
    EP_HTTP_BODY_TIMEOUT,
    EP_HTTP_TLS_CERT,
    EP_HTTP_TLS_KEY,
    EP_HTTP_TLS_CA,
    EP_MAX_REQUEST,
    EP_MAX_INFLIGHT,
    EP_STREAM_WRITE_TIMEOUT,
    EP_STRICT_READINESS,
    EP_TRACE_ENDPOINT,
    EP_TRACE_RATE,
    EP_END,
};

static const struct option endpoint_options[] = {PJS_CLI_ENDPOINT_LONG_OPTIONS, {0}};

void pjs_cli_endpoint_init(pjs_cli_endpoint *e)
{
    memset(e, 0, sizeof *e);
    e->host = "0.0.0.0";
    e->grpc_port = 8001;
    e->http_port = 8000;
    e->metrics_port = 8002;
    e->grpc.max_concurrent_streams = 128;
    e->grpc.max_connection_idle_ms = 300000;
    e->grpc.handshake_timeout_ms = 10000;
    e->grpc.stream_write_timeout_ms = 30000;
    e->max_request_bytes = PJS_DEFAULT_MAX_REQUEST_BYTES;
    e->strict_readiness = true;
    e->trace_rate = PJS_CLI_DEFAULT_TRACE_RATE;
}

/* An integer in [min, max], or a usage error naming the flag. */
static int parse_long(const char *cmd, const char *flag, const char *arg, long min, long max,
                      long *out)
{
    char *end;
    long v = strtol(arg, &end, 10);
    if (*arg == '\0' || *end != '\0' || v < min || v > max)
        return pjs_cli_usage_error(cmd, "--%s %s: expected an integer in %ld..%ld", flag, arg,
                                   min, max);
    *out = v;
    return 0;
}

static int parse_bytes(const char *cmd, const char *flag, const char *arg, uint64_t min,
                       uint64_t max, uint64_t *out)
{
    if (!pjs_server_config_parse_bytes(arg, out))
        return pjs_cli_usage_error(cmd,
                                   "--%s %s: expected a number of bytes, optionally followed by "
                                   "K, M, G (powers of 1000) or Ki, Mi, Gi (powers of 1024) and B",
                                   flag, arg);
    if (*out < min || *out > max)
        return pjs_cli_usage_error(cmd, "--%s %s: expected %llu to %llu bytes", flag, arg,
                                   (unsigned long long)min, (unsigned long long)max);
    return 0;
}

/* The range of an integer flag; false for the others. */
static bool int_range(int opt, long *min, long *max)
{
    *min = 0;
    switch (opt) {
    case EP_GRPC_PORT:
    case EP_HTTP_PORT:
    case EP_METRICS_PORT: *max = 65535; return true;
    case EP_KEEPALIVE_TIME:
    case EP_KEEPALIVE_TIMEOUT:
    case EP_GRPC_IDLE: *max = 1L << 30; return true;
    case EP_STREAM_WRITE_TIMEOUT: *max = 86400000; return true;
    case EP_GRPC_HANDSHAKE: *min = 1, *max = 1L << 30; return true;
    case EP_GRPC_STREAMS: *min = 1, *max = 1L << 20; return true;
    case EP_GRPC_THREADS:
    case EP_HTTP_THREADS: *max = 256; return true;
    case EP_HTTP_MAX_CONNECTIONS:
    case EP_HTTP_MAX_PER_IP: *min = 1, *max = 1000000; return true;
    case EP_HTTP_IDLE_TIMEOUT:
    case EP_HTTP_HEADER_TIMEOUT:
    case EP_HTTP_BODY_TIMEOUT: *min = 1, *max = 86400; return true;
    default: return false;
    }
}

static void set_int(pjs_cli_endpoint *e, int opt, long v)
{
    switch (opt) {
    case EP_GRPC_PORT: e->grpc_port = (int)v; break;
    case EP_HTTP_PORT: e->http_port = (int)v; break;
    case EP_METRICS_PORT: e->metrics_port = (int)v; break;
    case EP_KEEPALIVE_TIME: e->grpc.keepalive_time_ms = (int)v; break;
    case EP_KEEPALIVE_TIMEOUT: e->grpc.keepalive_timeout_ms = (int)v; break;
    case EP_GRPC_IDLE: e->grpc.max_connection_idle_ms = (int)v; break;
    case EP_GRPC_HANDSHAKE: e->grpc.handshake_timeout_ms = (int)v; break;
    case EP_GRPC_STREAMS: e->grpc.max_concurrent_streams = (int)v; break;
    case EP_GRPC_THREADS: e->grpc.threads = (int)v; break;
    case EP_STREAM_WRITE_TIMEOUT: e->grpc.stream_write_timeout_ms = (int)v; break;
    case EP_HTTP_THREADS: e->http_threads = (int)v; break;
    case EP_HTTP_MAX_CONNECTIONS: e->http.max_connections = (unsigned)v; break;
    case EP_HTTP_MAX_PER_IP: e->http.max_connections_per_ip = (unsigned)v; break;
    case EP_HTTP_IDLE_TIMEOUT: e->http.idle_timeout_s = (unsigned)v; break;
    case EP_HTTP_HEADER_TIMEOUT: e->http.header_timeout_s = (unsigned)v; break;
    default: e->http.body_timeout_s = (unsigned)v; break;
    }
}

int pjs_cli_endpoint_option(pjs_cli_endpoint *e, const char *cmd, int opt, const char *arg)
{
    if (opt < PJS_CLI_ENDPOINT_OPT_BASE || opt >= EP_END)
        return 0;
    const char *flag = endpoint_options[opt - PJS_CLI_ENDPOINT_OPT_BASE].name;
    long v = 0, min = 0, max = 0;
    if (int_range(opt, &min, &max)) {
        if (parse_long(cmd, flag, arg, min, max, &v) != 0)
            return -1;
        set_int(e, opt, v);
        return 1;
    }
    switch (opt) {
    case EP_HOST: e->host = arg; break;
    case EP_GRPC_HOST: e->grpc_host = arg; break;
    case EP_HTTP_HOST: e->http_host = arg; break;
    case EP_METRICS_HOST: e->metrics_host = arg; break;
    case EP_ADMIN_TOKEN: e->admin_token_file = arg; break;
    case EP_INFER_TOKEN: e->infer_token_file = arg; break;
    case EP_GRPC_TLS_CERT: e->grpc.tls_cert = arg; break;
    case EP_GRPC_TLS_KEY: e->grpc.tls_key = arg; break;
    case EP_GRPC_TLS_CA: e->grpc.tls_ca = arg; break;
    case EP_HTTP_TLS_CERT: e->http.tls_cert = arg; break;
    case EP_HTTP_TLS_KEY: e->http.tls_key = arg; break;
    case EP_HTTP_TLS_CA: e->http.tls_ca = arg; break;
    case EP_KEEPALIVE_PERMIT: e->grpc.keepalive_permit_without_calls = true; break;
    case EP_STRICT_READINESS:
        if (strcmp(arg, "true") != 0 && strcmp(arg, "false") != 0) {
            pjs_cli_usage_error(cmd, "--%s %s: expected true or false", flag, arg);
            return -1;
        }
        e->strict_readiness = strcmp(arg, "true") == 0;
        break;
    case EP_TRACE_ENDPOINT:
        if (strncmp(arg, "http://", 7) != 0 && strncmp(arg, "https://", 8) != 0) {
            pjs_cli_usage_error(cmd,
                                "--%s %s: expected the collector's OTLP/HTTP traces URL, "
                                "e.g. http://127.0.0.1:4318/v1/traces",
                                flag, arg);
            return -1;
        }
        e->trace_endpoint = arg;
        break;
    case EP_TRACE_RATE: {
        char *end;
        double r = strtod(arg, &end);
        if (*arg == '\0' || *end != '\0' || !(r >= 0 && r <= 1)) {
            pjs_cli_usage_error(cmd, "--%s %s: expected a share of requests, 0 to 1", flag, arg);
            return -1;
        }
        e->trace_rate = r;
        break;
    }
    case EP_GRPC_QUOTA:
        return parse_bytes(cmd, flag, arg, (uint64_t)1 << 20, UINT64_MAX,
                           &e->grpc_memory_quota) != 0 ? -1 : 1;
    case EP_MAX_REQUEST:
        return parse_bytes(cmd, flag, arg, 1, PJS_MAX_REQUEST_BYTES_LIMIT,
                           &e->max_request_bytes) != 0 ? -1 : 1;
    default:
        return parse_bytes(cmd, flag, arg, 1, UINT64_MAX, &e->max_inflight_request_bytes) != 0
                   ? -1
                   : 1;
    }
    return 1;
}

int pjs_cli_endpoint_option_named(pjs_cli_endpoint *e, const char *cmd, const char *name,
                                  const char *arg)
{
    for (size_t i = 0; endpoint_options[i].name != NULL; i++)
        if (strcmp(endpoint_options[i].name, name) == 0)
            return pjs_cli_endpoint_option(e, cmd, endpoint_options[i].val, arg);
    return 0;
}

bool pjs_cli_endpoint_is_flag(const char *name)
{
    for (size_t i = 0; endpoint_options[i].name != NULL; i++)
        if (strcmp(endpoint_options[i].name, name) == 0)
            return true;
    return false;
}

int pjs_cli_endpoint_check(pjs_cli_endpoint *e, const char *cmd)
{
    if (e->max_inflight_request_bytes == 0)
        e->max_inflight_request_bytes = 4 * e->max_request_bytes;
    if (e->max_inflight_request_bytes < e->max_request_bytes)
        return pjs_cli_usage_error(cmd,
                                   "--max-inflight-request-bytes must be at least "
                                   "--max-request-bytes (%llu bytes)",
                                   (unsigned long long)e->max_request_bytes);
    if ((e->http.tls_cert == NULL) != (e->http.tls_key == NULL))
        return pjs_cli_usage_error(cmd, "--http-tls-cert and --http-tls-key go together");
    if (e->http.tls_ca != NULL && e->http.tls_cert == NULL)
        return pjs_cli_usage_error(cmd, "--http-tls-ca needs --http-tls-cert and --http-tls-key");
    if ((e->grpc.tls_cert == NULL) != (e->grpc.tls_key == NULL))
        return pjs_cli_usage_error(cmd, "--grpc-tls-cert and --grpc-tls-key go together");
    if (e->grpc.tls_ca != NULL && e->grpc.tls_cert == NULL)
        return pjs_cli_usage_error(cmd, "--grpc-tls-ca needs --grpc-tls-cert and --grpc-tls-key");
    return PJS_EXIT_OK;
}

void pjs_cli_endpoint_ports(const pjs_cli_endpoint *e, const pjs_access *access,
                            long grpc_fd_share, pjs_grpc_options *grpc, pjs_http_options *rest,
                            pjs_http_options *metrics)
{
    *grpc = e->grpc;
    grpc->host = e->grpc_host != NULL ? e->grpc_host : e->host;
    grpc->port = e->grpc_port;
    grpc->max_request_bytes = e->max_request_bytes;
    grpc->memory_quota = e->grpc_memory_quota != 0
                             ? e->grpc_memory_quota
                             : e->max_inflight_request_bytes + GRPC_QUOTA_SLACK;
    grpc->fd_share = (int)grpc_fd_share;
    grpc->access = access;
    *rest = *metrics = e->http;
    rest->host = e->http_host != NULL ? e->http_host : e->host;
    rest->port = e->http_port;
    rest->threads = e->http_threads;
    metrics->host = e->metrics_host != NULL ? e->metrics_host : e->host;
    metrics->port = e->metrics_port;
    metrics->threads = 1;
    rest->access = metrics->access = access;
}

void pjs_cli_address(char *buf, size_t size, const char *host, int port)
{
    if (pjs_unix_path(host) != NULL)
        snprintf(buf, size, "%s", host);
    else
        snprintf(buf, size, "%s:%d", host, port);
}

int pjs_cli_endpoint_tracer(const pjs_cli_endpoint *e, const char *service, pjs_tracer **out)
{
    *out = NULL;
    if (e->trace_endpoint == NULL)
        return PJS_EXIT_OK;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char instance[300];
    snprintf(instance, sizeof instance, "%s:%d", host, (int)getpid());
    pjs_tracer_options o = {.endpoint = e->trace_endpoint,
                            .service_name = service,
                            .instance = instance,
                            .rate = e->trace_rate};
    pjs_error err;
    if (pjs_tracer_create(&o, out, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    pjs_info("traces: spans of sampled requests go to %s over OTLP/HTTP; %g of requests "
             "without a traceparent are sampled",
             e->trace_endpoint, e->trace_rate);
    return PJS_EXIT_OK;
}
