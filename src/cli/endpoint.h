/*
 * endpoint.h - the flags of a public KServe V2 endpoint: ports and hosts,
 * TLS, credentials and the limits put on clients. `pjserve serve`, `pjserve
 * gateway` and `pjserve node` (for its gateway) take the same flags with
 * the same meaning, parsed here once.
 */
#ifndef PJS_CLI_ENDPOINT_H
#define PJS_CLI_ENDPOINT_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

#include "frontend/access.h"
#include "frontend/grpc/grpc_frontend.h"
#include "frontend/http/http_frontend.h"
#include "trace/trace.h"

typedef struct pjs_cli_endpoint {
    const char *host;                                  /* --host [0.0.0.0] */
    int grpc_port, http_port, metrics_port;            /* [8001, 8000, 8002]; 0: off */
    const char *grpc_host, *http_host, *metrics_host;  /* NULL: host */
    const char *admin_token_file, *infer_token_file;   /* NULL: not given */
    pjs_grpc_options grpc;        /* TLS, keepalive, threads and client limits */
    uint64_t grpc_memory_quota;   /* 0: the in-flight budget + GRPC_QUOTA_SLACK */
    int http_threads;             /* 0: the front end's default */
    pjs_http_options http;        /* limits and HTTPS of the REST and metrics ports */
    uint64_t max_request_bytes;          /* [PJS_DEFAULT_MAX_REQUEST_BYTES] */
    uint64_t max_inflight_request_bytes; /* 0: 4 x max_request_bytes */
    bool strict_readiness; /* --strict-readiness [true]: what /v2/health/ready asks */
    const char *trace_endpoint; /* --trace-endpoint URL; NULL: tracing off */
    double trace_rate;          /* --trace-rate [PJS_CLI_DEFAULT_TRACE_RATE] */
} pjs_cli_endpoint;

/* The share of requests traced by default once a collector is given. */
#define PJS_CLI_DEFAULT_TRACE_RATE 0.01

#define PJS_CLI_ENDPOINT_OPT_BASE 0x400

/* getopt_long entries of every endpoint flag. */
#define PJS_CLI_ENDPOINT_LONG_OPTIONS                                                              \
    {"host", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 0},                              \
        {"grpc-port", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 1},                     \
        {"http-port", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 2},                     \
        {"metrics-port", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 3},                  \
        {"admin-token-file", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 4},              \
        {"infer-token-file", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 5},              \
        {"grpc-tls-cert", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 6},                 \
        {"grpc-tls-key", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 7},                  \
        {"grpc-tls-ca", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 8},                   \
        {"grpc-keepalive-time-ms", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 9},        \
        {"grpc-keepalive-timeout-ms", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 10},    \
        {"grpc-keepalive-permit-without-calls", no_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 11},\
        {"grpc-threads", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 12},                 \
        {"grpc-host", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 13},                    \
        {"grpc-max-concurrent-streams", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 14},  \
        {"grpc-max-connection-idle-ms", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 15},  \
        {"grpc-handshake-timeout-ms", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 16},    \
        {"grpc-memory-quota", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 17},            \
        {"http-threads", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 18},                 \
        {"http-host", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 19},                    \
        {"metrics-host", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 20},                 \
        {"http-max-connections", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 21},         \
        {"http-max-connections-per-ip", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 22},  \
        {"http-idle-timeout-s", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 23},          \
        {"http-header-timeout-s", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 24},        \
        {"http-body-timeout-s", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 25},          \
        {"http-tls-cert", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 26},                \
        {"http-tls-key", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 27},                 \
        {"http-tls-ca", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 28},                  \
        {"max-request-bytes", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 29},            \
        {"max-inflight-request-bytes", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 30},   \
        {"grpc-stream-write-timeout-ms", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 31}, \
        {"strict-readiness", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 32},             \
        {"trace-endpoint", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 33},               \
        {"trace-rate", required_argument, NULL, PJS_CLI_ENDPOINT_OPT_BASE + 34}

