/*
 * cmd_import_triton.c - `pjserve import-triton TRITON_REPO OUT_REPO`: convert a
 * Triton model repository into a pjserve one.
 *
 * The converter is Python (python/pjserve_export/import_triton.py: it reads
 * config.pbtxt with protobuf and Triton's schema from tritonclient, and
 * exports ONNX models through export_onnx, which needs onnx and jax). This
 * command finds an interpreter that has them and replaces itself with it
 * (execv), passing every argument on:
 *
 *   1. $PJSERVE_PYTHON, when set;
 *   2. .venv-torch/bin/python beside the directory holding this binary
 *      (build/pjserve -> .venv-torch), then in the source tree pjserve was
 *      built from;
 *   3. .venv/bin/python, the same two places (no onnx there: the converter
 *      then says so);
 *   4. python3 on PATH.
 *
 * PYTHONPATH gets the source tree's python/ directory, found the same way
 * (beside the build directory, then the tree built from), so the converter
 * runs from the source; an installed pjserve has no such tree and needs
 * PJSERVE_PYTHON naming a Python where pjserve_export is installed.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

static const char help[] =
    "usage: pjserve import-triton TRITON_REPO OUT_REPO [OPTIONS]\n"
    "\n"
    "Converts a Triton model repository into a pjserve model repository: each\n"
    "model directory's config.pbtxt (read with protobuf's text parser and Triton's\n"
    "ModelConfig schema) and model file become one bundle of OUT_REPO. Prints a\n"
    "line per model and a summary; docs/coming-from-triton.md has the full table.\n"
    "\n"
    "converted:\n"
    "  ONNX models (platform onnxruntime_onnx or backend onnxruntime,\n"
    "  VERSION/model.onnx: the latest version, or version_policy's) through\n"
    "  pjserve_export.export_onnx; TorchScript models (platform pytorch_libtorch,\n"
    "  VERSION/model.pt) the same way after torch.onnx.export, checked against\n"
    "  TorchScript with onnxruntime; ensembles (platform ensemble) as ensemble\n"
    "  bundles whose steps call the converted models.\n"
    "mapped:\n"
    "  name; max_batch_size -> compiled batch sizes (powers of two up to it, it,\n"
    "  and dynamic_batching.preferred_batch_size); input/output names, data types\n"
    "  and dims (64-bit types are served as 32-bit ones); format (NHWC, NCHW);\n"
    "  label_filename -> the output's labels; dynamic_batching.default_queue_policy\n"
    "  (default_timeout_microseconds, max_queue_size) -> OUT_REPO/pjserve.yaml, the\n"
    "  server's --config file; sequence_batching with implicit state (zero initial\n"
    "  state) and START/END/READY/CORRID control inputs -> the manifest's sequence\n"
    "  section; ensemble_scheduling steps -> ensemble.steps.\n"
    "harmless, noted:\n"
    "  instance_group of KIND_CPU/KIND_AUTO (any count), model_warmup,\n"
    "  max_queue_delay_microseconds, preserve_ordering, the sequence strategy.\n"
    "refused, naming the model and the field:\n"
    "  other platforms and backends (tensorrt, tensorflow, python, ...: export\n"
    "  the model's framework code with pjserve_export instead),\n"
    "  TYPE_STRING tensors, dims of -1 besides the batch axis that the ONNX file\n"
    "  leaves open (unless --shape), reshape, ragged batching, priority levels,\n"
    "  timeout_action DELAY, decoupled models, ops export_onnx cannot lower, a\n"
    "  malformed config.pbtxt, and any other field that is set; instance_group on\n"
    "  GPUs, optimization, parameters, response_cache, model_metrics, metric_tags,\n"
    "  cc_model_filenames and dynamic_batching.priority_levels are imported\n"
    "  without the field with --ignore FIELD.\n"
    "\n"
    "options (passed to the converter):\n"
    "  --batch-sizes [NAME=]LIST  compiled batch sizes (1,4,8) instead of the\n"
    "                         powers of two; NAME= for one model; repeatable\n"
    "  --shape MODEL:INPUT=D1,D2,...  the extents (without the batch axis) to\n"
    "                         compile an input at where the config says -1\n"
    "  --ignore FIELD         import models that set FIELD without it; repeatable\n"
    "  --only NAME            convert only this model; repeatable\n"
    "  --force                replace bundles of the same name in OUT_REPO\n"
    "  -h, --help             this text\n"
    "\n"
    "Exit status: 0 every model converted; 1 some were refused (the others are\n"
    "written all the same); 2 usage.\n"
    "\n"
    "The converter is Python (pjserve_export.import_triton) and needs onnx, jax\n"
    "and tritonclient (and torch for TorchScript). The interpreter:\n"
    "$PJSERVE_PYTHON if set; else .venv-torch/bin/python beside the directory\n"
    "holding this binary (build/pjserve -> .venv-torch), then in the source tree\n"
    "it was built from (make bootstrap-torch makes it); else .venv/bin/python\n"
    "there; else python3 on PATH. PYTHONPATH gets the source tree's python/\n"
    "directory, found the same way. An installed pjserve has no source tree: set\n"
    "PJSERVE_PYTHON to a Python where pjserve_export (pip install python/), onnx\n"
    "and tritonclient are installed.\n";

/* What the interpreter runs: the converter's main, or a message saying what
 * to do when it cannot be imported. */
