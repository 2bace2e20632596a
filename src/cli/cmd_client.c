/*
 * cmd_client.c - what the client commands share (see client_cli.h):
 * connection options, connecting, error reports with a hint of what to
 * do, JSON documents and aligned tables.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/client_cli.h"
#include "core/log.h"

int pjs_cli_conn_option(const char *cmd, pjs_cli_conn *o, int opt, const char *arg)
{
    switch (opt) {
    case 0x200: o->url = arg; return 1;
    case 0x201:
        if (strcmp(arg, "grpc") != 0 && strcmp(arg, "http") != 0) {
            pjs_cli_usage_error(cmd, "--protocol must be grpc or http, not '%s'", arg);
            return -1;
        }
        o->protocol = arg;
        return 1;
    case 0x202: o->token_file = arg; return 1;
    case 0x203: o->tls_ca = arg; return 1;
    case 0x204: o->tls_cert = arg; return 1;
    case 0x205: o->tls_key = arg; return 1;
    case 0x206: {
        char *end;
        unsigned long ms = strtoul(arg, &end, 10);
        if (*arg == '\0' || *end != '\0' || ms == 0 || ms > 86400000ul) {
            pjs_cli_usage_error(cmd, "--timeout-ms takes milliseconds from 1 to 86400000, not "
                                     "'%s'",
                                arg);
            return -1;
        }
        o->timeout_ms = (unsigned)ms;
        return 1;
    }
    case 0x207: o->json = true; return 1;
    default: return 0;
    }
}

/* The first line of the token file, without its newline. */
static int read_token(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return pjs_cli_fail("cannot read the token file %s; give the file the server's "
                            "--admin-token-file names",
                            path);
    bool got = fgets(out, (int)cap, f) != NULL;
    fclose(f);
    out[got ? strcspn(out, "\r\n") : 0] = '\0';
    if (out[0] == '\0')
        return pjs_cli_fail("the token file %s is empty", path);
    return 0;
}

const char *pjs_cli_url(const pjs_cli_conn *o, char *buf, size_t cap)
{
    const char *url = o->url ? o->url : getenv("PJSERVE_URL");
    bool http = o->protocol != NULL && strcmp(o->protocol, "http") == 0;
    if (url == NULL || url[0] == '\0')
        url = http ? "localhost:8000" : "localhost:8001";
    if (strstr(url, "://") != NULL)
        return url;
    bool tls = o->tls_ca != NULL || o->tls_cert != NULL;
    snprintf(buf, cap, "%s%s://%s", http ? "http" : "grpc", tls ? "s" : "", url);
    return buf;
}

int pjs_cli_connect(const char *cmd, const pjs_cli_conn *o, pjs_client **out)
{
    char buf[1024];
    const char *url = pjs_cli_url(o, buf, sizeof buf);
    if (o->protocol != NULL && strncmp(url, o->protocol, strlen(o->protocol)) != 0)
        return pjs_cli_usage_error(cmd, "--protocol %s does not match the URL %s; give one or "
                                        "the other",
                                   o->protocol, url);
    char token[4096];
    pjs_client_options opts = {0};
    if (o->token_file != NULL) {
        if (read_token(o->token_file, token, sizeof token) != 0)
            return PJS_EXIT_FAILURE;
        opts.token = token;
    }
    opts.tls_ca_file = o->tls_ca;
    opts.tls_cert_file = o->tls_cert;
    opts.tls_key_file = o->tls_key;
    opts.timeout_ms = o->timeout_ms;
    pjs_client_error err;
    if (pjs_client_connect(url, &opts, out, &err) != 0)
        return err.code == PJS_CLIENT_INVALID_ARGUMENT ? pjs_cli_usage_error(cmd, "%s", err.message)
                                                       : pjs_cli_fail("%s", err.message);
    return 0;
}

