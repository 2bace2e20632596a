/*
 * cmd_top.c - `pjserve top`: a live terminal view of a running pjserve
 * serve, node or gateway, refreshed every interval.
 *
 * Each refresh scrapes the metrics port (GET /metrics, libcurl), reads the
 * model control status (GET /v2/pjserve/control: residency and weight
 * sizes, which the metrics lack) and the node status (GET
 * /v2/pjserve/node, 404 outside a node) on the REST port, and turns the
 * last two scrapes into rates (top_view.c). The screen is plain ANSI
 * escapes on the alternate screen; keys are read from the terminal in
 * non-canonical mode, whose settings are restored on every way out (q,
 * SIGINT, SIGTERM, a failure) and while ctrl-z has the view stopped.
 * Without a terminal on stdout, or with --once or --json, it prints one
 * view of two scrapes an interval apart and exits. One thread.
 */
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/client_cli.h"
#include "cli/prom_text.h"
#include "cli/top_view.h"

static const char top_help[] =
    "usage: pjserve top [--url URL] [--metrics-url URL] [--interval S] [--once] [--json]\n"
    "                   [--sort COLUMN] [--filter TEXT] [options]\n"
    "\n"
    "A live view of a running pjserve serve, node or gateway: per model its queue,\n"
    "requests per second, mean latency over the interval, queue wait p50/p99, device\n"
    "busy share, where its weights are (pinned, device, host, file) and weight loads\n"
    "and evictions per second; above them the weight cache against its budget,\n"
    "loads, evictions and prefetches per second, the device busy share, and for a\n"
    "node its workers. Read from the metrics port and the REST port's model control\n"
    "and node status. Without a terminal on stdout it prints one view, as --once.\n"
    "\n"
    "keys: q quit, s next sort column, r reverse the order, / filter by a model\n"
    "name substring (Enter applies, Esc cancels; an empty filter shows every model)\n"
    "\n"
    "  --url URL             the REST port: http://HOST:PORT, https://... or HOST:PORT\n"
    "                        (default: $PJSERVE_URL when it is http:// or https://,\n"
    "                        else http://localhost:8000)\n"
    "  --metrics-url URL     the metrics port (default: the --url host, port 8002);\n"
    "                        /metrics is added when the URL has no path\n"
    "  --interval S          seconds between refreshes, 0.1 to 3600 (default 1)\n"
    "  --once                print one view (two scrapes S apart) and exit\n"
    "  --json                print that view as JSON and exit\n"
    "  --sort COLUMN         model, queue, rate (default), latency, qwait, busy,\n"
    "                        loads or evictions; figures sort largest first\n"
    "  --reverse             the other order\n"
    "  --filter TEXT         only models whose name contains TEXT\n"
    "  --timeout-ms N        give up on each scrape after N ms (default 5000)\n"
    "  --token-file FILE     send the token in FILE as a bearer token (a server\n"
    "                        started with --infer-token-file or --admin-token-file)\n"
    "  --tls-ca FILE         CA certificates to trust (https:// URLs)\n"
    "  --tls-cert FILE, --tls-key FILE\n"
    "                        this client's certificate and key (mutual TLS)\n";

#define METRICS_MAX_BYTES (64u << 20)
#define DOC_MAX_BYTES (8u << 20)
#define URL_MAX 1024

/* A message into out, cut at cap (messages may be cut; URLs may not). */
static void say(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void say(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, cap, fmt, ap);
    va_end(ap);
}

typedef struct top_options {
    char url[URL_MAX];         /* the REST base, no trailing '/' */
    char metrics_url[URL_MAX]; /* the full /metrics URL */
    double interval_s;
    bool once, json, reverse;
    pjs_top_column sort;
    char filter[PJS_TOP_NAME_MAX];
    long timeout_ms;
    const char *token_file, *tls_ca, *tls_cert, *tls_key;
} top_options;

/* ---- URLs ----------------------------------------------------------------------- */

/* "http://HOST:PORT/..." from a URL with or without a scheme; -1 for a
 * scheme other than http or https. */
