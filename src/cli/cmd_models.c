/*
 * cmd_models.c - `pjserve models`, `pjserve load|unload MODEL` and
 * `pjserve status`: a running server's repository, model control and
 * health, through libpjserve-client.
 *
 * Residency comes from pjserve's model control status (GET
 * /v2/pjserve/control or ModelControlStatus); a server without it (not
 * pjserve, or one that refuses the call) gets its table without those
 * columns' values. Both protocols give the same documents up to the
 * index's wrapping and the enum spelling, which are evened out here.
 */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/client_cli.h"

static const char models_help[] =
    "usage: pjserve models [--ready] [options]\n"
    "\n"
    "Lists the models of a running server's repository: state (READY, LOADING,\n"
    "UNAVAILABLE and why), and from pjserve's model control status where the\n"
    "weights live (residency: device, host or unpinned), whether they are on the\n"
    "device now, and their size.\n"
    "\n"
    "  --ready               only the models ready for inference\n"
    "\n" PJS_CLI_CONN_HELP;

static const char load_help[] =
    "usage: pjserve load MODEL [options]\n"
    "       pjserve unload MODEL [options]\n"
    "\n"
    "Loads (or reloads) a model of the server's repository, or unloads it; returns\n"
    "when the server has done it. Admin calls: the server takes them from its own\n"
    "host, or with --token-file when it was started with --admin-token-file.\n"
    "\n" PJS_CLI_CONN_HELP;

static const char status_help[] =
    "usage: pjserve status [options]\n"
    "\n"
    "Shows a running server: its name, version and protocol extensions, whether it\n"
    "is live and ready, its models by state, and pjserve's device weight cache (what\n"
    "is on the device against the budget).\n"
    "\n" PJS_CLI_CONN_HELP;

/* Parses the shared options and up to `max_args` positional arguments
 * (exactly that many when `exact`). -1 after --help. */
static int parse(const char *cmd, const char *help, int argc, char **argv, pjs_cli_conn *conn,
                 bool *ready_only, const char **arg)
{
    static const struct option longs[] = {
        {"help", no_argument, NULL, 'h'},
        {"ready", no_argument, NULL, 'r'},
        PJS_CLI_CONN_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        int c = pjs_cli_conn_option(cmd, conn, opt, optarg);
        if (c < 0)
            return PJS_EXIT_USAGE;
        if (c > 0)
            continue;
        if (opt == 'h') {
            fputs(help, stdout);
            return -1;
        }
        if (opt == 'r' && ready_only != NULL) {
            *ready_only = true;
            continue;
        }
        return pjs_cli_usage_error(cmd, "unknown option");
    }
    int want = arg != NULL ? 1 : 0;
    if (argc - optind != want)
        return want ? pjs_cli_usage_error(cmd, "name one model")
                    : pjs_cli_usage_error(cmd, "takes no arguments, only options");
    if (arg != NULL)
        *arg = argv[optind];
    return PJS_EXIT_OK;
}

static const char *text_of(const json_t *v)
{
    const char *s = json_string_value(v);
    return s != NULL ? s : "";
}

/* The index's list of models, whichever protocol answered. */
static const json_t *index_models(const json_t *doc)
{
    return json_is_array(doc) ? doc : json_object_get(doc, "models");
}

/* The control status's entry of model `name`, or NULL. */
static const json_t *control_model(const json_t *control, const char *name)
{
    const json_t *list = json_object_get(control, "models");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *m = json_array_get(list, i);
        const char *n = json_string_value(json_object_get(m, "name"));
        if (n != NULL && strcmp(n, name) == 0)
            return m;
    }
    return NULL;
}

/* "device", "host", "unpinned", or NULL for a model not loaded. */
static const char *residency_of(const json_t *m, char *buf, size_t cap)
{
    const char *r = json_string_value(json_object_get(m, "residency"));
    if (r == NULL || strcmp(r, "RESIDENCY_UNSPECIFIED") == 0)
        return NULL;
    size_t i = 0;
    for (; r[i] != '\0' && i + 1 < cap; i++)
        buf[i] = (char)tolower((unsigned char)r[i]);
    buf[i] = '\0';
    return buf;
}

/* The control status, or NULL when the server has none for us. */
static json_t *control_status(pjs_client *c)
{
    char *text = NULL;
    pjs_client_error err;
    if (pjs_client_control_status(c, &text, &err) != 0)
        return NULL;
    return pjs_cli_parse_doc(text);
}

