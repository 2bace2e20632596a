/*
 * client_cli.h - what pjserve's client commands (infer, models, load,
 * unload, status) share: the connection options and their parsing, the
 * connection itself, error reports that say what to do, and plain-text
 * tables. The commands are clients of a running server through
 * libpjserve-client (include/pjserve/client.h); they load no PJRT.
 */
#ifndef PJS_CLI_CLIENT_CLI_H
#define PJS_CLI_CLIENT_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "pjserve/client.h"

/* Options every client command takes. */
typedef struct pjs_cli_conn {
    const char *url;       /* --url, else $PJSERVE_URL, else by protocol */
    const char *protocol;  /* --protocol grpc|http, or NULL */
    const char *token_file;
    const char *tls_ca, *tls_cert, *tls_key;
    unsigned timeout_ms;
    bool json;             /* --json */
} pjs_cli_conn;

/* getopt_long entries of the shared options (values 0x200...). */
#define PJS_CLI_CONN_LONG_OPTIONS                                                                  \
    {"url", required_argument, NULL, 0x200}, {"protocol", required_argument, NULL, 0x201},         \
        {"token-file", required_argument, NULL, 0x202},                                            \
        {"tls-ca", required_argument, NULL, 0x203},                                                \
        {"tls-cert", required_argument, NULL, 0x204},                                              \
        {"tls-key", required_argument, NULL, 0x205},                                               \
        {"timeout-ms", required_argument, NULL, 0x206}, {"json", no_argument, NULL, 0x207}

#define PJS_CLI_CONN_HELP                                                                          \
    "connection:\n"                                                                                \
    "  --url URL             the server: grpc://HOST:PORT, grpcs://..., http://HOST:PORT,\n"       \
    "                        https://... or HOST:PORT (default: $PJSERVE_URL, else\n"              \
    "                        localhost:8001 for gRPC, localhost:8000 for HTTP)\n"                  \
    "  --protocol grpc|http  the protocol when the URL has no scheme (default grpc)\n"             \
    "  --timeout-ms N        give up on each call after N ms (default: no limit)\n"                \
    "  --token-file FILE     send the token in FILE as a bearer token (admin calls on a\n"         \
    "                        server started with --admin-token-file)\n"                            \
    "  --tls-ca FILE         CA certificates to trust (grpcs:// and https:// URLs)\n"              \
    "  --tls-cert FILE, --tls-key FILE\n"                                                          \
    "                        this client's certificate and key (mutual TLS)\n"                     \
    "  --json                print JSON for scripts instead of a table\n"

/* Handles a shared option; 1 handled, 0 not one of them, -1 bad value
 * (message printed). */
int pjs_cli_conn_option(const char *cmd, pjs_cli_conn *o, int opt, const char *arg);

/* The URL the options name, with its scheme (buf may hold it). */
const char *pjs_cli_url(const pjs_cli_conn *o, char *buf, size_t cap);

/* Connects as the options say; prints the error and returns
 * PJS_EXIT_FAILURE or PJS_EXIT_USAGE, else 0. */
int pjs_cli_connect(const char *cmd, const pjs_cli_conn *o, pjs_client **out);

/* `s` made safe for a terminal: its control characters escaped as the
 * server's log escapes them (pjs_log_escape: "\n", "\x1b", ...), so a string
 * a server chose (an output name, an error message) cannot start a line of
 * its own or steer the terminal. Cut to fit cap; returns buf. */
const char *pjs_cli_shown(const char *s, char *buf, size_t cap);

/* Prints "pjserve: error: <what>: <message>", the message escaped
 * (pjs_cli_shown), and a hint that fits the code; returns PJS_EXIT_FAILURE. */
int pjs_cli_client_fail(const pjs_client *c, const char *what, const pjs_client_error *err);
/* The same with the caller's hint (NULL: the one that fits the code). */
int pjs_cli_client_fail_hint(const pjs_client *c, const char *what, const pjs_client_error *err,
                             const char *hint);

/* Parses a JSON document the library handed out (and frees the text). */
json_t *pjs_cli_parse_doc(char *text);

/* Prints `doc` as indented JSON on stdout. */
void pjs_cli_print_json(const json_t *doc);

/* A table of strings printed with aligned columns. */
#define PJS_CLI_TABLE_MAX_COLS 8
typedef struct pjs_cli_table {
    size_t n_cols, n_rows, cap;
    char **cells; /* n_rows * n_cols, row-major, each malloc'd */
} pjs_cli_table;

void pjs_cli_table_init(pjs_cli_table *t, size_t n_cols);
/* Appends a row of n_cols cells (copied, escaped with pjs_cli_shown); NULL
 * cells print as "-". */
void pjs_cli_table_row(pjs_cli_table *t, const char *const *cells);
void pjs_cli_table_print(const pjs_cli_table *t);
void pjs_cli_table_free(pjs_cli_table *t);

/* "1.5 GiB" for a byte count. */
void pjs_cli_format_bytes(double bytes, char *out, size_t cap);

#endif