static const char boot[] =
    "import sys\n"
    "try:\n"
    "    from pjserve_export.import_triton import main\n"
    "except ImportError as e:\n"
    "    sys.stderr.write('pjserve: error: %s cannot import the converter (%s): no Python with '\n"
    "                     'pjserve_export, onnx and tritonclient found: set PJSERVE_PYTHON to '\n"
    "                     'one, or run make bootstrap-torch\\n' % (sys.executable, e))\n"
    "    sys.exit(1)\n"
    "sys.exit(main(sys.argv[1:]))\n";

static bool executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The directory above the one holding this binary (build/pjserve -> the
 * source tree), or "" when /proc/self/exe cannot be read. */
static void binary_parent(char *out, size_t size)
{
    out[0] = '\0';
    ssize_t n = readlink("/proc/self/exe", out, size - 1);
    if (n <= 0)
        return;
    out[n] = '\0';
    for (int up = 0; up < 2; up++) { /* the binary's name, then its directory's */
        char *slash = strrchr(out, '/');
        if (slash == NULL) {
            out[0] = '\0';
            return;
        }
        *slash = '\0';
    }
}

/* The first of `roots` where `rel` exists (an executable file, or a
 * directory when `dir`); 0 when found. */
static int find_in(const char *const *roots, size_t n_roots, const char *rel, bool dir,
                   char *out, size_t size)
{
    for (size_t i = 0; i < n_roots; i++) {
        if (roots[i] == NULL || roots[i][0] == '\0')
            continue;
        int len = snprintf(out, size, "%s/%s", roots[i], rel);
        if (len < 0 || (size_t)len >= size)
            continue;
        if (dir ? is_dir(out) : executable(out))
            return 0;
    }
    out[0] = '\0';
    return -1;
}

int pjs_cmd_import_triton(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(help, stdout);
            return PJS_EXIT_OK;
        }
    }
    int positional = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-')
            positional++;
        else if (strchr(argv[i], '=') == NULL && strcmp(argv[i], "--force") != 0 && i + 1 < argc)
            i++; /* an option's value */
    }
    if (positional < 2)
        return pjs_cli_usage_error("import-triton", "expected TRITON_REPO and OUT_REPO");

    char parent[PATH_MAX];
    binary_parent(parent, sizeof parent);
#ifdef PJSERVE_SOURCE_DIR
    const char *source = PJSERVE_SOURCE_DIR;
#else
    const char *source = NULL;
#endif
    const char *roots[] = {parent, source};
    size_t n_roots = sizeof roots / sizeof roots[0];

    char python[PATH_MAX + 64];
    const char *env = getenv("PJSERVE_PYTHON");
    if (env != NULL && env[0] != '\0') {
        if (!executable(env))
            return pjs_cli_fail("PJSERVE_PYTHON=%s is not an executable file: name a Python "
                                "with onnx and tritonclient (such as .venv-torch/bin/python), "
                                "or unset it to use the project's .venv-torch",
                                env);
        snprintf(python, sizeof python, "%s", env);
    } else if (find_in(roots, n_roots, ".venv-torch/bin/python", false, python,
                       sizeof python) != 0 &&
               find_in(roots, n_roots, ".venv/bin/python", false, python, sizeof python) != 0) {
        snprintf(python, sizeof python, "python3");
    }

    char pydir[PATH_MAX + 64];
    if (find_in(roots, n_roots, "python/pjserve_export", true, pydir, sizeof pydir) == 0) {
        pydir[strlen(pydir) - strlen("/pjserve_export")] = '\0';
        const char *old = getenv("PYTHONPATH");
        size_t len = strlen(pydir) + (old != NULL ? strlen(old) : 0) + 2;
        char *path = malloc(len);
        if (path == NULL)
            return pjs_cli_fail("out of memory");
        snprintf(path, len, "%s%s%s", pydir, old != NULL && old[0] != '\0' ? ":" : "",
                 old != NULL ? old : "");
        setenv("PYTHONPATH", path, 1);
        free(path);
    }

    /* python -c BOOT ARGS...: the converter's sys.argv[1:] are our arguments */
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (args == NULL)
        return pjs_cli_fail("out of memory");
    args[0] = python;
    args[1] = "-c";
    args[2] = (char *)boot;
    for (int i = 1; i < argc; i++)
        args[2 + i] = argv[i];
    fflush(stdout);
    if (strchr(python, '/') != NULL)
        execv(python, args);
    else
        execvp(python, args);
    int e = errno;
    free(args);
    return pjs_cli_fail("cannot run %s: %s: no Python with onnx found: set PJSERVE_PYTHON or "
                        "run make bootstrap-torch",
                        python, strerror(e));
}