static json_t *model_entry(const json_t *m, const json_t *control)
{
    const char *name = json_string_value(json_object_get(m, "name"));
    json_t *e = json_pack("{s:s, s:s, s:s, s:s}", "name", name ? name : "", "version",
                          text_of(json_object_get(m, "version")), "state",
                          text_of(json_object_get(m, "state")), "reason",
                          text_of(json_object_get(m, "reason")));
    const json_t *cm = name != NULL ? control_model(control, name) : NULL;
    char buf[32];
    const char *residency = residency_of(cm, buf, sizeof buf);
    if (residency != NULL) {
        json_object_set_new(e, "residency", json_string(residency));
        json_object_set_new(e, "resident", json_boolean(json_is_true(json_object_get(cm, "resident"))));
        json_object_set(e, "weight_bytes", json_object_get(cm, "weight_bytes"));
        json_object_set(e, "queue_depth", json_object_get(cm, "queue_depth"));
    }
    return e;
}

static void models_table(const json_t *list)
{
    pjs_cli_table t;
    pjs_cli_table_init(&t, 6);
    const char *head[] = {"MODEL", "STATE", "RESIDENCY", "ON DEVICE", "WEIGHTS", "REASON"};
    pjs_cli_table_row(&t, head);
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        const json_t *residency = json_object_get(e, "residency");
        char weights[32] = "";
        if (residency != NULL)
            pjs_cli_format_bytes((double)json_integer_value(json_object_get(e, "weight_bytes")),
                                 weights, sizeof weights);
        const char *row[] = {
            json_string_value(json_object_get(e, "name")),
            json_string_value(json_object_get(e, "state")),
            json_string_value(residency),
            residency == NULL ? NULL
            : json_is_true(json_object_get(e, "resident")) ? "yes"
                                                            : "no",
            weights,
            json_string_value(json_object_get(e, "reason")),
        };
        pjs_cli_table_row(&t, row);
    }
    pjs_cli_table_print(&t);
    pjs_cli_table_free(&t);
}

int pjs_cmd_models(int argc, char **argv)
{
    pjs_cli_conn conn = {0};
    bool ready_only = false;
    int rc = parse("models", models_help, argc, argv, &conn, &ready_only, NULL);
    if (rc != PJS_EXIT_OK)
        return rc < 0 ? PJS_EXIT_OK : rc;
    pjs_client *c;
    if ((rc = pjs_cli_connect("models", &conn, &c)) != 0)
        return rc;
    char *text = NULL;
    pjs_client_error err;
    if (pjs_client_repository_index(c, ready_only, &text, &err) != 0) {
        rc = pjs_cli_client_fail(c, "repository index", &err);
        pjs_client_close(c);
        return rc;
    }
    json_t *index = pjs_cli_parse_doc(text);
    json_t *control = control_status(c);
    pjs_client_close(c);
    const json_t *models = index_models(index);
    json_t *list = json_array();
    for (size_t i = 0; i < json_array_size(models); i++)
        json_array_append_new(list, model_entry(json_array_get(models, i), control));
    if (conn.json) {
        json_t *doc = json_pack("{s:o, s:b}", "models", list, "control", control != NULL);
        pjs_cli_print_json(doc);
        json_decref(doc);
    } else {
        models_table(list);
        json_decref(list);
    }
    json_decref(index);
    json_decref(control);
    return PJS_EXIT_OK;
}

static int model_action(int argc, char **argv, bool load)
{
    const char *cmd = load ? "load" : "unload";
    pjs_cli_conn conn = {0};
    const char *model = NULL;
    int rc = parse(cmd, load_help, argc, argv, &conn, NULL, &model);
    if (rc != PJS_EXIT_OK)
        return rc < 0 ? PJS_EXIT_OK : rc;
    pjs_client *c;
    if ((rc = pjs_cli_connect(cmd, &conn, &c)) != 0)
        return rc;
    pjs_client_error err;
    rc = load ? pjs_client_load_model(c, model, &err) : pjs_client_unload_model(c, model, &err);
    if (rc != 0) {
        char what[600];
        snprintf(what, sizeof what, "%s %s", cmd, model);
        rc = pjs_cli_client_fail(c, what, &err);
    } else if (conn.json) {
        json_t *doc = json_pack("{s:s, s:s}", "model", model, "state", load ? "READY" : "UNLOADED");
        pjs_cli_print_json(doc);
        json_decref(doc);
    } else {
        printf("%s %s\n", load ? "loaded" : "unloaded", model);
    }
    pjs_client_close(c);
    return rc;
}

int pjs_cmd_load(int argc, char **argv)
{
    return model_action(argc, argv, true);
}

int pjs_cmd_unload(int argc, char **argv)
{
    return model_action(argc, argv, false);
}

/* ---- status ---------------------------------------------------------------------- */

/* {"READY": n, ...} of the index. */
static json_t *count_states(const json_t *index)
{
    json_t *counts = json_object();
    const json_t *models = index_models(index);
    for (size_t i = 0; i < json_array_size(models); i++) {
        const char *state = json_string_value(json_object_get(json_array_get(models, i), "state"));
        if (state == NULL)
            continue;
        json_int_t n = json_integer_value(json_object_get(counts, state));
        json_object_set_new(counts, state, json_integer(n + 1));
    }
    return counts;
}

