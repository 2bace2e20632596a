/*
 * options.c - the options and start-up steps the subcommands share.
 */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "core/log.h"

int pjs_cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("pjserve: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return PJS_EXIT_FAILURE;
}

int pjs_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pjserve %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nusage: see 'pjserve %s --help'\n", cmd);
    va_end(ap);
    return PJS_EXIT_USAGE;
}

int pjs_cli_common_option(pjs_cli_common *o, int opt, const char *arg)
{
    pjs_error err;
    switch (opt) {
    case 0x100: o->plugin_path = arg; return 1;
    case 0x101: o->cache_dir = arg; return 1;
    case 0x102: o->no_cache = true; return 1;
    case 0x103:
        if (o->n_pjrt_options == PJS_CLI_MAX_PJRT_OPTIONS) {
            fprintf(stderr, "pjserve: at most %d --pjrt-option flags\n", PJS_CLI_MAX_PJRT_OPTIONS);
            return -1;
        }
        if (pjs_rt_option_parse(arg, &o->pjrt_options[o->n_pjrt_options], &err) != 0) {
            fprintf(stderr, "pjserve: %s\n", err.msg);
            return -1;
        }
        o->n_pjrt_options++;
        return 1;
    case 0x104: {
        int level = pjs_log_parse_level(arg);
        if (level < 0) {
            fprintf(stderr, "pjserve: --log-level %s: expected debug, info, warn or error\n", arg);
            return -1;
        }
        pjs_log_set_level((pjs_log_level)level);
        return 1;
    }
    }
    return 0;
}

int pjs_cli_parse_common_only(const char *cmd, const char *help, int argc, char **argv,
                              pjs_cli_common *o)
{
    static const struct option opts[] = {PJS_CLI_COMMON_LONG_OPTIONS,
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(help, stdout);
            return -1;
        }
        int r = pjs_cli_common_option(o, opt, optarg);
        if (r < 0)
            return PJS_EXIT_USAGE;
        if (r == 0)
            return pjs_cli_usage_error(cmd, "unknown option");
    }
    return PJS_EXIT_OK;
}

int pjs_cli_start(const pjs_cli_common *o, pjs_cli_runtime *rt)
{
    pjs_error err;
    rt->plugin = NULL;
    rt->client = NULL;
    rt->cache = NULL;
    if (pjs_rt_client_open(o->plugin_path, o->pjrt_options, o->n_pjrt_options, &rt->client,
                           &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    rt->plugin = pjs_rt_client_plugin(rt->client);
    rt->cache = pjs_exec_cache_open_or_warn(o->cache_dir, o->no_cache);
    return PJS_EXIT_OK;
}

void pjs_cli_stop(pjs_cli_runtime *rt)
{
    pjs_rt_client_destroy(rt->client);
    pjs_exec_cache_close(rt->cache);
    rt->client = NULL;
    rt->cache = NULL;
}