/* --help text of the endpoint flags. */
#define PJS_CLI_ENDPOINT_HELP                                                                      \
    "public ports:\n"                                                                              \
    "  --host ADDR             address to listen on (default 0.0.0.0); --grpc-host,\n"       \
    "                          --http-host and --metrics-host may also be unix:PATH,\n"      \
    "                          a Unix-domain socket at PATH (the port is then\n"             \
    "                          ignored; how pjserve node reaches its workers)\n"             \
    "  --grpc-port N           gRPC port (default 8001; 0 turns gRPC off)\n"                      \
    "  --http-port N           HTTP/REST port (default 8000; 0 turns HTTP off)\n"                 \
    "  --metrics-port N        Prometheus /metrics port (default 8002; 0: off)\n"                 \
    "  --max-request-bytes BYTES  largest request, decompressed, with a suffix K, M, G\n"         \
    "                          (powers of 1000) or Ki, Mi, Gi (powers of 1024), then\n"           \
    "                          optionally B; 1 byte to 2Gi; larger ones are refused\n"            \
    "                          with RESOURCE_EXHAUSTED / 413 (default 256Mi)\n"                   \
    "  --max-inflight-request-bytes BYTES  request bytes held at once, both\n"                    \
    "                          protocols; past it requests get RESOURCE_EXHAUSTED /\n"            \
    "                          429 (default 4 x --max-request-bytes)\n"                           \
    "  --strict-readiness true|false  what GET /v2/health/ready (200 / 400), gRPC\n"         \
    "                          ServerReady and grpc.health.v1 answer, as Triton's\n"           \
    "                          flag: true, ready only while every model that should\n"         \
    "                          be loaded is READY (one bundle that fails to load\n"          \
    "                          keeps it not ready); false, ready while it serves,\n"         \
    "                          whatever loaded (default true; docs/serving.md,\n"            \
    "                          section Readiness)\n"                                           \
    "\n"                                                                                           \
    "gRPC port (docs/serving.md, section Limits):\n"                                               \
    "  --grpc-host ADDR        address gRPC listens on (default: --host)\n"                       \
    "  --grpc-tls-cert FILE    serve gRPC over TLS with this PEM certificate chain\n"             \
    "  --grpc-tls-key FILE     ... and this PEM private key\n"                                    \
    "  --grpc-tls-ca FILE      require client certificates signed by this CA (mTLS)\n"            \
    "  --grpc-keepalive-time-ms N     ping idle connections every N ms\n"                         \
    "  --grpc-keepalive-timeout-ms N  close a connection whose ping gets no answer\n"             \
    "  --grpc-keepalive-permit-without-calls  allow client pings with no call open\n"             \
    "  --grpc-threads N        gRPC completion-queue threads (default: one per CPU\n"             \
    "                          the process may run on, at most 2; a gateway's: one\n"           \
    "                          per 4 CPUs, at least 1, at most 4)\n"                              \
    "  --grpc-max-concurrent-streams N  calls open at once on one gRPC connection;\n"             \
    "                          more are refused (default 128)\n"                                  \
    "  --grpc-stream-write-timeout-ms MS  a stream's client that reads none of what\n"          \
    "                          is waiting for it for MS ms is cut off\n"                          \
    "                          (RESOURCE_EXHAUSTED): a decoupled model's run stops\n"             \
    "                          waiting for room for its 64 queued responses, its\n"              \
    "                          pjserve_respond fails and its thread is free; a\n"                 \
    "                          gateway drops the stream it relays (default 30000;\n"             \
    "                          0: wait until the request's deadline, or forever)\n"              \
    "  --grpc-max-connection-idle-ms MS  close a gRPC connection with no call open\n"             \
    "                          for MS ms (default 300000; 0: never)\n"                            \
    "  --grpc-handshake-timeout-ms MS  close a gRPC connection that has not finished\n"           \
    "                          its TLS handshake and sent its HTTP/2 settings within\n"           \
    "                          MS ms (default 10000)\n"                                           \
    "  --grpc-memory-quota BYTES  memory gRPC's own buffers may take; past it gRPC\n"             \
    "                          closes idle connections and cancels calls (default:\n"             \
    "                          --max-inflight-request-bytes + 64Mi)\n"                            \
    "\n"                                                                                           \
    "HTTP/REST and metrics ports (docs/serving.md, section Limits; both ports):\n"                 \
    "  --http-host ADDR        REST address (default: --host)\n"                                  \
    "  --metrics-host ADDR     metrics address (default: --host)\n"                               \
    "  --http-threads N        HTTP connection threads (default: one per CPU the\n"               \
    "                          process may run on, at most 16)\n"                                 \
    "  --http-max-connections N  connections open at once per port; a new one that\n"             \
    "                          fills the table closes the one waiting longest for a\n"            \
    "                          request (default: 1000, or a quarter of the\n"                     \
    "                          open-file limit when that is lower)\n"                             \
    "  --http-max-connections-per-ip N  connections from one client address; more\n"              \
    "                          are closed at once (default 256)\n"                                \
    "  --http-idle-timeout-s S close a connection that sends and reads nothing for\n"             \
    "                          S seconds, or sends no next request for S seconds\n"               \
    "                          after a reply (default 60)\n"                                      \
    "  --http-header-timeout-s S  a request's headers must be in within S seconds\n"              \
    "                          of the connection (or its request line); else the\n"               \
    "                          connection is closed (default 10)\n"                               \
    "  --http-body-timeout-s S a request's body must be in within S seconds of its\n"             \
    "                          headers (default 60)\n"                                            \
    "  --http-tls-cert FILE    serve HTTPS with this PEM certificate chain\n"                     \
    "  --http-tls-key FILE     ... and this PEM private key\n"                                    \
    "  --http-tls-ca FILE      require client certificates signed by this CA (mTLS)\n"            \
    "\n"                                                                                           \
    "credentials (docs/serving.md, section Credentials):\n"                                        \
    "  --admin-token-file FILE admin calls (repository load/unload, model control\n"              \
    "                          changes, shared memory, logging and trace settings,\n"             \
    "                          read or write) need 'Authorization: Bearer <token>'\n"             \
    "                          (gRPC: the authorization metadata) with the token on\n"            \
    "                          the first line of FILE; FILE must not be readable by\n"            \
    "                          group or others (chmod 600). Without it, admin calls\n"            \
    "                          are accepted from loopback peers only (127.0.0.0/8,\n"             \
    "                          ::1, Unix sockets); others get PERMISSION_DENIED / 403\n"          \
    "  --infer-token-file FILE every call but the health probes then needs this\n"                \
    "                          token or the admin token (default: inference is open)\n"          \
    "\n"                                                                                           \
    "traces (docs/observability.md, section Traces):\n"                                           \
    "  --trace-endpoint URL    export request spans over OTLP/HTTP (JSON) to this\n"              \
    "                          collector URL, e.g. http://127.0.0.1:4318/v1/traces;\n"          \
    "                          a request with a W3C traceparent follows its sampled\n"          \
    "                          flag (default: no tracing)\n"                                     \
    "  --trace-rate R          share of the other requests traced, 0 to 1 (default\n"           \
    "                          0.01; TraceSetting's trace_rate N sets 1/N)\n"