static void print_status(const json_t *doc)
{
    pjs_cli_table t;
    pjs_cli_table_init(&t, 2);
    char line[1024];
    snprintf(line, sizeof line, "%s %s", text_of(json_object_get(doc, "name")),
             text_of(json_object_get(doc, "version")));
    const char *rows[][2] = {
        {"server", line},
        {"url", json_string_value(json_object_get(doc, "url"))},
        {"live", json_is_true(json_object_get(doc, "live")) ? "yes" : "no"},
        {"ready", json_is_true(json_object_get(doc, "ready")) ? "yes" : "no"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        pjs_cli_table_row(&t, rows[i]);
    size_t n = 0;
    const char *state;
    json_t *count;
    line[0] = '\0';
    json_object_foreach(json_object_get(doc, "models"), state, count) {
        n += (size_t)snprintf(line + n, n < sizeof line ? sizeof line - n : 0, "%s%lld %s",
                              n ? ", " : "", (long long)json_integer_value(count), state);
    }
    const char *models_row[] = {"models", line[0] ? line : "none"};
    pjs_cli_table_row(&t, models_row);
    const json_t *cache = json_object_get(json_object_get(doc, "control"), "cache");
    if (cache != NULL) {
        char used[32], budget[32], pinned[32];
        pjs_cli_format_bytes((double)json_integer_value(json_object_get(cache, "used_bytes")),
                             used, sizeof used);
        pjs_cli_format_bytes((double)json_integer_value(json_object_get(cache, "budget_bytes")),
                             budget, sizeof budget);
        pjs_cli_format_bytes((double)json_integer_value(json_object_get(cache, "pinned_bytes")),
                             pinned, sizeof pinned);
        snprintf(line, sizeof line, "%s on the device of %s budget, %s pinned", used,
                 json_is_true(json_object_get(cache, "unlimited")) ? "an unlimited" : budget,
                 pinned);
        const char *row[] = {"weights", line};
        pjs_cli_table_row(&t, row);
        const char *mode[] = {"control",
                              json_string_value(json_object_get(json_object_get(doc, "control"),
                                                                "control_mode"))};
        pjs_cli_table_row(&t, mode);
    }
    line[0] = '\0';
    n = 0;
    const json_t *ext = json_object_get(doc, "extensions");
    for (size_t i = 0; i < json_array_size(ext); i++)
        n += (size_t)snprintf(line + n, n < sizeof line ? sizeof line - n : 0, "%s%s",
                              i ? " " : "", json_string_value(json_array_get(ext, i)));
    const char *ext_row[] = {"extensions", line};
    pjs_cli_table_row(&t, ext_row);
    pjs_cli_table_print(&t);
    pjs_cli_table_free(&t);
}

int pjs_cmd_status(int argc, char **argv)
{
    pjs_cli_conn conn = {0};
    int rc = parse("status", status_help, argc, argv, &conn, NULL, NULL);
    if (rc != PJS_EXIT_OK)
        return rc < 0 ? PJS_EXIT_OK : rc;
    pjs_client *c;
    if ((rc = pjs_cli_connect("status", &conn, &c)) != 0)
        return rc;
    pjs_client_error err;
    int live = 0, ready = 0;
    char *meta_text = NULL, *index_text = NULL;
    if (pjs_client_server_live(c, &live, &err) != 0 ||
        pjs_client_server_ready(c, &ready, &err) != 0 ||
        pjs_client_server_metadata(c, &meta_text, &err) != 0 ||
        pjs_client_repository_index(c, 0, &index_text, &err) != 0) {
        pjs_client_free(meta_text);
        rc = pjs_cli_client_fail(c, "server status", &err);
        pjs_client_close(c);
        return rc;
    }
    json_t *meta = pjs_cli_parse_doc(meta_text);
    json_t *index = pjs_cli_parse_doc(index_text);
    json_t *control = control_status(c);
    pjs_client_close(c);
    char url[1024];
    const json_t *extensions = json_object_get(meta, "extensions");
    json_t *doc = json_pack("{s:s, s:s, s:s, s:O, s:b, s:b, s:o, s:o}", "url",
                            pjs_cli_url(&conn, url, sizeof url), "name",
                            text_of(json_object_get(meta, "name")), "version",
                            text_of(json_object_get(meta, "version")), "extensions",
                            extensions != NULL ? extensions : json_null(), "live", live, "ready",
                            ready, "models", count_states(index), "control",
                            control != NULL ? control : json_null());
    if (conn.json)
        pjs_cli_print_json(doc);
    else
        print_status(doc);
    json_decref(doc);
    json_decref(meta);
    json_decref(index);
    return PJS_EXIT_OK;
}
