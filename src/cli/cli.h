/*
 * cli.h - the pjserve command line: subcommands and the options they share.
 *
 * main.c dispatches to one cmd_* function per subcommand. Each returns the
 * process exit status: 0 success, 1 failure (a message on stderr starting with
 * "pjserve: error:"), 2 usage error.
 */
#ifndef PJS_CLI_CLI_H
#define PJS_CLI_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/manifest.h"
#include "runtime/exec_cache.h"
#include "runtime/runtime.h"

#define PJS_EXIT_OK 0
#define PJS_EXIT_FAILURE 1
#define PJS_EXIT_USAGE 2

#define PJS_CLI_MAX_PJRT_OPTIONS 16

/* Options every command that touches PJRT accepts. */
typedef struct pjs_cli_common {
    const char *plugin_path;  /* --pjrt-plugin */
    const char *cache_dir;    /* --cache-dir */
    bool no_cache;            /* --no-cache */
    pjs_rt_option pjrt_options[PJS_CLI_MAX_PJRT_OPTIONS]; /* --pjrt-option KEY=VALUE */
    size_t n_pjrt_options;
    int cpu_threads;          /* --cpu-intra-op-threads; 0: auto */
    /* What `auto` sizes the CPU plugin's threads by: bundle directories or
     * repositories (directories of bundles) the command will compile; the
     * positional arguments for commands parsed by pjs_cli_parse_common_only.
     * None: one thread. */
    char *const *model_dirs;
    size_t n_model_dirs;
} pjs_cli_common;

/* What a command gets from pjs_cli_start: a client and an optional cache. */
typedef struct pjs_cli_runtime {
    pjs_rt_plugin *plugin;
    pjs_rt_client *client;
    pjs_exec_cache *cache; /* NULL with --no-cache */
} pjs_cli_runtime;

/* Long options shared by the commands, for getopt_long tables. */
#define PJS_CLI_COMMON_LONG_OPTIONS                                                                \
    {"pjrt-plugin", required_argument, NULL, 0x100},                                               \
        {"cache-dir", required_argument, NULL, 0x101},                                             \
        {"no-cache", no_argument, NULL, 0x102},                                                    \
        {"pjrt-option", required_argument, NULL, 0x103},                                           \
        {"log-level", required_argument, NULL, 0x104},                                             \
        {"cpu-intra-op-threads", required_argument, NULL, 0x105},                                  \
        {"device-schedule", required_argument, NULL, 0x106},                                       \
        {"xla-flags", required_argument, NULL, 0x107},                                             \
        {"execution-wait", required_argument, NULL, 0x108},                                        \
        {"weight-upload", required_argument, NULL, 0x109}

#define PJS_CLI_COMMON_HELP                                                                        \
    "  --pjrt-plugin PATH     PJRT plugin .so (default: $PJSERVE_PJRT_PLUGIN, else the\n"          \
    "                         CPU plugin installed beside pjserve (make install), else\n"         \
    "                         the xla-cpu-pjrt plugin in the project's .venv)\n"                   \
    "  --pjrt-option K=V      client create option, e.g. preallocate=false or\n"                   \
    "                         memory_fraction=0.5 (GPU plugins); repeatable\n"                     \
    "  --cpu-intra-op-threads N|auto  threads of each XLA CPU plugin pool (intra-op\n"             \
    "                         and execution); auto (default): 1 when every model is\n"             \
    "                         small, else one per CPU (docs/runtime.md)\n"                         \
    "  --device-schedule S    how a GPU plugin's CUDA context waits: auto (default:\n"            \
    "                         CUDA decides), spin, yield or blocking_sync\n"                      \
    "  --xla-flags FLAGS      XLA debug options for the plugin's compiler, as in\n"               \
    "                         XLA_FLAGS (appended to it; part of the cache key)\n"                \
    "  --execution-wait W     await (default): wait in PJRT_Event_Await; callback:\n"             \
    "                         be woken by PJRT_Event_OnReady (docs/runtime.md)\n"                 \
    "  --weight-upload U      how a model's weights go to the device: block (one copy,\n"         \
    "                         the weights views of it), each (a copy per weight) or\n"            \
    "                         auto (default: block, but each on the CPU plugin;\n"               \
    "                         docs/residency.md)\n"                                                \
    "  --cache-dir DIR        executable cache (default: $PJSERVE_CACHE_DIR, else\n"              \
    "                         $XDG_CACHE_HOME/pjserve or ~/.cache/pjserve)\n"                      \
    "  --no-cache             compile every module, read and write no cache\n"                     \
    "  --log-level LEVEL      debug | info | warn | error (default: info, or\n"                    \
    "                         $PJSERVE_LOG_LEVEL)\n"

/* Handles a shared option (opt is getopt_long's return value). Returns 1 if
 * handled, 0 if not a shared option, -1 on a bad value (message printed). */
int pjs_cli_common_option(pjs_cli_common *o, int opt, const char *arg);

/* Parses argv for a command that takes only the shared options (and
 * positional arguments, left at argv[optind..]). Returns PJS_EXIT_OK to go on,
 * -1 after printing `help` for --help, or PJS_EXIT_USAGE. */
int pjs_cli_parse_common_only(const char *cmd, const char *help, int argc, char **argv,
                              pjs_cli_common *o);

/* The client options a command passes: --pjrt-option's, then the CPU thread
 * count (runtime/cpu_threads.h) from --cpu-intra-op-threads or, for auto,
 * from the model in `dirs` (bundles or repositories of bundles) with the
 * most work in its smallest execution (no model: one thread), logged
 * with its reason. `out` has room for PJS_CLI_MAX_PJRT_OPTIONS + 1. Returns
 * the count of options. */
size_t pjs_cli_client_options(const pjs_cli_common *o, char *const *dirs, size_t n_dirs,
                              pjs_rt_option *out);

/* Loads the plugin, creates the client (pjs_cli_client_options over
 * o->model_dirs) and opens the cache. */
int pjs_cli_start(const pjs_cli_common *o, pjs_cli_runtime *rt);
void pjs_cli_stop(pjs_cli_runtime *rt);

/* Prints "pjserve: error: <msg>" on stderr; returns PJS_EXIT_FAILURE. */
int pjs_cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* For a long-running command, before any thread starts: blocks SIGINT and
 * SIGTERM (every thread inherits the mask; the main thread takes them with
 * sigwait on *out) and ignores SIGPIPE. */
void pjs_cli_block_stop_signals(sigset_t *out);
/* Prints "pjserve <cmd>: <msg>" and a hint to --help; returns PJS_EXIT_USAGE. */
int pjs_cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints a model manifest for check and info: kind, batch sizes, the
 * top-level tensors and every other variant's. */
void pjs_cli_print_manifest(const pjs_manifest *m);

int pjs_cmd_build_hooks(int argc, char **argv);
int pjs_cmd_run(int argc, char **argv);
int pjs_cmd_check(int argc, char **argv);
int pjs_cmd_info(int argc, char **argv);
int pjs_cmd_serve(int argc, char **argv);
int pjs_cmd_node(int argc, char **argv);
int pjs_cmd_gateway(int argc, char **argv);
/* Execs the Python converter (cmd_import_triton.c). */
int pjs_cmd_import_triton(int argc, char **argv);
/* Clients of a running server (cmd_infer.c, cmd_models.c). */
int pjs_cmd_infer(int argc, char **argv);
int pjs_cmd_models(int argc, char **argv);
int pjs_cmd_load(int argc, char **argv);
int pjs_cmd_unload(int argc, char **argv);
int pjs_cmd_status(int argc, char **argv);
int pjs_cmd_top(int argc, char **argv);

#endif