static int with_scheme(const char *in, char *out, size_t cap)
{
    const char *sep = strstr(in, "://");
    if (strlen(in) + 8 >= cap)
        return -1;
    if (sep == NULL) {
        snprintf(out, cap, "http://%s", in);
        return 0;
    }
    size_t n = (size_t)(sep - in);
    if (!((n == 4 && strncmp(in, "http", 4) == 0) || (n == 5 && strncmp(in, "https", 5) == 0)))
        return -1;
    snprintf(out, cap, "%s", in);
    return 0;
}

/* Where the authority (host[:port]) of a URL with a scheme ends. */
static const char *authority_end(const char *url)
{
    const char *host = strstr(url, "://") + 3;
    return host + strcspn(host, "/?#");
}

/* The host of a URL with a scheme, brackets of an IPv6 address kept. */
static void host_of(const char *url, char *out, size_t cap)
{
    const char *host = strstr(url, "://") + 3, *end = authority_end(url);
    const char *colon = NULL;
    if (*host == '[') {
        const char *close = memchr(host, ']', (size_t)(end - host));
        colon = close != NULL && close + 1 < end && close[1] == ':' ? close + 1 : NULL;
    } else {
        colon = memchr(host, ':', (size_t)(end - host));
    }
    size_t n = (size_t)((colon != NULL ? colon : end) - host);
    snprintf(out, cap, "%.*s", (int)n, host);
}

/* The port of a URL with a scheme, or its scheme's default. */
static const char *port_of(const char *url, char *out, size_t cap)
{
    const char *end = authority_end(url), *p = end;
    while (p > url && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p < end && p[-1] == ':')
        snprintf(out, cap, "%.*s", (int)(end - p), p);
    else
        snprintf(out, cap, "%s", strncmp(url, "https", 5) == 0 ? "443" : "80");
    return out;
}

static int set_urls(top_options *o, const char *url, const char *metrics)
{
    if (url == NULL) {
        const char *env = getenv("PJSERVE_URL");
        url = env != NULL && (strncmp(env, "http://", 7) == 0 || strncmp(env, "https://", 8) == 0)
                  ? env
                  : "http://localhost:8000";
    }
    if (with_scheme(url, o->url, sizeof o->url) != 0)
        return pjs_cli_usage_error("top", "--url must be http://HOST:PORT, https://... or "
                                          "HOST:PORT (the REST port), not '%s'",
                                   url);
    size_t n = strlen(o->url);
    while (n > 0 && o->url[n - 1] == '/')
        o->url[--n] = '\0';
    if (metrics == NULL) {
        char host[URL_MAX];
        host_of(o->url, host, sizeof host);
        int n_url = snprintf(o->metrics_url, sizeof o->metrics_url, "%.*s://%s:8002/metrics",
                             (int)(strstr(o->url, "://") - o->url), o->url, host);
        return n_url < (int)sizeof o->metrics_url
                   ? 0
                   : pjs_cli_usage_error("top", "--url is longer than %d bytes", URL_MAX - 32);
    }
    char full[URL_MAX];
    if (with_scheme(metrics, full, sizeof full) != 0)
        return pjs_cli_usage_error("top", "--metrics-url must be http://HOST:PORT[/metrics], "
                                          "https://... or HOST:PORT, not '%s'",
                                   metrics);
    const char *path = authority_end(full);
    int n_url = snprintf(o->metrics_url, sizeof o->metrics_url, "%s%s", full,
                         *path == '\0' || strcmp(path, "/") == 0 ? (*path ? "metrics" : "/metrics")
                                                                 : "");
    return n_url < (int)sizeof o->metrics_url
               ? 0
               : pjs_cli_usage_error("top", "--metrics-url is longer than %d bytes", URL_MAX - 32);
}

/* ---- options -------------------------------------------------------------------- */

