/*
 * main.c - pjserve's entry point: picks the subcommand.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"

static const char usage[] =
    "pjserve - serve ahead-of-time compiled StableHLO models through a PJRT plugin\n"
    "\n"
    "usage: pjserve COMMAND [OPTIONS]\n"
    "\n"
    "commands:\n"
    "  serve --model-repository DIR\n"
    "                  serve every bundle in DIR over KServe V2 gRPC (:8001) and\n"
    "                  HTTP/REST (:8000), with Prometheus metrics (:8002)\n"
    "  node --model-repository DIR [--workers N | --devices auto|LIST]\n"
    "                  one serve worker process per device, supervised and\n"
    "                  restarted, behind one endpoint (docs/node.md)\n"
    "  gateway --worker ADDR ...\n"
    "                  one KServe V2 endpoint over pjserve workers (docs/gateway.md)\n"
    "  run BUNDLE --input NAME=FILE.npy ... --output-dir DIR\n"
    "                  load, compile and execute a bundle once; write outputs as .npy\n"
    "  check BUNDLE... validate and compile bundles; report what was found\n"
    "  build-hooks BUNDLE...\n"
    "                  compile each bundle's model.c (hooks, a meta's run) into\n"
    "                  model.so against pjserve/model.h\n"
    "  info [BUNDLE...]\n"
    "                  show the PJRT plugin: platform, API version, devices, and the\n"
    "                  StableHLO versions it accepts; and each BUNDLE's shapes and\n"
    "                  variants\n"
    "  import-triton TRITON_REPO OUT_REPO\n"
    "                  convert a Triton model repository (config.pbtxt, ONNX models,\n"
    "                  ensembles) into a pjserve one (runs pjserve_export in Python)\n"
    "\n"
    "commands that talk to a running server (--url, default localhost:8001):\n"
    "  infer MODEL --input NAME=FILE.npy ... [--output-dir DIR]\n"
    "                  one inference; outputs shown or written as .npy\n"
    "  models          the repository's models: state, residency, weights\n"
    "  load MODEL      load (or reload) a model\n"
    "  unload MODEL    unload a model\n"
    "  status          health, models by state, the device weight cache\n"
    "  top             a live view of the models' queues, rates, latency and\n"
    "                  residency, the weight cache and the device (REST and\n"
    "                  metrics ports)\n"
    "\n"
    "Run 'pjserve COMMAND --help' for a command's options. A bundle is a directory\n"
    "with manifest.yaml, weights.safetensors and model.b{N}.mlir files; see\n"
    "docs/bundle-format.md, and docs/exporter.md to make one from JAX or PyTorch.\n"
    "\n"
    "environment:\n"
    "  PJSERVE_PJRT_PLUGIN   PJRT plugin .so used when --pjrt-plugin is not given\n"
    "  PJSERVE_CACHE_DIR     executable cache directory\n"
    "  PJSERVE_LOG_LEVEL     debug | info | warn | error\n"
    "  PJSERVE_URL           the server the client commands talk to\n"
    "  PJSERVE_SCHEDULER_*   serve's scheduler settings (pjserve serve --help)\n"
    "  PJSERVE_PYTHON        the Python import-triton runs (default: .venv-torch)\n";

int main(int argc, char **argv)
{
    const char *level = getenv("PJSERVE_LOG_LEVEL");
    if (level != NULL && pjs_log_parse_level(level) >= 0)
        pjs_log_set_level((pjs_log_level)pjs_log_parse_level(level));
    if (argc < 2) {
        fputs(usage, stderr);
        return PJS_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
        return PJS_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("pjserve %s\n", PJSERVE_VERSION);
        return PJS_EXIT_OK;
    }
    if (strcmp(cmd, "serve") == 0)
        return pjs_cmd_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "node") == 0)
        return pjs_cmd_node(argc - 1, argv + 1);
    if (strcmp(cmd, "gateway") == 0)
        return pjs_cmd_gateway(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0)
        return pjs_cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "check") == 0)
        return pjs_cmd_check(argc - 1, argv + 1);
    if (strcmp(cmd, "build-hooks") == 0)
        return pjs_cmd_build_hooks(argc - 1, argv + 1);
    if (strcmp(cmd, "info") == 0)
        return pjs_cmd_info(argc - 1, argv + 1);
    if (strcmp(cmd, "import-triton") == 0)
        return pjs_cmd_import_triton(argc - 1, argv + 1);
    if (strcmp(cmd, "infer") == 0)
        return pjs_cmd_infer(argc - 1, argv + 1);
    if (strcmp(cmd, "models") == 0)
        return pjs_cmd_models(argc - 1, argv + 1);
    if (strcmp(cmd, "load") == 0)
        return pjs_cmd_load(argc - 1, argv + 1);
    if (strcmp(cmd, "unload") == 0)
        return pjs_cmd_unload(argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0)
        return pjs_cmd_status(argc - 1, argv + 1);
    if (strcmp(cmd, "top") == 0)
        return pjs_cmd_top(argc - 1, argv + 1);
    fprintf(stderr, "pjserve: unknown command '%s'\n\n%s", cmd, usage);
    return PJS_EXIT_USAGE;
}
