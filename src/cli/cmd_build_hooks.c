/*
 * cmd_build_hooks.c - `pjserve build-hooks`: compile a bundle's model.c into
 * its model.so against this server's pjserve/model.h.
 *
 * The compiler writes a temporary file in the bundle that is renamed over
 * model.so only when it succeeded, so a server watching the repository sees
 * either the old library or the new one, never half of one. The libraries a
 * bundle's manifest lists in hooks_libraries are linked as -lNAME, so the
 * bundle itself says what its model.c needs.
 */
#include <errno.h>
#include <getopt.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/manifest.h"
#include "registry/hooks.h"

extern char **environ;

static const char help[] =
    "usage: pjserve build-hooks [OPTIONS] BUNDLE... [-- COMPILER-ARGS...]\n"
    "\n"
    "Compiles each BUNDLE/model.c into BUNDLE/model.so, the library pjserve loads\n"
    "for a bundle's hooks (pjserve_preprocess, pjserve_postprocess) or a meta\n"
    "model's pjserve_run; see docs/hooks.md and docs/meta-models.md. The command\n"
    "it runs is printed:\n"
    "\n"
    "  CC -std=c11 -O2 -fPIC -shared -Wall -I INCLUDE-DIR -o BUNDLE/model.so\n"
    "     BUNDLE/model.c COMPILER-ARGS -lLIBRARY... -lm\n"
    "\n"
    "where INCLUDE-DIR holds pjserve/model.h and each LIBRARY is one the bundle's\n"
    "manifest lists in hooks_libraries. Arguments after -- go to the\n"
    "compiler (more sources, -I, -D, libraries). A server in dynamic mode reloads\n"
    "a bundle whose model.so changed; one whose model.c is newer than its\n"
    "model.so is refused until this command has run.\n"
    "\n"
    "options:\n"
    "  --cc CC            the C compiler (default: $CC, else cc)\n"
    "  --include-dir DIR  where pjserve/model.h is (default: the installed header,\n"
    "                     else the one in pjserve's source tree)\n"
    "  -h, --help         this text\n";

/* The first of the install and source include directories that holds the
 * header. */
static const char *default_include_dir(void)
{
    static const char *const candidates[] = {PJSERVE_INSTALL_INCLUDE_DIR,
                                             PJSERVE_SOURCE_INCLUDE_DIR};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/pjserve/model.h", candidates[i]);
        if (stat(path, &st) == 0)
            return candidates[i];
    }
    return NULL;
}

static void print_command(char *const *argv)
{
    for (size_t i = 0; argv[i] != NULL; i++)
        printf("%s%s", i ? " " : "", argv[i]);
    printf("\n");
    fflush(stdout);
}

/* The bundle's manifest, for its hooks_libraries; a directory without
 * manifest.yaml (hooks being written before the export) has none. */
static int read_manifest(const char *bundle, pjs_manifest *m)
{
    char path[4200];
    struct stat st;
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "%s/manifest.yaml", bundle);
    if (stat(path, &st) != 0)
        return 0;
    pjs_error err = {0};
    if (pjs_manifest_load(m, path, &err) != 0) {
        fprintf(stderr, "pjserve: error: %s (fix the manifest: its hooks_libraries say what "
                        "model.c links with)\n",
                err.msg);
        return -1;
    }
    return 0;
}