static int parse(int argc, char **argv, top_options *o)
{
    static const struct option longs[] = {
        {"help", no_argument, NULL, 'h'},
        {"url", required_argument, NULL, 'u'},
        {"metrics-url", required_argument, NULL, 'm'},
        {"interval", required_argument, NULL, 'i'},
        {"once", no_argument, NULL, '1'},
        {"json", no_argument, NULL, 'j'},
        {"sort", required_argument, NULL, 's'},
        {"reverse", no_argument, NULL, 'r'},
        {"filter", required_argument, NULL, 'f'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"token-file", required_argument, NULL, 'k'},
        {"tls-ca", required_argument, NULL, 'a'},
        {"tls-cert", required_argument, NULL, 'c'},
        {"tls-key", required_argument, NULL, 'y'},
        {NULL, 0, NULL, 0},
    };
    const char *url = NULL, *metrics = NULL;
    *o = (top_options){.interval_s = 1, .sort = PJS_TOP_COL_RATE, .timeout_ms = 5000};
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        char *end;
        switch (opt) {
        case 'h': fputs(top_help, stdout); return -1;
        case 'u': url = optarg; break;
        case 'm': metrics = optarg; break;
        case 'i':
            o->interval_s = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || !(o->interval_s >= 0.1) ||
                o->interval_s > 3600)
                return pjs_cli_usage_error("top", "--interval takes seconds from 0.1 to 3600, "
                                                  "not '%s'",
                                           optarg);
            break;
        case '1': o->once = true; break;
        case 'j': o->json = o->once = true; break;
        case 's': {
            int c = pjs_top_column_parse(optarg);
            if (c < 0)
                return pjs_cli_usage_error("top", "--sort takes model, queue, rate, latency, "
                                                  "qwait, busy, loads or evictions, not '%s'",
                                           optarg);
            o->sort = (pjs_top_column)c;
            break;
        }
        case 'r': o->reverse = true; break;
        case 'f': snprintf(o->filter, sizeof o->filter, "%s", optarg); break;
        case 't':
            o->timeout_ms = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || o->timeout_ms < 1 || o->timeout_ms > 600000)
                return pjs_cli_usage_error("top", "--timeout-ms takes milliseconds from 1 to "
                                                  "600000, not '%s'",
                                           optarg);
            break;
        case 'k': o->token_file = optarg; break;
        case 'a': o->tls_ca = optarg; break;
        case 'c': o->tls_cert = optarg; break;
        case 'y': o->tls_key = optarg; break;
        default: return pjs_cli_usage_error("top", "unknown option");
        }
    }
    if (optind != argc)
        return pjs_cli_usage_error("top", "takes no arguments, only options");
    if ((o->tls_cert == NULL) != (o->tls_key == NULL))
        return pjs_cli_usage_error("top", "--tls-cert and --tls-key go together");
    return set_urls(o, url, metrics);
}

/* ---- fetching ------------------------------------------------------------------- */

typedef struct fetcher {
    CURL *easy;
    struct curl_slist *headers; /* the bearer token, if any */
    const top_options *o;
} fetcher;

typedef struct body {
    char *data;
    size_t len, cap, limit;
    bool too_long;
} body;

static size_t on_bytes(char *p, size_t size, size_t n, void *user)
{
    body *b = user;
    size_t len = size * n;
    if (b->len + len > b->limit) {
        b->too_long = true;
        return 0;
    }
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (grown == NULL)
            return 0;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, len);
    b->len += len;
    b->data[b->len] = '\0';
    return len;
}

static int fetcher_open(fetcher *f, const top_options *o)
{
    memset(f, 0, sizeof *f);
    f->o = o;
    if (o->token_file != NULL) {
        FILE *in = fopen(o->token_file, "r");
        char token[4096] = "", line[4200];
        bool got = in != NULL && fgets(token, sizeof token, in) != NULL;
        if (in != NULL)
            fclose(in);
        token[got ? strcspn(token, "\r\n") : 0] = '\0';
        if (token[0] == '\0')
            return pjs_cli_fail("cannot read a token from %s; give the file the server's "
                                "--infer-token-file or --admin-token-file names",
                                o->token_file);
        snprintf(line, sizeof line, "Authorization: Bearer %s", token);
        f->headers = curl_slist_append(NULL, line);
    }
    f->easy = curl_easy_init();
    if (f->easy == NULL)
        return pjs_cli_fail("cannot start libcurl");
    return 0;
}