static const char *hint(const pjs_client_error *err)
{
    switch (err->code) {
    case PJS_CLIENT_UNAUTHENTICATED:
    case PJS_CLIENT_PERMISSION_DENIED:
        return "admin calls need --token-file with the server's admin token, or a connection "
               "from the server's own host";
    case PJS_CLIENT_DEADLINE_EXCEEDED:
        return err->from_server ? NULL : "raise --timeout-ms, or check that the server is "
                                         "not overloaded";
    case PJS_CLIENT_UNIMPLEMENTED:
        return "this server does not have that call; is it pjserve, and recent enough?";
    default: return NULL;
    }
}

const char *pjs_cli_shown(const char *s, char *buf, size_t cap)
{
    pjs_log_escape(s, strlen(s), buf, cap);
    return buf;
}

int pjs_cli_client_fail(const pjs_client *c, const char *what, const pjs_client_error *err)
{
    return pjs_cli_client_fail_hint(c, what, err, NULL);
}

int pjs_cli_client_fail_hint(const pjs_client *c, const char *what, const pjs_client_error *err,
                             const char *own_hint)
{
    (void)c;
    char message[4 * sizeof err->message];
    fprintf(stderr, "pjserve: error: %s: %s\n", what,
            pjs_cli_shown(err->message, message, sizeof message));
    const char *h = own_hint != NULL ? own_hint : hint(err);
    if (h != NULL)
        fprintf(stderr, "hint: %s\n", h);
    return PJS_EXIT_FAILURE;
}

json_t *pjs_cli_parse_doc(char *text)
{
    json_t *doc = text != NULL ? json_loads(text, 0, NULL) : NULL;
    pjs_client_free(text);
    return doc;
}

void pjs_cli_print_json(const json_t *doc)
{
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_ENCODE_ANY);
    if (text != NULL)
        puts(text);
    free(text);
}

/* ---- tables ------------------------------------------------------------------------ */

void pjs_cli_table_init(pjs_cli_table *t, size_t n_cols)
{
    memset(t, 0, sizeof *t);
    t->n_cols = n_cols;
}

static char *dup_cell(const char *s)
{
    const char *v = s != NULL && s[0] != '\0' ? s : "-";
    size_t cap = 4 * strlen(v) + 1; /* every byte escaped */
    char *d = malloc(cap);
    if (d != NULL)
        pjs_cli_shown(v, d, cap);
    return d;
}

void pjs_cli_table_row(pjs_cli_table *t, const char *const *cells)
{
    if (t->n_rows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        char **grown = realloc(t->cells, cap * t->n_cols * sizeof *grown);
        if (grown == NULL)
            return;
        t->cells = grown;
        t->cap = cap;
    }
    for (size_t i = 0; i < t->n_cols; i++)
        t->cells[t->n_rows * t->n_cols + i] = dup_cell(cells[i]);
    t->n_rows++;
}

void pjs_cli_table_print(const pjs_cli_table *t)
{
    size_t width[PJS_CLI_TABLE_MAX_COLS] = {0};
    for (size_t r = 0; r < t->n_rows; r++)
        for (size_t i = 0; i < t->n_cols && i < PJS_CLI_TABLE_MAX_COLS; i++) {
            const char *cell = t->cells[r * t->n_cols + i];
            size_t n = cell != NULL ? strlen(cell) : 1;
            if (n > width[i])
                width[i] = n;
        }
    for (size_t r = 0; r < t->n_rows; r++) {
        for (size_t i = 0; i < t->n_cols && i < PJS_CLI_TABLE_MAX_COLS; i++) {
            const char *cell = t->cells[r * t->n_cols + i];
            if (cell == NULL)
                cell = "-";
            if (i + 1 == t->n_cols)
                fputs(cell, stdout);
            else
                printf("%-*s  ", (int)width[i], cell);
        }
        putchar('\n');
    }
}

void pjs_cli_table_free(pjs_cli_table *t)
{
    for (size_t i = 0; i < t->n_rows * t->n_cols; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof *t);
}

void pjs_cli_format_bytes(double bytes, char *out, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    size_t u = 0;
    while (bytes >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        bytes /= 1024;
        u++;
    }
    snprintf(out, cap, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
}
