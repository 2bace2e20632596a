/*
 * options.c - the options and start-up steps the subcommands share.
 */
#include <dirent.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/log.h"
#include "registry/bundle.h"
#include "runtime/cpu_threads.h"

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

void pjs_cli_block_stop_signals(sigset_t *out)
{
    sigemptyset(out);
    sigaddset(out, SIGINT);
    sigaddset(out, SIGTERM);
    pthread_sigmask(SIG_BLOCK, out, NULL);
    signal(SIGPIPE, SIG_IGN);
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
    case 0x105:
        if (pjs_rt_cpu_threads_parse(arg, &o->cpu_threads, &err) != 0) {
            fprintf(stderr, "pjserve: %s\n", err.msg);
            return -1;
        }
        return 1;
    /* The next three take effect at once: options are parsed before any
     * plugin is loaded, and the plugin reads them when it starts. */
    case 0x106:
        if (pjs_rt_set_device_schedule(arg, &err) != 0) {
            fprintf(stderr, "pjserve: %s\n", err.msg);
            return -1;
        }
        return 1;
    case 0x107:
        if (pjs_rt_add_xla_flags(arg, &err) != 0) {
            fprintf(stderr, "pjserve: %s\n", err.msg);
            return -1;
        }
        return 1;
    case 0x108: {
        pjs_rt_wait_mode mode;
        if (pjs_rt_wait_mode_parse(arg, &mode, &err) != 0) {
            fprintf(stderr, "pjserve: %s\n", err.msg);
            return -1;
        }
        pjs_rt_set_wait_mode(mode);
        return 1;
    }
    case 0x109: {
        pjs_rt_upload_mode mode;
        if (pjs_rt_upload_mode_parse(arg, &mode, &err) != 0) {
            fprintf(stderr, "pjserve: %s\n", err.msg);
            return -1;
        }
        pjs_rt_set_upload_mode(mode);
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
    o->model_dirs = argv + optind;
    o->n_model_dirs = (size_t)(argc - optind);
    return PJS_EXIT_OK;
}

/* The largest work estimate (FLOPs of one execution) of a bundle, kept in
 * *largest with its directory in which; bundles that do not open are left
 * to the command to report. */
static void estimate_bundle(const char *dir, double *largest, char *which, size_t which_size)
{
    pjs_bundle *b = NULL;
    pjs_error err;
    if (pjs_bundle_open(dir, &b, &err) != 0)
        return;
    double flops = pjs_rt_cpu_flops_estimate(&b->manifest, &b->weights);
    if (flops > *largest) {
        *largest = flops;
        snprintf(which, which_size, "%s", dir);
    }
    pjs_bundle_close(b);
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A directory holding manifest.yaml is a bundle; any other directory is a
 * repository whose subdirectories are bundles. */
static void estimate_dir(const char *dir, double *largest, char *which, size_t which_size)
{
    char path[PJS_BUNDLE_DIR_MAX + 300];
    snprintf(path, sizeof path, "%s/manifest.yaml", dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        estimate_bundle(dir, largest, which, which_size);
        return;
    }
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (de->d_name[0] != '.' && is_dir(path))
            estimate_bundle(path, largest, which, which_size);
    }
    closedir(d);
}

static int auto_cpu_threads(char *const *dirs, size_t n_dirs)
{
    double largest = -1;
    char which[PJS_BUNDLE_DIR_MAX + 300] = "";
    for (size_t i = 0; i < n_dirs; i++)
        estimate_dir(dirs[i], &largest, which, sizeof which);
    int threads = pjs_rt_cpu_threads_auto(largest);
    if (getenv("PJRT_NPROC") != NULL || getenv("NPROC") != NULL)
        pjs_info("CPU plugin threads: %d (auto: as PJRT_NPROC / NPROC say)", threads);
    else if (largest < 0)
        pjs_info("CPU plugin threads: %d (auto: no model to size them by)", threads);
    else
        pjs_info("CPU plugin threads: %d (auto: largest model %s, about %.3g MFLOP in its "
                 "smallest execution; more than one thread from %.3g)",
                 threads, which, largest / 1e6, PJS_RT_CPU_PARALLEL_FLOPS / 1e6);
    return threads;
}

size_t pjs_cli_client_options(const pjs_cli_common *o, char *const *dirs, size_t n_dirs,
                              pjs_rt_option *out)
{
    size_t n = 0;
    bool given = false;
    for (size_t i = 0; i < o->n_pjrt_options; i++) {
        out[n++] = o->pjrt_options[i];
        given = given || strcmp(o->pjrt_options[i].key, PJS_RT_OPTION_CPU_THREADS) == 0;
    }
    if (given)
        return n;
    int threads = o->cpu_threads;
    if (threads > 0)
        pjs_info("CPU plugin threads: %d (--cpu-intra-op-threads)", threads);
    else
        threads = auto_cpu_threads(dirs, n_dirs);
    pjs_rt_option *t = &out[n++];
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "%s", PJS_RT_OPTION_CPU_THREADS);
    t->type = PJRT_NAMED_INT64;
    t->int_value = threads;
    return n;
}

int pjs_cli_start(const pjs_cli_common *o, pjs_cli_runtime *rt)
{
    pjs_error err;
    rt->plugin = NULL;
    rt->client = NULL;
    rt->cache = NULL;
    pjs_rt_option options[PJS_CLI_MAX_PJRT_OPTIONS + 1];
    size_t n = pjs_cli_client_options(o, o->model_dirs, o->n_model_dirs, options);
    if (pjs_rt_client_open(o->plugin_path, options, n, &rt->client, &err) != 0)
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