static void fetcher_close(fetcher *f)
{
    if (f->easy != NULL)
        curl_easy_cleanup(f->easy);
    curl_slist_free_all(f->headers);
}

/* GETs url into b; 0 with *status the HTTP status, else -1 with why. */
static int fetch(fetcher *f, const char *url, size_t limit, body *b, long *status, char *why,
                 size_t why_cap)
{
    char curl_error[CURL_ERROR_SIZE] = "";
    b->len = 0;
    if (b->data != NULL)
        b->data[0] = '\0';
    b->limit = limit;
    b->too_long = false;
    CURL *e = f->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, f->o->timeout_ms);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_bytes);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, f->headers);
    curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, NULL);
    if (f->o->tls_ca != NULL)
        curl_easy_setopt(e, CURLOPT_CAINFO, f->o->tls_ca);
    if (f->o->tls_cert != NULL) {
        curl_easy_setopt(e, CURLOPT_SSLCERT, f->o->tls_cert);
        curl_easy_setopt(e, CURLOPT_SSLKEY, f->o->tls_key);
    }
    CURLcode rc = curl_easy_perform(e);
    long os_errno = 0;
    if (rc != CURLE_OK) {
        if (b->too_long)
            say(why, why_cap, "the answer is larger than %zu MiB", limit >> 20);
        else if (rc == CURLE_COULDNT_CONNECT &&
                 curl_easy_getinfo(e, CURLINFO_OS_ERRNO, &os_errno) == CURLE_OK && os_errno != 0)
            say(why, why_cap, "%s", strerror((int)os_errno)); /* "Connection refused" */
        else
            say(why, why_cap, "%s", curl_error[0] ? curl_error : curl_easy_strerror(rc));
        return -1;
    }
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    if (b->data == NULL && (b->data = calloc(1, 1)) != NULL)
        b->cap = 1;
    if (b->data == NULL) {
        say(why, why_cap, "out of memory");
        return -1;
    }
    return 0;
}

/* The answer's message: {"error": "..."} of pjserve, else its start. */
static void answer_message(const body *b, char *out, size_t cap)
{
    json_t *doc = b->data != NULL ? json_loads(b->data, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(doc, "error"));
    snprintf(out, cap, "%.200s", msg != NULL ? msg : b->data != NULL ? b->data : "");
    out[strcspn(out, "\r\n")] = '\0';
    for (char *c = out; *c != '\0'; c++) /* no escape sequences from the server */
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    json_decref(doc);
}

/* ---- one scrape ----------------------------------------------------------------- */

typedef struct scrape_result {
    pjs_top_snapshot snap;
    char error[1200];         /* why the metrics could not be read; "" when they were */
    char control_note[600];   /* why residency is missing; "" when it is not */
} scrape_result;

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void why_unreachable(const char *url, const char *why, bool metrics, char *out,
                            size_t cap)
{
    char port[16];
    port_of(url, port, sizeof port);
    say(out, cap,
             "cannot reach %s: %s; is pjserve serve (or node) running with %s %s? Give the "
             "server's %s with %s",
             url, why, metrics ? "--metrics-port" : "--http-port", port,
             metrics ? "metrics port" : "REST port", metrics ? "--metrics-url" : "--url");
}

static void why_status(const char *url, long status, const body *b, bool metrics, char *out,
                       size_t cap)
{
    char msg[256];
    answer_message(b, msg, sizeof msg);
    const char *hint = status == 401 || status == 403
                           ? "give the server's token with --token-file"
                       : metrics ? "is --metrics-url the metrics port of a pjserve server?"
                                 : "is --url the REST port of a pjserve server?";
    say(out, cap, "%s answered HTTP %ld (%s); %s", url, status, msg, hint);
}