/* Defaults of every field. */
void pjs_cli_endpoint_init(pjs_cli_endpoint *e);
/* The tracer of --trace-endpoint and --trace-rate for `service` (the
 * resource's service.name), or NULL without --trace-endpoint; an exit
 * status, having said why, when it cannot start. */
int pjs_cli_endpoint_tracer(const pjs_cli_endpoint *e, const char *service, pjs_tracer **out);
/* Handles getopt's `opt` when it is an endpoint flag: 1 handled, 0 not an
 * endpoint flag, -1 a bad value (a usage message naming `cmd` printed). */
int pjs_cli_endpoint_option(pjs_cli_endpoint *e, const char *cmd, int opt, const char *arg);
/* The same by the flag's name without dashes ("grpc-port"); arg NULL for
 * a flag that takes none. */
int pjs_cli_endpoint_option_named(pjs_cli_endpoint *e, const char *cmd, const char *name,
                                  const char *arg);
/* Whether `name` (without dashes) is an endpoint flag. */
bool pjs_cli_endpoint_is_flag(const char *name);
/* Checks what only the whole command line shows (TLS pairs, the in-flight
 * budget against the request limit) and fills max_inflight_request_bytes's
 * default: PJS_EXIT_OK or a usage error (message printed). */
int pjs_cli_endpoint_check(pjs_cli_endpoint *e, const char *cmd);
/* The options to start the three ports with: hosts, the access rules, the
 * gRPC memory quota's default and the descriptors gRPC's connections may
 * take (grpc_fd_share; 0: no guard). */
void pjs_cli_endpoint_ports(const pjs_cli_endpoint *e, const pjs_access *access,
                            long grpc_fd_share, pjs_grpc_options *grpc, pjs_http_options *rest,
                            pjs_http_options *metrics);

/* "host:port", or "unix:PATH" as given for a Unix-domain socket (whose
 * port is ignored), for messages. */
#define PJS_CLI_ADDRESS_MAX 320
void pjs_cli_address(char *buf, size_t size, const char *host, int port);

#endif
