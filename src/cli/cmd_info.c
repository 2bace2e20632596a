/*
 * cmd_info.c - `pjserve info`: what the PJRT plugin is and can do, and what
 * the bundles named on the command line hold (opened, not compiled).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "registry/bundle.h"

static const char help[] =
    "usage: pjserve info [OPTIONS] [BUNDLE...]\n"
    "\n"
    "Loads the PJRT plugin, creates a client and prints the plugin path, PJRT API\n"
    "version, platform, devices and the StableHLO versions the plugin accepts\n"
    "(export bundles for a version inside that window). For each BUNDLE, opens it\n"
    "without compiling and prints its batch sizes, tensors and input-shape\n"
    "variants. Exits 1 if a bundle is invalid.\n"
    "\n"
    "options:\n" PJS_CLI_COMMON_HELP;

/* Opens a bundle (manifest, weights header, module files) and describes it. */
static int describe_bundle(const char *dir)
{
    pjs_error err;
    pjs_bundle *b = NULL;
    if (pjs_bundle_open(dir, &b, &err) != 0)
        return pjs_cli_fail("%s", err.msg);
    const pjs_manifest *m = &b->manifest;
    printf("bundle %s (%s)\n", m->name, dir);
    pjs_cli_print_manifest(m);
    printf("  variants: %zu (", m->n_variants);
    for (size_t v = 0; v < m->n_variants; v++)
        printf("%s%s", v ? ", " : "", m->variants[v].name);
    printf("), modules: %zu\n", b->n_modules);
    pjs_bundle_close(b);
    return PJS_EXIT_OK;
}

static void print_version(const char *label, const int64_t v[3])
{
    if (v[0] < 0)
        printf("%s unknown", label);
    else
        printf("%s %lld.%lld.%lld", label, (long long)v[0], (long long)v[1], (long long)v[2]);
}

int pjs_cmd_info(int argc, char **argv)
{
    pjs_cli_common common = {0};
    int rc = pjs_cli_parse_common_only("info", help, argc, argv, &common);
    if (rc != PJS_EXIT_OK)
        return rc < 0 ? PJS_EXIT_OK : rc;
    common.no_cache = true;
    pjs_cli_runtime rt;
    rc = pjs_cli_start(&common, &rt);
    if (rc != PJS_EXIT_OK)
        return rc;
    const pjs_rt_plugin_info *info = pjs_rt_plugin_get_info(rt.plugin);
    printf("plugin: %s\n", info->path);
    printf("pjrt api: %d.%d\n", info->api_major, info->api_minor);
    printf("platform: %s\n", pjs_rt_client_platform(rt.client));
    printf("platform version: %s\n", pjs_rt_client_platform_version(rt.client));
    if (info->xla_version >= 0)
        printf("xla version: %lld\n", (long long)info->xla_version);
    printf("stablehlo: ");
    print_version("current", info->stablehlo_current);
    print_version(", minimum", info->stablehlo_minimum);
    printf("\n");
    size_t n = pjs_rt_client_device_count(rt.client);
    printf("devices: %zu\n", n);
    for (size_t i = 0; i < n; i++) {
        char desc[512];
        pjs_rt_client_describe_device(rt.client, i, desc, sizeof desc);
        printf("  %s%s\n", desc, i == 0 ? "  [used]" : "");
    }
    pjs_cli_stop(&rt);
    for (int i = optind; i < argc; i++)
        if (describe_bundle(argv[i]) != PJS_EXIT_OK)
            rc = PJS_EXIT_FAILURE;
    return rc;
}