/* Reads the metrics into r->snap; "" in r->error when it worked. */
static void scrape_metrics(fetcher *f, body *b, scrape_result *r)
{
    const top_options *o = f->o;
    char why[CURL_ERROR_SIZE + 128];
    long status = 0;
    if (fetch(f, o->metrics_url, METRICS_MAX_BYTES, b, &status, why, sizeof why) != 0) {
        why_unreachable(o->metrics_url, why, true, r->error, sizeof r->error);
        return;
    }
    if (status != 200) {
        why_status(o->metrics_url, status, b, true, r->error, sizeof r->error);
        return;
    }
    double at = monotonic_s();
    pjs_prom_doc doc;
    pjs_error err;
    int rc = pjs_prom_parse(b->data, b->len, &doc, &err);
    if (rc == 0)
        rc = pjs_top_snapshot_from_metrics(&doc, at, &r->snap, &err);
    pjs_prom_free(&doc);
    if (rc != 0)
        say(r->error, sizeof r->error,
                 "%s did not answer with pjserve's Prometheus metrics: %s; is --metrics-url "
                 "the metrics port of a pjserve server?",
                 o->metrics_url, err.msg);
}

/* GET of a JSON document on the REST port: the document, or NULL with
 * why (status 404 and no message: *not_found). */
static json_t *rest_document(fetcher *f, body *b, const char *path, char *why, size_t cap,
                             bool *not_found)
{
    char url[URL_MAX + 64], reason[CURL_ERROR_SIZE + 128];
    say(url, sizeof url, "%s%s", f->o->url, path);
    long status = 0;
    *not_found = false;
    if (fetch(f, url, DOC_MAX_BYTES, b, &status, reason, sizeof reason) != 0) {
        why_unreachable(f->o->url, reason, false, why, cap);
        return NULL;
    }
    if (status != 200) {
        *not_found = status == 404;
        why_status(url, status, b, false, why, cap);
        return NULL;
    }
    json_t *doc = json_loads(b->data, 0, NULL);
    if (!json_is_object(doc)) {
        json_decref(doc);
        say(why, cap, "%s did not answer with a JSON object; is --url the REST port of a "
                           "pjserve server?",
                 url);
    }
    return json_is_object(doc) ? doc : NULL;
}

static void scrape(fetcher *f, body *b, scrape_result *r)
{
    memset(r, 0, sizeof *r);
    scrape_metrics(f, b, r);
    if (r->error[0] != '\0')
        return;
    char why[1200];
    bool not_found;
    json_t *control = rest_document(f, b, "/v2/pjserve/control", why, sizeof why, &not_found);
    if (control != NULL)
        pjs_top_snapshot_apply_control(&r->snap, control);
    else
        say(r->control_note, sizeof r->control_note,
                 "residency and weight sizes unknown: %.500s", why);
    json_decref(control);
    if (control == NULL && !not_found)
        return; /* the REST port is not there: no node status either */
    json_t *node = rest_document(f, b, "/v2/pjserve/node", why, sizeof why, &not_found);
    if (node != NULL)
        pjs_top_snapshot_apply_node(&r->snap, node);
    json_decref(node);
}

/* ---- output --------------------------------------------------------------------- */

static void clock_text(char *out, size_t cap)
{
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(out, cap, "%H:%M:%S", &tm);
}

/* The view of (prev, cur) as lines; NULL lines.line on failure. */
static int draw_lines(const top_options *o, const pjs_top_snapshot *prev,
                      const pjs_top_snapshot *cur, const pjs_top_context *ctx, size_t width,
                      pjs_top_lines *lines, json_t **json)
{
    pjs_top_options vo = {.sort = o->sort, .reverse = o->reverse, .filter = o->filter};
    pjs_top_view v;
    pjs_error err;
    int rc = pjs_top_view_build(prev, cur, &vo, &v, &err);
    if (rc == 0 && json != NULL)
        *json = pjs_top_view_json(cur, &v, &vo, ctx);
    else if (rc == 0)
        rc = pjs_top_render(cur, &v, &vo, ctx, width, lines, &err);
    pjs_top_view_free(&v);
    if (rc != 0)
        pjs_cli_fail("%s", err.msg);
    return rc;
}