/* Runs the compiler for one bundle; 0 when model.so was written. */
static int build_one(const char *cc, const char *include_dir, const char *bundle,
                     char *const *extra, size_t n_extra)
{
    char source[4200], target[4200], temp[4300];
    pjs_manifest manifest;
    if (read_manifest(bundle, &manifest) != 0)
        return -1;
    size_t n_libs = manifest.n_hooks_libraries;
    snprintf(source, sizeof source, "%s/%s", bundle, PJS_HOOKS_SOURCE);
    snprintf(target, sizeof target, "%s/%s", bundle, PJS_HOOKS_FILE);
    snprintf(temp, sizeof temp, "%s/.%s.%ld.tmp", bundle, PJS_HOOKS_FILE, (long)getpid());
    struct stat st;
    if (stat(source, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "pjserve: error: %s: no such file (write the bundle's hooks there; "
                        "docs/hooks.md shows one)\n",
                source);
        pjs_manifest_free(&manifest);
        return -1;
    }
    const char *fixed[] = {cc,   "-std=c11", "-O2", "-fPIC",  "-shared", "-Wall",
                           "-I", include_dir, "-o", temp,     source};
    size_t n_fixed = sizeof fixed / sizeof fixed[0];
    char **argv = calloc(n_fixed + n_extra + n_libs + 2, sizeof *argv);
    char **libs = calloc(n_libs + 1, sizeof *libs);
    bool ok = argv != NULL && libs != NULL;
    for (size_t i = 0; ok && i < n_libs; i++) {
        size_t len = strlen(manifest.hooks_libraries[i]) + 3;
        ok = (libs[i] = malloc(len)) != NULL;
        if (ok)
            snprintf(libs[i], len, "-l%s", manifest.hooks_libraries[i]);
    }
    pjs_manifest_free(&manifest);
    int e = 0;
    pid_t pid = 0;
    if (ok) {
        for (size_t i = 0; i < n_fixed; i++)
            argv[i] = (char *)fixed[i];
        for (size_t i = 0; i < n_extra; i++)
            argv[n_fixed + i] = extra[i];
        for (size_t i = 0; i < n_libs; i++)
            argv[n_fixed + n_extra + i] = libs[i];
        argv[n_fixed + n_extra + n_libs] = "-lm";
        printf("%s: ", bundle);
        print_command(argv);
        e = posix_spawnp(&pid, cc, NULL, NULL, argv, environ);
    }
    for (size_t i = 0; libs != NULL && i < n_libs; i++)
        free(libs[i]);
    free(libs);
    free(argv);
    if (!ok) {
        fprintf(stderr, "pjserve: error: out of memory\n");
        return -1;
    }
    if (e != 0) {
        fprintf(stderr, "pjserve: error: cannot run the C compiler '%s': %s (install one, or "
                        "name it with --cc or $CC)\n",
                cc, strerror(e));
        return -1;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        unlink(temp);
        fprintf(stderr, "pjserve: error: %s: the compiler failed (%s %d); its messages are "
                        "above\n",
                source, WIFEXITED(status) ? "exit status" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return -1;
    }
    if (rename(temp, target) != 0) {
        fprintf(stderr, "pjserve: error: cannot rename %s to %s: %s\n", temp, target,
                strerror(errno));
        unlink(temp);
        return -1;
    }
    printf("%s: wrote %s (bundle ABI version %u)\n", bundle, target, PJSERVE_MODEL_ABI_VERSION);
    return 0;
}

int pjs_cmd_build_hooks(int argc, char **argv)
{
    enum { OPT_CC = 0x200, OPT_INCLUDE_DIR };
    static const struct option longopts[] = {
        {"cc", required_argument, NULL, OPT_CC},
        {"include-dir", required_argument, NULL, OPT_INCLUDE_DIR},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cc = getenv("CC");
    const char *include_dir = NULL;
    if (cc == NULL || *cc == '\0')
        cc = "cc";
    /* Compiler arguments follow "--"; getopt sees only what precedes it. */
    int end = 1;
    while (end < argc && strcmp(argv[end], "--") != 0)
        end++;
    int opt;
    while ((opt = getopt_long(end, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case OPT_CC: cc = optarg; break;
        case OPT_INCLUDE_DIR: include_dir = optarg; break;
        case 'h': fputs(help, stdout); return PJS_EXIT_OK;
        default: fputs(help, stderr); return PJS_EXIT_USAGE;
        }
    }
    int first = optind;
    if (end == first) {
        fprintf(stderr, "pjserve: error: build-hooks needs at least one BUNDLE directory\n\n%s",
                help);
        return PJS_EXIT_USAGE;
    }
    char *const *extra = end < argc ? argv + end + 1 : NULL;
    size_t n_extra = end < argc ? (size_t)(argc - end - 1) : 0;
    if (include_dir == NULL && (include_dir = default_include_dir()) == NULL) {
        fprintf(stderr, "pjserve: error: pjserve/model.h is neither in %s nor in %s: name its "
                        "directory with --include-dir\n",
                PJSERVE_INSTALL_INCLUDE_DIR, PJSERVE_SOURCE_INCLUDE_DIR);
        return PJS_EXIT_FAILURE;
    }
    int failed = 0;
    for (int i = first; i < end; i++)
        failed += build_one(cc, include_dir, argv[i], extra, n_extra) != 0;
    return failed ? PJS_EXIT_FAILURE : PJS_EXIT_OK;
}