/* Sleeps s seconds (one view: no handlers, a signal ends the process). */
static void sleep_s(double s)
{
    double until = monotonic_s() + s;
    for (double left = s; left > 0; left = until - monotonic_s()) {
        struct timespec ts = {(time_t)left, (long)((left - floor(left)) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static int run_once(const top_options *o, fetcher *f, body *b)
{
    scrape_result *r[2] = {calloc(1, sizeof *r[0]), calloc(1, sizeof *r[1])};
    int rc = PJS_EXIT_FAILURE;
    if (r[0] == NULL || r[1] == NULL) {
        pjs_cli_fail("out of memory");
        goto out;
    }
    scrape(f, b, r[0]);
    if (r[0]->error[0] != '\0') {
        pjs_cli_fail("%s", r[0]->error);
        goto out;
    }
    sleep_s(o->interval_s);
    scrape(f, b, r[1]);
    if (r[1]->error[0] != '\0') {
        pjs_cli_fail("%s", r[1]->error);
        goto out;
    }
    char clock[16];
    clock_text(clock, sizeof clock);
    pjs_top_context ctx = {.url = o->url, .metrics_url = o->metrics_url,
                           .every_s = o->interval_s, .clock = clock,
                           .control_note = r[1]->control_note[0] ? r[1]->control_note : NULL};
    pjs_top_lines lines = {0};
    json_t *json = NULL;
    if (draw_lines(o, &r[0]->snap, &r[1]->snap, &ctx, 0, &lines, o->json ? &json : NULL) != 0)
        goto out;
    if (json != NULL) {
        pjs_cli_print_json(json);
        json_decref(json);
    }
    for (size_t i = 0; i < lines.n; i++)
        puts(lines.line[i]);
    pjs_top_lines_free(&lines);
    rc = PJS_EXIT_OK;
out:
    for (int i = 0; i < 2; i++)
        if (r[i] != NULL)
            pjs_top_snapshot_free(&r[i]->snap);
    free(r[0]);
    free(r[1]);
    return rc;
}

/* ---- the terminal --------------------------------------------------------------- */

/* The only process-wide state: what the signal handlers of the live view
 * set, since a handler can reach nothing else. */
static volatile sig_atomic_t stop_requested; /* SIGINT or SIGTERM came */
static volatile sig_atomic_t resized;        /* SIGWINCH came */
static volatile sig_atomic_t suspend_requested; /* SIGTSTP came (ctrl-z) */

typedef struct terminal {
    bool keys;               /* stdin is a terminal in non-canonical mode */
    bool tty;                /* stdin is a terminal: its settings are saved */
    struct termios saved;    /* its settings before, restored at the end */
    struct sigaction old_int, old_term, old_winch, old_tstp;
} terminal;

static void on_stop(int sig)
{
    stop_requested = sig;
}

static void on_winch(int sig)
{
    (void)sig;
    resized = 1;
}

static void on_tstp(int sig)
{
    (void)sig;
    suspend_requested = 1;
}

/* Non-canonical input without echo, and the alternate screen. */
static void screen_take(terminal *t)
{
    t->keys = false;
    if (t->tty) {
        struct termios raw = t->saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO); /* ISIG stays: ctrl-c is SIGINT */
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        t->keys = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    fputs("\033[?1049h\033[?25l", stdout); /* alternate screen, cursor hidden */
    fflush(stdout);
}

/* The screen and the terminal's settings as they were. */
static void screen_give_back(terminal *t)
{
    fputs("\033[?25h\033[?1049l", stdout);
    fflush(stdout);
    if (t->tty)
        tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
}

static void terminal_enter(terminal *t)
{
    struct sigaction sa = {0};
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_stop; /* no SA_RESTART: poll() returns at once */
    sigaction(SIGINT, &sa, &t->old_int);
    sigaction(SIGTERM, &sa, &t->old_term);
    sa.sa_handler = on_winch;
    sigaction(SIGWINCH, &sa, &t->old_winch);
    sa.sa_handler = on_tstp;
    sigaction(SIGTSTP, &sa, &t->old_tstp);
    t->tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &t->saved) == 0;
    screen_take(t);
}

/* ctrl-z: the terminal as it was, stopped as SIGTSTP's default stops a
 * process; on SIGCONT the view takes the screen again. */
static void terminal_suspend(terminal *t)
{
    screen_give_back(t);
    struct sigaction dfl = {0}, ours;
    sigemptyset(&dfl.sa_mask);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGTSTP, &dfl, &ours);
    raise(SIGTSTP);
    sigaction(SIGTSTP, &ours, NULL);
    screen_take(t);
}

static void terminal_leave(terminal *t)
{
    screen_give_back(t);
    sigaction(SIGINT, &t->old_int, NULL);
    sigaction(SIGTERM, &t->old_term, NULL);
    sigaction(SIGWINCH, &t->old_winch, NULL);
    sigaction(SIGTSTP, &t->old_tstp, NULL);
}

static void terminal_size(size_t *cols, size_t *rows)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
        *cols = ws.ws_col;
        *rows = ws.ws_row;
    } else {
        *cols = 80;
        *rows = 24;
    }
}

/* The screen from the top, each line cleared to its end, the rest below
 * cleared; as many lines as the terminal has rows. */
static void paint(const pjs_top_lines *lines, size_t rows)
{
    fputs("\033[H", stdout);
    for (size_t i = 0; i < lines->n && i < rows; i++)
        printf("%s\033[K%s", lines->line[i], i + 1 < rows ? "\r\n" : "");
    fputs("\033[J", stdout);
    fflush(stdout);
}

/* What the live view keeps between refreshes. */
typedef struct live {
    top_options o;           /* sort, order and filter change with keys */
    scrape_result *prev, *cur, *spare; /* the last two good scrapes, and room for the next */
    unsigned scrapes;        /* good ones so far */
    bool have_view;          /* prev and cur both hold one */
    bool editing;
    char edit[PJS_TOP_NAME_MAX];
    size_t edit_len;
    char note[1300];         /* the last failed scrape's error */
} live;

static void redraw(live *l)
{
    size_t cols, rows;
    terminal_size(&cols, &rows);
    char clock[16];
    clock_text(clock, sizeof clock);
    pjs_top_context ctx = {.url = l->o.url, .metrics_url = l->o.metrics_url,
                           .every_s = l->o.interval_s, .clock = clock,
                           .note = l->note[0] ? l->note : NULL, .keys = true,
                           .editing_filter = l->editing ? l->edit : NULL};
    pjs_top_lines lines = {0};
    if (!l->have_view) {
        lines.line = calloc(2, sizeof *lines.line);
        if (lines.line == NULL)
            return;
        lines.line[0] = strdup("pjserve top - reading the server's metrics twice to get rates");
        lines.line[1] = strdup(l->note[0] ? l->note : "");
        lines.n = lines.line[0] != NULL && lines.line[1] != NULL ? 2 : 0;
        for (size_t i = 0; i < lines.n; i++)
            if (strlen(lines.line[i]) > cols)
                lines.line[i][cols] = '\0';
    } else {
        ctx.control_note = l->cur->control_note[0] ? l->cur->control_note : NULL;
        if (draw_lines(&l->o, &l->prev->snap, &l->cur->snap, &ctx, cols, &lines, NULL) != 0)
            return;
    }
    paint(&lines, rows);
    pjs_top_lines_free(&lines);
}

/* One key; false to quit. */
static bool on_key(live *l, unsigned char k)
{
    if (l->editing) {
        if (k == '\r' || k == '\n') {
            memcpy(l->o.filter, l->edit, l->edit_len + 1);
            l->editing = false;
        } else if (k == 27) {
            l->editing = false;
        } else if ((k == 127 || k == 8) && l->edit_len > 0) {
            l->edit[--l->edit_len] = '\0';
        } else if (k >= 32 && k < 127 && l->edit_len + 1 < sizeof l->edit) {
            l->edit[l->edit_len++] = (char)k;
            l->edit[l->edit_len] = '\0';
        }
        return true;
    }
    switch (k) {
    case 'q':
    case 'Q': return false;
    case 's': l->o.sort = (pjs_top_column)((l->o.sort + 1) % PJS_TOP_N_COLUMNS); break;
    case 'r': l->o.reverse = !l->o.reverse; break;
    case '/':
        l->editing = true;
        l->edit_len = strlen(l->o.filter);
        memcpy(l->edit, l->o.filter, l->edit_len + 1);
        break;
    default: break;
    }
    return true;
}

/* Scrapes into the spare result; a good scrape becomes l->cur and the
 * one before l->prev, a failed one leaves both and shows why. */
static void refresh(live *l, fetcher *f, body *b)
{
    scrape_result *next = l->spare;
    pjs_top_snapshot_free(&next->snap);
    scrape(f, b, next);
    if (next->error[0] != '\0') {
        say(l->note, sizeof l->note, "%s", next->error);
        return;
    }
    l->note[0] = '\0';
    l->spare = l->prev;
    l->prev = l->cur;
    l->cur = next;
    l->have_view = ++l->scrapes >= 2;
}

static int run_live(const top_options *o, fetcher *f, body *b)
{
    live *l = calloc(1, sizeof *l);
    scrape_result *r[3] = {calloc(1, sizeof *r[0]), calloc(1, sizeof *r[1]),
                           calloc(1, sizeof *r[2])};
    if (l == NULL || r[0] == NULL || r[1] == NULL || r[2] == NULL) {
        free(l);
        for (int i = 0; i < 3; i++)
            free(r[i]);
        return pjs_cli_fail("out of memory");
    }
    l->o = *o;
    l->prev = r[0];
    l->cur = r[1];
    l->spare = r[2];
    terminal t;
    terminal_enter(&t);
    redraw(l); /* says what it waits for while the first scrape runs */
    bool running = true;
    double next_at = monotonic_s();
    while (running && !stop_requested) {
        if (monotonic_s() >= next_at) {
            next_at = monotonic_s() + o->interval_s;
            refresh(l, f, b);
            redraw(l);
        }
        double left = next_at - monotonic_s();
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        int ready = poll(&pfd, t.keys ? 1 : 0, left > 0 ? (int)ceil(left * 1000) : 0);
        if (suspend_requested) {
            suspend_requested = 0;
            terminal_suspend(&t);
            resized = 1;
        }
        if (resized) {
            resized = 0;
            redraw(l);
        }
        if (ready <= 0)
            continue;
        unsigned char keys[64];
        ssize_t n = read(STDIN_FILENO, keys, sizeof keys);
        for (ssize_t i = 0; running && i < n; i++)
            running = on_key(l, keys[i]);
        if (n == 0)
            t.keys = false; /* end of input: no more keys */
        if (running)
            redraw(l);
    }
    terminal_leave(&t);
    for (int i = 0; i < 3; i++) {
        pjs_top_snapshot_free(&r[i]->snap);
        free(r[i]);
    }
    free(l);
    return PJS_EXIT_OK;
}

int pjs_cmd_top(int argc, char **argv)
{
    top_options o;
    int rc = parse(argc, argv, &o);
    if (rc != PJS_EXIT_OK)
        return rc < 0 ? PJS_EXIT_OK : rc;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return pjs_cli_fail("cannot start libcurl");
    fetcher f;
    body b = {0};
    if (fetcher_open(&f, &o) != 0) {
        rc = PJS_EXIT_FAILURE;
    } else if (o.once || !isatty(STDOUT_FILENO)) {
        rc = run_once(&o, &f, &b);
    } else {
        rc = run_live(&o, &f, &b);
    }
    free(b.data);
    fetcher_close(&f);
    curl_global_cleanup();
    return rc;
}
