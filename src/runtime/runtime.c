/*
 * runtime.c - the PJRT plugin, client, compile, buffers and execute
 * (see runtime.h and pjrt_abi.h).
 *
 * Each call fills a zeroed args struct whose struct_size is our (newest)
 * layout, checks that the plugin's table has the slot, calls it, and turns a
 * returned PJRT_Error into a pjs_error carrying the plugin's message. Loaded
 * plugins are kept in a small process-wide list guarded by a mutex: a plugin
 * is a process-wide object by nature (it may be initialized only once and is
 * never unloaded).
 */
#include "runtime/runtime.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "runtime/cpu_threads.h"
#include "runtime/exec_cache.h"
#include "runtime/hlo_signature.h"

#define MAX_PLUGINS 4
/* A transparent huge page on x86-64 and arm64 (4 KiB base pages). */
#define HUGE_PAGE_BYTES ((size_t)2 << 20)
/* Freed host blocks kept for reuse: at most this many, of at most this many
 * bytes together (pjs_rt_host_free). */
#define HOST_SPARE_BLOCKS 8
#define HOST_SPARE_BYTES ((size_t)64 << 20)

struct pjs_rt_plugin {
    char path[PATH_MAX];
    const struct pjrt_api *api;
    pjs_rt_plugin_info info;
    /* identity for cache keys: api version, xla version, file size, mtime */
    char identity[256];
};

struct pjs_rt_client {
    pjs_rt_plugin *plugin;
    pjrt_client *client;
    pjrt_device *device; /* the device we execute on */
    pjrt_device *const *devices;
    size_t n_devices;
    char platform[64];
    char platform_version[256];
    /* Whether pjs_rt_execute_read starts the output copies before the
     * execution is done (every plugin but the CPU one; see there). */
    bool reads_ahead;
    /* Whether a buffer created with a device layout holds its bytes in that
     * layout (probe_device_layouts); the CPU plugin records the layout and
     * keeps the bytes row-major. */
    bool stores_device_layouts;
    /* The device's number on its platform (PJRT_Device_LocalHardwareId),
     * read once at creation; -1 where the plugin does not tell. */
    int hardware_id;
    /* Threads of each XLA CPU pool (cpu_threads.h); 0 on other platforms.
     * Part of every executable cache key: it shapes the compiled code. */
    int cpu_threads;
    /* What pjs_rt_host_alloc gives: HOST_UNDECIDED until the first call
     * decides (and logs) it, then HOST_DMA_MAPPED or HOST_PAGEABLE. */
    atomic_int host_memory;
    /* Blocks pjs_rt_host_free kept for the next pjs_rt_host_alloc of the
     * same size (see there), under spare_lock. */
    pthread_mutex_t spare_lock;
    pjs_rt_host_memory spare[HOST_SPARE_BLOCKS];
    size_t n_spare, spare_bytes;
    /* The loaded executables by cache key, shared by every compile of the
     * same module (pjs_rt_compile): chained buckets, n_shared_buckets a
     * power of two, grown as they fill. */
    pthread_mutex_t shared_lock;
    pjs_rt_executable **shared;
    size_t n_shared, n_shared_buckets;
};

enum { HOST_UNDECIDED = 0, HOST_DMA_MAPPED, HOST_PAGEABLE };

/* How an executable's outputs are read back, decided from its first
 * execution's outputs: their layouts are fixed when it is compiled.
 *
 * A result is usually dense and row-major on the device, as pjserve sends
 * it; a module may give one another order of dimensions (mhlo.layout_mode),
 * and PJRT_Buffer_ToHostBuffer writes the buffer's own layout (the CPU
 * plugin ignores a host_layout asking for another), so such an output is
 * read and then put in row-major order here.
 *
 * On the CPU plugin a device buffer is host memory: when every output is
 * dense (no tiles, its size that of its elements), an output is copied from
 * its buffer's memory (PJRT_Buffer_UnsafePointer) rather than through
 * ToHostBuffer, which builds a literal, events and futures and hops to the
 * plugin's thread pool and back (docs/runtime.md, "Reading outputs"). */
struct pjs_rt_read_plan {
    int path; /* PJS_RT_READ_IN_PLACE or PJS_RT_READ_BY_PLUGIN */
    size_t n;
    struct {
        bool row_major;
        bool dense; /* its layout read, without tiles or padding */
        uint8_t minor_to_major[PJS_MAX_RANK]; /* the device's order, when not row_major */
    } out[];
};

/* Used when no plan could be allocated: every output read by the plugin, as
 * row-major. */
static struct pjs_rt_read_plan plugin_row_major = {.path = PJS_RT_READ_BY_PLUGIN};

static pthread_mutex_t plugins_lock = PTHREAD_MUTEX_INITIALIZER;
static pjs_rt_plugin *plugins[MAX_PLUGINS];
static size_t n_plugins;

/* xla.CompileOptionsProto { executable_build_options { num_replicas: 1
 * num_partitions: 1 } }: the smallest options every plugin accepts. */
static const char compile_options[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01};

/* True when the plugin's table is long enough to hold the slot at `offset`. */
static bool has_slot(const struct pjrt_api *api, size_t offset)
{
    return api->struct_size >= offset + sizeof(void *);
}

#define HAS_SLOT(api, slot) (has_slot((api), offsetof(struct pjrt_api, slot)) && (api)->slot != NULL)

static const char *pjrt_code_name(int code)
{
    static const char *names[] = {"OK",           "CANCELLED",          "UNKNOWN",
                                  "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                  "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                  "FAILED_PRECONDITION", "ABORTED",      "OUT_OF_RANGE",
                                  "UNIMPLEMENTED", "INTERNAL",            "UNAVAILABLE",
                                  "DATA_LOSS",     "UNAUTHENTICATED"};
    return code >= 0 && code <= 16 ? names[code] : "UNKNOWN";
}

static pjs_status status_of_pjrt_code(int code)
{
    switch (code) {
    case PJRT_CODE_INVALID_ARGUMENT: return PJS_ERR_INVALID_ARGUMENT;
    case PJRT_CODE_NOT_FOUND: return PJS_ERR_NOT_FOUND;
    case PJRT_CODE_RESOURCE_EXHAUSTED: return PJS_ERR_RESOURCE_EXHAUSTED;
    case PJRT_CODE_UNIMPLEMENTED: return PJS_ERR_UNSUPPORTED;
    case PJRT_CODE_FAILED_PRECONDITION: return PJS_ERR_FAILED_PRECONDITION;
    case PJRT_CODE_UNAVAILABLE: return PJS_ERR_UNAVAILABLE;
    case PJRT_CODE_DEADLINE_EXCEEDED: return PJS_ERR_DEADLINE_EXCEEDED;
    default: return PJS_ERR_RUNTIME;
    }
}

/* Converts (and destroys) a PJRT error. `what` names the operation. */
static int take_error(const struct pjrt_api *api, pjrt_error *e, const char *what, pjs_error *err)
{
    struct pjrt_error_message_args m = {.struct_size = sizeof m, .error = e};
    api->error_message(&m);
    int code = PJRT_CODE_UNKNOWN;
    if (HAS_SLOT(api, error_get_code)) {
        struct pjrt_error_get_code_args g = {.struct_size = sizeof g, .error = e};
        pjrt_error *ge = api->error_get_code(&g);
        if (ge == NULL)
            code = g.code;
        else {
            struct pjrt_error_destroy_args d = {.struct_size = sizeof d, .error = ge};
            api->error_destroy(&d);
        }
    }
    pjs_error_set(err, status_of_pjrt_code(code), "%s failed (PJRT %s): %.*s", what,
                  pjrt_code_name(code), (int)m.message_size, m.message ? m.message : "");
    struct pjrt_error_destroy_args d = {.struct_size = sizeof d, .error = e};
    api->error_destroy(&d);
    return err ? err->code : status_of_pjrt_code(code);
}

/* Calls a slot; on error converts it. Usage: CALL(api, slot, &args, "what", err). */
#define CALL(api, slot, args, what, err)                                                            \
    (HAS_SLOT((api), slot)                                                                          \
         ? call_result((api), (api)->slot(args), (what), (err))                                     \
         : pjs_error_set((err), PJS_ERR_UNSUPPORTED,                                                \
                         "%s: this PJRT plugin (API 0.%d) has no " #slot " function", (what),       \
                         (api)->pjrt_api_version.minor_version))

static int call_result(const struct pjrt_api *api, pjrt_error *e, const char *what, pjs_error *err)
{
    return e == NULL ? 0 : take_error(api, e, what, err);
}

static void destroy_event(const struct pjrt_api *api, pjrt_event *ev)
{
    if (ev == NULL)
        return;
    struct pjrt_event_destroy_args d = {.struct_size = sizeof d, .event = ev};
    pjrt_error *e = api->event_destroy(&d);
    if (e != NULL)
        take_error(api, e, "destroying an event", NULL);
}

/* How threads wait for events (pjs_rt_set_wait_mode): process-wide, read
 * at each wait. */
static _Atomic int wait_mode = PJS_RT_WAIT_AWAIT;

/* One wait by callback: the plugin's thread (or the caller's, when the event
 * is already ready) hands the event's error over and wakes the waiter. */
struct callback_wait {
    pthread_mutex_t lock;
    pthread_cond_t ready;
    bool done;
    pjrt_error *error;
};

static void wake_waiter(pjrt_error *error, void *arg)
{
    struct callback_wait *w = arg;
    pthread_mutex_lock(&w->lock);
    w->error = error;
    w->done = true;
    pthread_cond_signal(&w->ready);
    pthread_mutex_unlock(&w->lock);
}

/* PJRT_Event_OnReady, then sleep on our own condition variable: the plugin
 * wakes exactly this thread, with no wait inside the plugin. */
static int wait_by_callback(const struct pjrt_api *api, pjrt_event *ev, const char *what,
                            pjs_error *err)
{
    struct callback_wait w = {.done = false, .error = NULL};
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.ready, NULL);
    struct pjrt_event_on_ready_args a = {
        .struct_size = sizeof a, .event = ev, .callback = wake_waiter, .user_arg = &w};
    int rc = CALL(api, event_on_ready, &a, what, err);
    if (rc == 0) {
        pthread_mutex_lock(&w.lock);
        while (!w.done)
            pthread_cond_wait(&w.ready, &w.lock);
        pthread_mutex_unlock(&w.lock);
        if (w.error != NULL)
            rc = take_error(api, w.error, what, err);
    }
    pthread_cond_destroy(&w.ready);
    pthread_mutex_destroy(&w.lock);
    return rc;
}

/* Waits for and destroys an event. */
static int await_event(const struct pjrt_api *api, pjrt_event *ev, const char *what, pjs_error *err)
{
    if (ev == NULL)
        return 0;
    int rc;
    if (atomic_load_explicit(&wait_mode, memory_order_relaxed) == PJS_RT_WAIT_CALLBACK &&
        HAS_SLOT(api, event_on_ready)) {
        rc = wait_by_callback(api, ev, what, err);
    } else {
        struct pjrt_event_await_args a = {.struct_size = sizeof a, .event = ev};
        rc = CALL(api, event_await, &a, what, err);
    }
    destroy_event(api, ev);
    return rc;
}

int pjs_rt_wait_mode_parse(const char *s, pjs_rt_wait_mode *out, pjs_error *err)
{
    if (strcmp(s, "await") == 0)
        *out = PJS_RT_WAIT_AWAIT;
    else if (strcmp(s, "callback") == 0)
        *out = PJS_RT_WAIT_CALLBACK;
    else
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--execution-wait %s: expected await or callback", s);
    return 0;
}

static _Atomic int upload_mode = PJS_RT_UPLOAD_AUTO;

int pjs_rt_upload_mode_parse(const char *s, pjs_rt_upload_mode *out, pjs_error *err)
{
    if (strcmp(s, "auto") == 0)
        *out = PJS_RT_UPLOAD_AUTO;
    else if (strcmp(s, "block") == 0)
        *out = PJS_RT_UPLOAD_BLOCK;
    else if (strcmp(s, "each") == 0)
        *out = PJS_RT_UPLOAD_EACH;
    else
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--weight-upload %s: expected auto, block or each", s);
    return 0;
}

void pjs_rt_set_upload_mode(pjs_rt_upload_mode mode)
{
    atomic_store_explicit(&upload_mode, mode, memory_order_relaxed);
}

bool pjs_rt_uploads_blocks(const pjs_rt_client *c)
{
    int mode = atomic_load_explicit(&upload_mode, memory_order_relaxed);
    return mode == PJS_RT_UPLOAD_BLOCK ||
           (mode == PJS_RT_UPLOAD_AUTO && strcmp(pjs_rt_client_platform(c), "cpu") != 0);
}

void pjs_rt_set_wait_mode(pjs_rt_wait_mode mode)
{
    atomic_store_explicit(&wait_mode, (int)mode, memory_order_relaxed);
}

int pjs_rt_set_device_schedule(const char *schedule, pjs_error *err)
{
    static const char *const known[] = {"auto", "spin", "yield", "blocking_sync"};
    size_t i = 0;
    while (i < sizeof known / sizeof *known && strcmp(schedule, known[i]) != 0)
        i++;
    if (i == sizeof known / sizeof *known)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--device-schedule %s: expected auto, spin, yield or blocking_sync",
                             schedule);
    int rc = i == 0 ? unsetenv(PJS_RT_DEVICE_SCHEDULE_ENV)
                    : setenv(PJS_RT_DEVICE_SCHEDULE_ENV, schedule, 1);
    if (rc != 0)
        return pjs_error_set(err, PJS_ERR_IO, "setting %s: %s", PJS_RT_DEVICE_SCHEDULE_ENV,
                             strerror(errno));
    return 0;
}

int pjs_rt_add_xla_flags(const char *flags, pjs_error *err)
{
    if (strchr(flags, '\n') != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "--xla-flags: no line breaks");
    const char *now = getenv("XLA_FLAGS");
    size_t n = (now ? strlen(now) + 1 : 0) + strlen(flags) + 1;
    char *joined = malloc(n);
    if (joined == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "--xla-flags: out of memory");
    snprintf(joined, n, "%s%s%s", now ? now : "", now ? " " : "", flags);
    int rc = setenv("XLA_FLAGS", joined, 1);
    free(joined);
    if (rc != 0)
        return pjs_error_set(err, PJS_ERR_IO, "setting XLA_FLAGS: %s", strerror(errno));
    return 0;
}

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls ev until it is ready or spin_ns have passed (then the caller
 * blocks in PJRT_Event_Await as usual). */
static void spin_until_ready(const struct pjrt_api *api, pjrt_event *ev, uint64_t spin_ns)
{
    if (ev == NULL || spin_ns == 0 || !HAS_SLOT(api, event_is_ready))
        return;
    uint64_t until = monotonic_ns() + spin_ns;
    for (;;) {
        struct pjrt_event_is_ready_args r = {.struct_size = sizeof r, .event = ev};
        pjrt_error *e = api->event_is_ready(&r);
        if (e != NULL) {
            take_error(api, e, "polling an event", NULL); /* Await reports it */
            return;
        }
        if (r.is_ready || monotonic_ns() >= until)
            return;
        for (int i = 0; i < 16; i++)
            cpu_relax();
    }
}

/* ---- plugin ------------------------------------------------------------ */

static int find_venv_plugin(const char *venv, char *out, size_t outsize)
{
    char pattern[PATH_MAX + 128]; /* the venv path may be up to PATH_MAX + 16 */
    snprintf(pattern, sizeof pattern,
             "%s/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so", venv);
    glob_t g;
    int found = 0;
    if (glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0) {
        snprintf(out, outsize, "%s", g.gl_pathv[0]);
        found = 1;
    }
    globfree(&g);
    return found;
}

int pjs_rt_plugin_resolve(const char *explicit_path, char *out, size_t outsize, pjs_error *err)
{
    if (explicit_path != NULL && explicit_path[0] != '\0') {
        snprintf(out, outsize, "%s", explicit_path);
        return 0;
    }
    const char *env = getenv("PJSERVE_PJRT_PLUGIN");
    if (env != NULL && env[0] != '\0') {
        snprintf(out, outsize, "%s", env);
        return 0;
    }
    /* An installed pjserve's own plugin (make install puts it at
     * PJS_INSTALLED_PLUGIN, relative to the executable's directory); then
     * the project's .venv: next to the build directory holding this
     * executable, then the source tree we were built from, then ./.venv. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            *slash = '\0';
#ifdef PJS_INSTALLED_PLUGIN
            char installed[PATH_MAX + 256];
            snprintf(installed, sizeof installed, "%s/%s", exe, PJS_INSTALLED_PLUGIN);
            if (access(installed, R_OK) == 0) {
                snprintf(out, outsize, "%s", installed);
                return 0;
            }
#endif
            char venv[PATH_MAX + 16];
            snprintf(venv, sizeof venv, "%s/../.venv", exe);
            if (find_venv_plugin(venv, out, outsize))
                return 0;
        }
    }
#ifdef PJS_SOURCE_VENV
    if (find_venv_plugin(PJS_SOURCE_VENV, out, outsize))
        return 0;
#endif
    if (find_venv_plugin(".venv", out, outsize))
        return 0;
    return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                         "no PJRT plugin found: pass --pjrt-plugin PATH, set PJSERVE_PJRT_PLUGIN, "
                         "or run scripts/bootstrap to install the CPU plugin into .venv");
}

static void read_version_attr(const struct pjrt_named_value *v, int64_t out[3])
{
    if (v->type != PJRT_NAMED_INT64_LIST)
        return;
    for (size_t i = 0; i < 3 && i < v->value_size; i++)
        out[i] = v->int64_array_value[i];
}

static int query_attributes(pjs_rt_plugin *p, pjs_error *err)
{
    const struct pjrt_api *api = p->api;
    struct pjrt_plugin_attributes_args a = {.struct_size = sizeof a};
    int rc = CALL(api, plugin_attributes, &a, "reading plugin attributes", err);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < a.num_attributes; i++) {
        const struct pjrt_named_value *v = &a.attributes[i];
        if (v->name_size == 11 && memcmp(v->name, "xla_version", 11) == 0 &&
            v->type == PJRT_NAMED_INT64)
            p->info.xla_version = v->int64_value;
        else if (v->name_size == 25 && memcmp(v->name, "stablehlo_current_version", 25) == 0)
            read_version_attr(v, p->info.stablehlo_current);
        else if (v->name_size == 25 && memcmp(v->name, "stablehlo_minimum_version", 25) == 0)
            read_version_attr(v, p->info.stablehlo_minimum);
    }
    return 0;
}

static int open_plugin(const char *path, pjs_rt_plugin *p, pjs_error *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND, "PJRT plugin %s does not exist", path);
    /* Never dlclose'd: plugins do not support being unloaded. */
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
        return pjs_error_set(err, PJS_ERR_RUNTIME, "cannot load PJRT plugin %s: %s", path,
                             dlerror());
    const struct pjrt_api *(*get_api)(void) =
        (const struct pjrt_api *(*)(void))dlsym(handle, "GetPjrtApi");
    if (get_api == NULL)
        return pjs_error_set(err, PJS_ERR_RUNTIME,
                             "%s is not a PJRT plugin: it does not export GetPjrtApi", path);
    const struct pjrt_api *api = get_api();
    if (api == NULL || api->struct_size < offsetof(struct pjrt_api, error_destroy))
        return pjs_error_set(err, PJS_ERR_RUNTIME, "%s: GetPjrtApi returned no usable table", path);
    int major = api->pjrt_api_version.major_version;
    int minor = api->pjrt_api_version.minor_version;
    if (major != PJRT_ABI_MAJOR || minor < PJS_RT_MIN_API_MINOR)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "%s: PJRT API version %d.%d is not supported (pjserve needs %d.%d or "
                             "newer 0.x)",
                             path, major, minor, PJRT_ABI_MAJOR, PJS_RT_MIN_API_MINOR);
    if (minor > PJRT_ABI_MINOR)
        pjs_info("PJRT plugin %s speaks API 0.%d, newer than pjserve's declarations (0.%d); "
                 "newer functions are not used",
                 path, minor, PJRT_ABI_MINOR);
    snprintf(p->path, sizeof p->path, "%s", path);
    p->api = api;
    p->info.path = p->path;
    p->info.api_major = major;
    p->info.api_minor = minor;
    p->info.xla_version = -1;
    for (int i = 0; i < 3; i++)
        p->info.stablehlo_current[i] = p->info.stablehlo_minimum[i] = -1;

    struct pjrt_plugin_initialize_args init = {.struct_size = sizeof init};
    int rc = CALL(api, plugin_initialize, &init, "initializing the PJRT plugin", err);
    if (rc != 0)
        return rc;
    rc = query_attributes(p, err);
    if (rc != 0)
        return rc;
    snprintf(p->identity, sizeof p->identity, "api=%d.%d xla=%lld size=%lld mtime=%lld.%09ld",
             major, minor, (long long)p->info.xla_version, (long long)st.st_size,
             (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    return 0;
}

int pjs_rt_plugin_load(const char *path, pjs_rt_plugin **out, pjs_error *err)
{
    char canon[PATH_MAX];
    if (realpath(path, canon) == NULL)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND, "PJRT plugin %s does not exist", path);
    int rc = 0;
    pthread_mutex_lock(&plugins_lock);
    for (size_t i = 0; i < n_plugins; i++) {
        if (strcmp(plugins[i]->path, canon) == 0) {
            *out = plugins[i];
            goto out;
        }
    }
    if (n_plugins == MAX_PLUGINS) {
        rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED, "too many PJRT plugins loaded");
        goto out;
    }
    pjs_rt_plugin *p = calloc(1, sizeof *p);
    if (p == NULL) {
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
        goto out;
    }
    rc = open_plugin(canon, p, err);
    if (rc != 0) {
        free(p);
        goto out;
    }
    plugins[n_plugins++] = p;
    *out = p;
out:
    pthread_mutex_unlock(&plugins_lock);
    return rc;
}

const pjs_rt_plugin_info *pjs_rt_plugin_get_info(const pjs_rt_plugin *p) { return &p->info; }

/* ---- client ------------------------------------------------------------ */

int pjs_rt_option_parse(const char *kv, pjs_rt_option *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    const char *eq = strchr(kv, '=');
    if (eq == NULL || eq == kv || (size_t)(eq - kv) >= sizeof out->key)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "PJRT option \"%s\" is not KEY=VALUE (e.g. preallocate=false)", kv);
    memcpy(out->key, kv, (size_t)(eq - kv));
    const char *v = eq + 1;
    char *end;
    if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
        out->type = PJRT_NAMED_BOOL;
        out->bool_value = v[0] == 't';
        return 0;
    }
    long long i = strtoll(v, &end, 10);
    if (*v != '\0' && *end == '\0') {
        out->type = PJRT_NAMED_INT64;
        out->int_value = i;
        return 0;
    }
    float f = strtof(v, &end);
    if (*v != '\0' && *end == '\0') {
        out->type = PJRT_NAMED_FLOAT;
        out->float_value = f;
        return 0;
    }
    if (strlen(v) >= sizeof out->string_value)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "PJRT option %s: value too long",
                             out->key);
    out->type = PJRT_NAMED_STRING;
    snprintf(out->string_value, sizeof out->string_value, "%s", v);
    return 0;
}

static void to_named_value(const pjs_rt_option *o, struct pjrt_named_value *v)
{
    memset(v, 0, sizeof *v);
    v->struct_size = sizeof *v;
    v->name = o->key;
    v->name_size = strlen(o->key);
    v->type = o->type;
    v->value_size = 1;
    switch (o->type) {
    case PJRT_NAMED_BOOL: v->bool_value = o->bool_value; break;
    case PJRT_NAMED_INT64: v->int64_value = o->int_value; break;
    case PJRT_NAMED_FLOAT: v->float_value = o->float_value; break;
    default:
        v->string_value = o->string_value;
        v->value_size = strlen(o->string_value);
        break;
    }
}

static int describe_client(pjs_rt_client *c, pjs_error *err)
{
    const struct pjrt_api *api = c->plugin->api;
    struct pjrt_client_platform_name_args pn = {.struct_size = sizeof pn, .client = c->client};
    int rc = CALL(api, client_platform_name, &pn, "reading the platform name", err);
    if (rc != 0)
        return rc;
    snprintf(c->platform, sizeof c->platform, "%.*s", (int)pn.platform_name_size, pn.platform_name);
    c->reads_ahead = strcmp(c->platform, "cpu") != 0;
    struct pjrt_client_platform_version_args pv = {.struct_size = sizeof pv, .client = c->client};
    if (CALL(api, client_platform_version, &pv, "reading the platform version", NULL) == 0)
        snprintf(c->platform_version, sizeof c->platform_version, "%.*s",
                 (int)pv.platform_version_size, pv.platform_version);
    struct pjrt_client_addressable_devices_args d = {.struct_size = sizeof d, .client = c->client};
    rc = CALL(api, client_addressable_devices, &d, "listing devices", err);
    if (rc != 0)
        return rc;
    if (d.num_addressable_devices == 0)
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                             "the PJRT plugin %s reports no addressable devices", c->plugin->path);
    c->devices = d.addressable_devices;
    c->n_devices = d.num_addressable_devices;
    c->device = d.addressable_devices[0];
    return 0;
}

/* Creates the plugin's client from `values`; with cpu_threads > 0 the XLA
 * CPU pools are sized to it through PJRT_NPROC, set only for the call (the
 * plugin reads it there; pjserve creates its client before starting threads
 * of its own). */
static int create_plugin_client(pjs_rt_client *c, const struct pjrt_named_value *values,
                                size_t n_values, int cpu_threads, pjs_error *err)
{
    char *saved = NULL, count[16];
    if (cpu_threads > 0) {
        const char *old = getenv("PJRT_NPROC");
        if (old != NULL && (saved = strdup(old)) == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
        snprintf(count, sizeof count, "%d", cpu_threads);
        setenv("PJRT_NPROC", count, 1);
    }
    struct pjrt_client_create_args a = {
        .struct_size = sizeof a, .create_options = values, .num_options = n_values};
    int rc = CALL(c->plugin->api, client_create, &a, "creating the PJRT client", err);
    if (cpu_threads > 0) {
        if (saved != NULL)
            setenv("PJRT_NPROC", saved, 1);
        else
            unsetenv("PJRT_NPROC");
        free(saved);
    }
    if (rc == 0)
        c->client = a.client;
    return rc;
}

static void destroy_plugin_client(pjs_rt_client *c)
{
    struct pjrt_client_destroy_args a = {.struct_size = sizeof a, .client = c->client};
    pjs_error err;
    if (CALL(c->plugin->api, client_destroy, &a, "destroying the PJRT client", &err) != 0)
        pjs_warn("%s", err.msg);
    c->client = NULL;
}

/* Copies the options meant for the plugin into values (leaving out the
 * runtime's own) and finds the thread count and whether cpu_device_count is
 * given. */
static int split_options(const pjs_rt_option *options, size_t n_options,
                         struct pjrt_named_value *values, size_t *n_values, int *cpu_threads,
                         bool *has_device_count, pjs_error *err)
{
    *n_values = 0;
    *cpu_threads = 0;
    *has_device_count = false;
    for (size_t i = 0; i < n_options; i++) {
        const pjs_rt_option *o = &options[i];
        if (strcmp(o->key, PJS_RT_OPTION_CPU_THREADS) == 0) {
            if (o->type != PJRT_NAMED_INT64 || o->int_value < 1 ||
                o->int_value > PJS_RT_CPU_THREADS_MAX)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "client option %s: expected a thread count from 1 to %d",
                                     o->key, PJS_RT_CPU_THREADS_MAX);
            *cpu_threads = (int)o->int_value;
            continue;
        }
        if (strcmp(o->key, "cpu_device_count") == 0)
            *has_device_count = true;
        to_named_value(o, &values[(*n_values)++]);
    }
    return 0;
}

/* The device's PJRT_Device_LocalHardwareId, or -1. */
static int read_hardware_id(const pjs_rt_client *c)
{
    const struct pjrt_api *api = c->plugin->api;
    struct pjrt_device_local_hardware_id_args a = {.struct_size = sizeof a, .device = c->device};
    pjs_error ignored;
    if (CALL(api, device_local_hardware_id, &a, "reading the device's number", &ignored) != 0)
        return -1;
    return a.local_hardware_id;
}

/* Whether the plugin stores a buffer created with a device layout in that
 * layout. PJRT says it does, and a module whose parameter has another layout
 * (mhlo.layout_mode) reads its argument's bytes in it; the CPU plugin
 * (xla-cpu-pjrt 0.0.1) records the layout but keeps the bytes row-major, so
 * pjs_rt_buffer_from_host must reorder them itself there. Told by a 2x3
 * buffer asked to be column-major, whose bytes are read in place on the CPU
 * plugin (elsewhere the buffer's address is the device's, and the plugin is
 * taken at its word). */
static bool probe_device_layouts(pjs_rt_client *c)
{
    const struct pjrt_api *api = c->plugin->api;
    if (strcmp(c->platform, "cpu") != 0 || !HAS_SLOT(api, buffer_unsafe_pointer))
        return true;
    static const float row_major[6] = {0, 1, 2, 3, 4, 5};
    int64_t dims[2] = {2, 3}, minor_to_major[2] = {0, 1};
    struct pjrt_buffer_memory_layout layout = {.struct_size = sizeof layout,
                                               .type = PJRT_BUFFER_MEMORY_LAYOUT_TILED};
    layout.tiled = (struct pjrt_buffer_memory_layout_tiled){.struct_size = sizeof layout.tiled,
                                                            .minor_to_major = minor_to_major,
                                                            .minor_to_major_size = 2};
    struct pjrt_client_buffer_from_host_buffer_args a = {
        .struct_size = sizeof a,
        .client = c->client,
        .data = row_major,
        .type = pjs_dtype_to_pjrt(PJS_DTYPE_F32),
        .dims = dims,
        .num_dims = 2,
        .host_buffer_semantics = PJRT_HOST_IMMUTABLE_ONLY_DURING_CALL,
        .device_layout = &layout,
        .device = c->device};
    pjs_error ignored;
    if (CALL(api, client_buffer_from_host_buffer, &a, "probing layouts", &ignored) != 0)
        return true;
    /* Row-major bytes: the layout was only recorded. */
    bool stores = true;
    struct pjrt_buffer_unsafe_pointer_args u = {.struct_size = sizeof u, .buffer = a.buffer};
    if (await_event(api, a.done_with_host_buffer, "probing layouts", &ignored) == 0 &&
        CALL(api, buffer_unsafe_pointer, &u, "probing layouts", &ignored) == 0 &&
        u.buffer_pointer != 0)
        stores = memcmp((const void *)u.buffer_pointer, row_major, sizeof row_major) != 0;
    pjs_rt_buffer_destroy(c, a.buffer);
    return stores;
}

int pjs_rt_client_create(pjs_rt_plugin *p, const pjs_rt_option *options, size_t n_options,
                         pjs_rt_client **out, pjs_error *err)
{
    static const pjs_rt_option one_device = {
        .key = "cpu_device_count", .type = PJRT_NAMED_INT64, .int_value = 1};
    struct pjrt_named_value *values = NULL;
    size_t n_values = 0;
    int cpu_threads = 0;
    bool has_device_count = false;
    pjs_rt_client *c = calloc(1, sizeof *c);
    if (c != NULL) {
        atomic_init(&c->host_memory, HOST_UNDECIDED);
        pthread_mutex_init(&c->shared_lock, NULL);
        pthread_mutex_init(&c->spare_lock, NULL);
    }
    int rc = 0;
    if (c == NULL || (values = calloc(n_options + 1, sizeof *values)) == NULL) {
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    c->plugin = p;
    rc = split_options(options, n_options, values, &n_values, &cpu_threads, &has_device_count,
                       err);
    if (rc == 0)
        rc = create_plugin_client(c, values, n_values, 0, err);
    if (rc == 0)
        rc = describe_client(c, err);
    if (rc == 0 && strcmp(c->platform, "cpu") == 0 && cpu_threads > 0) {
        /* Only now is it known to be the CPU plugin, whose pools are sized
         * at creation: create it again with the count, on one device (pjserve
         * uses the first; the plugin's default of four would raise the pools
         * to four threads). */
        destroy_plugin_client(c);
        if (!has_device_count)
            to_named_value(&one_device, &values[n_values++]);
        rc = create_plugin_client(c, values, n_values, cpu_threads, err);
        if (rc == 0)
            rc = describe_client(c, err);
    }
    if (rc != 0)
        goto fail;
    if (strcmp(c->platform, "cpu") == 0) {
        int requested = cpu_threads > 0 ? cpu_threads : pjs_rt_cpu_threads_xla_default();
        c->cpu_threads = requested > (int)c->n_devices ? requested : (int)c->n_devices;
    }
    c->stores_device_layouts = probe_device_layouts(c);
    c->hardware_id = read_hardware_id(c);
    free(values);
    *out = c;
    return 0;
fail:
    free(values);
    if (c != NULL && c->client != NULL)
        pjs_rt_client_destroy(c);
    else
        free(c);
    return rc;
}

int pjs_rt_client_open(const char *plugin_path, const pjs_rt_option *options, size_t n_options,
                       pjs_rt_client **out, pjs_error *err)
{
    char path[4096];
    pjs_rt_plugin *plugin = NULL;
    int rc = pjs_rt_plugin_resolve(plugin_path, path, sizeof path, err);
    if (rc == 0)
        rc = pjs_rt_plugin_load(path, &plugin, err);
    if (rc == 0)
        rc = pjs_rt_client_create(plugin, options, n_options, out, err);
    return rc;
}

static void release_host_block(pjs_rt_client *c, pjs_rt_host_memory *m);

void pjs_rt_client_destroy(pjs_rt_client *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_spare; i++)
        release_host_block(c, &c->spare[i]);
    destroy_plugin_client(c);
    pthread_mutex_destroy(&c->shared_lock);
    pthread_mutex_destroy(&c->spare_lock);
    free(c->shared);
    free(c);
}

const char *pjs_rt_client_platform(const pjs_rt_client *c) { return c->platform; }
const char *pjs_rt_client_platform_version(const pjs_rt_client *c) { return c->platform_version; }
pjs_rt_plugin *pjs_rt_client_plugin(const pjs_rt_client *c) { return c->plugin; }
size_t pjs_rt_client_device_count(const pjs_rt_client *c) { return c->n_devices; }
int pjs_rt_client_cpu_threads(const pjs_rt_client *c) { return c->cpu_threads; }

void pjs_rt_client_describe_device(const pjs_rt_client *c, size_t i, char *buf, size_t bufsize)
{
    const struct pjrt_api *api = c->plugin->api;
    snprintf(buf, bufsize, "%zu: (no description)", i);
    if (i >= c->n_devices)
        return;
    struct pjrt_device_get_description_args g = {.struct_size = sizeof g, .device = c->devices[i]};
    if (CALL(api, device_get_description, &g, "describing a device", NULL) != 0)
        return;
    struct pjrt_device_description_kind_args k = {
        .struct_size = sizeof k, .device_description = g.device_description};
    struct pjrt_device_description_debug_string_args s = {
        .struct_size = sizeof s, .device_description = g.device_description};
    struct pjrt_device_description_id_args id = {
        .struct_size = sizeof id, .device_description = g.device_description};
    if (CALL(api, device_description_kind, &k, "describing a device", NULL) != 0 ||
        CALL(api, device_description_debug_string, &s, "describing a device", NULL) != 0 ||
        CALL(api, device_description_id, &id, "describing a device", NULL) != 0)
        return;
    snprintf(buf, bufsize, "%d: %.*s (%.*s)", id.id, (int)k.device_kind_size, k.device_kind,
             (int)s.debug_string_size, s.debug_string);
}

int pjs_rt_client_device_memory(const pjs_rt_client *c, size_t i, uint64_t *bytes_limit,
                                pjs_error *err)
{
    if (i >= c->n_devices)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND, "no device %zu", i);
    struct pjrt_device_memory_stats_args m = {.struct_size = sizeof m, .device = c->devices[i]};
    int rc = CALL(c->plugin->api, device_memory_stats, &m, "reading device memory", err);
    if (rc != 0)
        return rc;
    if (!m.bytes_limit_is_set || m.bytes_limit <= 0)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED, "the device reports no memory limit");
    *bytes_limit = (uint64_t)m.bytes_limit;
    return 0;
}

/* ---- compile ----------------------------------------------------------- */

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void destroy_loaded(const struct pjrt_api *api, pjrt_loaded_executable *le)
{
    if (le == NULL)
        return;
    struct pjrt_loaded_executable_destroy_args d = {.struct_size = sizeof d, .executable = le};
    pjs_error err;
    if (CALL(api, loaded_executable_destroy, &d, "destroying an executable", &err) != 0)
        pjs_warn("%s", err.msg);
}

static void destroy_executable(const struct pjrt_api *api, pjrt_executable *x)
{
    if (x == NULL)
        return;
    struct pjrt_executable_destroy_args d = {.struct_size = sizeof d, .executable = x};
    pjs_error err;
    if (CALL(api, executable_destroy, &d, "destroying an executable", &err) != 0)
        pjs_warn("%s", err.msg);
}

/* The executable behind a loaded one; destroy it with destroy_executable. */
static int get_executable(const struct pjrt_api *api, pjrt_loaded_executable *le,
                          pjrt_executable **out, pjs_error *err)
{
    struct pjrt_loaded_executable_get_executable_args g = {.struct_size = sizeof g,
                                                           .loaded_executable = le};
    int rc = CALL(api, loaded_executable_get_executable, &g, "reading the executable", err);
    if (rc == 0)
        *out = g.executable;
    return rc;
}

/* Reads the parameter and result types from the optimized HLO module. */
static int read_signature(pjs_rt_client *c, pjs_rt_executable *e, const char *label,
                          pjs_error *err)
{
    const struct pjrt_api *api = c->plugin->api;
    pjrt_executable *x;
    int rc = get_executable(api, e->loaded, &x, err);
    if (rc != 0)
        return rc;
    struct pjrt_program prog = {.struct_size = sizeof prog};
    struct pjrt_executable_optimized_program_args op = {
        .struct_size = sizeof op, .executable = x, .program = &prog};
    rc = CALL(api, executable_optimized_program, &op, "reading the optimized program", err);
    if (rc == 0) {
        prog.code = malloc(prog.code_size ? prog.code_size : 1);
        if (prog.code == NULL)
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    }
    if (rc == 0)
        rc = CALL(api, executable_optimized_program, &op, "reading the optimized program", err);
    if (rc == 0) {
        bool with_config = prog.format_size == 15 && memcmp(prog.format, "hlo_with_config", 15) == 0;
        rc = pjs_hlo_program_shape((const unsigned char *)prog.code, prog.code_size, with_config,
                                   &e->params, &e->n_params, &e->results, &e->n_results, err);
    }
    free(prog.code);
    if (rc == 0) {
        struct pjrt_executable_num_outputs_args no = {.struct_size = sizeof no,
                                                      .executable = x};
        rc = CALL(api, executable_num_outputs, &no, "counting outputs", err);
        if (rc == 0 && no.num_outputs != e->n_results)
            rc = pjs_error_set(err, PJS_ERR_RUNTIME,
                               "the plugin reports %zu outputs but the HLO result has %zu",
                               no.num_outputs, e->n_results);
    }
    destroy_executable(api, x);
    if (rc != 0)
        pjs_error_prefix(err, "%s: ", label);
    return rc;
}

/* Cache payload: u32 n_params, {u32 dtype, u32 rank, i64 dims[rank]}...,
 * u32 n_results, {...}..., then the serialized executable. Host byte order:
 * cache keys include the plugin identity, so entries never cross machines of
 * another kind in practice, and a mismatch only costs a recompile. */
typedef struct buf {
    unsigned char *data;
    size_t len, cap;
} buf;

static bool buf_put(buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *d = realloc(b->data, cap);
        if (d == NULL)
            return false;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return true;
}

static bool put_types(buf *b, const pjs_rt_tensor_type *t, size_t n)
{
    uint32_t count = (uint32_t)n;
    bool ok = buf_put(b, &count, 4);
    for (size_t i = 0; ok && i < n; i++) {
        uint32_t dtype = (uint32_t)t[i].dtype, rank = (uint32_t)t[i].shape.rank;
        uint8_t other_layout = t[i].other_layout;
        ok = buf_put(b, &dtype, 4) && buf_put(b, &rank, 4) &&
             buf_put(b, t[i].shape.dims, sizeof(int64_t) * rank) && buf_put(b, &other_layout, 1) &&
             buf_put(b, t[i].minor_to_major, rank);
    }
    return ok;
}

static bool get_bytes(const unsigned char **p, const unsigned char *end, void *out, size_t n)
{
    if ((size_t)(end - *p) < n)
        return false;
    memcpy(out, *p, n);
    *p += n;
    return true;
}

static bool get_types(const unsigned char **p, const unsigned char *end, pjs_rt_tensor_type **out,
                      size_t *n_out)
{
    uint32_t count;
    if (!get_bytes(p, end, &count, 4) || count > 65536)
        return false;
    pjs_rt_tensor_type *t = calloc(count ? count : 1, sizeof *t);
    if (t == NULL)
        return false;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t dtype, rank;
        uint8_t other_layout;
        bool ok = get_bytes(p, end, &dtype, 4) && get_bytes(p, end, &rank, 4) &&
                  dtype < PJS_DTYPE_COUNT && dtype != PJS_DTYPE_INVALID && rank <= PJS_MAX_RANK &&
                  get_bytes(p, end, t[i].shape.dims, sizeof(int64_t) * rank) &&
                  get_bytes(p, end, &other_layout, 1) && other_layout <= 1 &&
                  get_bytes(p, end, t[i].minor_to_major, rank);
        for (uint32_t d = 0; ok && d < rank; d++)
            ok = t[i].minor_to_major[d] < rank;
        if (!ok) {
            free(t);
            return false;
        }
        t[i].dtype = (pjs_dtype)dtype;
        t[i].shape.rank = (int)rank;
        t[i].other_layout = other_layout;
    }
    *out = t;
    *n_out = count;
    return true;
}

static void cache_key(pjs_rt_client *c, const void *module, size_t module_size,
                      unsigned char key[PJS_EXEC_CACHE_KEY_SIZE])
{
    pjs_exec_cache_key_builder *b = pjs_exec_cache_key_begin();
    if (b == NULL) {
        memset(key, 0, PJS_EXEC_CACHE_KEY_SIZE);
        return;
    }
    pjs_exec_cache_key_add(b, "pjserve-executable-v2", 21);
    pjs_exec_cache_key_add(b, module, module_size);
    pjs_exec_cache_key_add(b, compile_options, sizeof compile_options);
    pjs_exec_cache_key_add(b, c->platform, strlen(c->platform));
    pjs_exec_cache_key_add(b, c->platform_version, strlen(c->platform_version));
    pjs_exec_cache_key_add(b, c->plugin->identity, strlen(c->plugin->identity));
    /* the plugin fills the compile options' unset debug options from it */
    const char *xla_flags = getenv("XLA_FLAGS");
    if (xla_flags != NULL)
        pjs_exec_cache_key_add(b, xla_flags, strlen(xla_flags));
    if (c->cpu_threads > 0) {
        /* The CPU compiler partitions loops into as many tasks as the pools
         * have threads. */
        char threads[32];
        int n = snprintf(threads, sizeof threads, "cpu_threads=%d", c->cpu_threads);
        pjs_exec_cache_key_add(b, threads, (size_t)n);
    }
    pjs_exec_cache_key_finish(b, key);
}

/* Tries the cache; returns 1 when e was filled from it. */
static int load_cached(pjs_rt_client *c, pjs_exec_cache *cache,
                       const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE], pjs_rt_executable *e,
                       const char *label)
{
    void *payload = NULL;
    size_t size = 0;
    if (pjs_exec_cache_lookup(cache, key, &payload, &size) != 1)
        return 0;
    const unsigned char *p = payload, *end = p + size;
    int loaded = 0;
    if (!get_types(&p, end, &e->params, &e->n_params) ||
        !get_types(&p, end, &e->results, &e->n_results)) {
        pjs_warn("executable cache: entry for %s has an unreadable signature; recompiling", label);
        goto out;
    }
    struct pjrt_executable_deserialize_and_load_args d = {
        .struct_size = sizeof d,
        .client = c->client,
        .serialized_executable = (const char *)p,
        .serialized_executable_size = (size_t)(end - p)};
    pjs_error err;
    if (CALL(c->plugin->api, executable_deserialize_and_load, &d, "loading a cached executable",
             &err) != 0) {
        pjs_warn("executable cache: entry for %s could not be loaded (%s); recompiling", label,
                 err.msg);
        goto out;
    }
    e->loaded = d.loaded_executable;
    loaded = 1;
out:
    if (!loaded) {
        pjs_exec_cache_evict(cache, key);
        free(e->params);
        free(e->results);
        e->params = e->results = NULL;
        e->n_params = e->n_results = 0;
    }
    free(payload);
    return loaded;
}

static void store_cached(pjs_rt_client *c, pjs_exec_cache *cache,
                         const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE],
                         const pjs_rt_executable *e, const char *label)
{
    const struct pjrt_api *api = c->plugin->api;
    pjs_error err;
    pjrt_executable *x;
    if (get_executable(api, e->loaded, &x, &err) != 0) {
        pjs_warn("executable cache: not storing %s: %s", label, err.msg);
        return;
    }
    struct pjrt_executable_serialize_args s = {.struct_size = sizeof s, .executable = x};
    buf b = {0};
    if (CALL(api, executable_serialize, &s, "serializing the executable", &err) != 0) {
        pjs_warn("executable cache: not storing %s: %s", label, err.msg);
        goto out;
    }
    if (!put_types(&b, e->params, e->n_params) || !put_types(&b, e->results, e->n_results) ||
        !buf_put(&b, s.serialized_bytes, s.serialized_bytes_size)) {
        pjs_warn("executable cache: not storing %s: out of memory", label);
    } else if (pjs_exec_cache_store(cache, key, b.data, b.len, &err) != 0) {
        pjs_warn("executable cache: not storing %s: %s", label, err.msg);
    }
    if (s.serialized_executable_deleter != NULL)
        s.serialized_executable_deleter(s.serialized_executable);
out:
    free(b.data);
    destroy_executable(api, x);
}

/* ---- executables shared in memory (client's shared_lock held) ----------- */

static size_t shared_bucket(const pjs_rt_client *c, const unsigned char *key)
{
    uint64_t h;
    memcpy(&h, key, sizeof h);
    return (size_t)h & (c->n_shared_buckets - 1);
}

static pjs_rt_executable *shared_find(pjs_rt_client *c, const unsigned char *key)
{
    if (c->n_shared_buckets == 0)
        return NULL;
    for (pjs_rt_executable *e = c->shared[shared_bucket(c, key)]; e != NULL; e = e->next_shared)
        if (memcmp(e->key, key, PJS_EXEC_CACHE_KEY_SIZE) == 0)
            return e;
    return NULL;
}

/* Adds e (keyed); false when out of memory (e then stays unshared). */
static bool shared_add(pjs_rt_client *c, pjs_rt_executable *e)
{
    if (c->n_shared >= c->n_shared_buckets) {
        size_t n = c->n_shared_buckets ? 2 * c->n_shared_buckets : 64;
        pjs_rt_executable **grown = calloc(n, sizeof *grown);
        if (grown == NULL)
            return false;
        pjs_rt_executable **old = c->shared;
        size_t n_old = c->n_shared_buckets;
        c->shared = grown;
        c->n_shared_buckets = n;
        for (size_t i = 0; i < n_old; i++) {
            for (pjs_rt_executable *x = old[i], *next; x != NULL; x = next) {
                next = x->next_shared;
                size_t b = shared_bucket(c, x->key);
                x->next_shared = c->shared[b];
                c->shared[b] = x;
            }
        }
        free(old);
    }
    size_t b = shared_bucket(c, e->key);
    e->next_shared = c->shared[b];
    c->shared[b] = e;
    c->n_shared++;
    return true;
}

static void shared_remove(pjs_rt_client *c, pjs_rt_executable *e)
{
    for (pjs_rt_executable **p = &c->shared[shared_bucket(c, e->key)]; *p != NULL;
         p = &(*p)->next_shared) {
        if (*p == e) {
            *p = e->next_shared;
            c->n_shared--;
            return;
        }
    }
}

/* The executable loaded under key, one more holder of it; NULL if none. */
static pjs_rt_executable *shared_take(pjs_rt_client *c, const unsigned char *key)
{
    pthread_mutex_lock(&c->shared_lock);
    pjs_rt_executable *e = shared_find(c, key);
    if (e != NULL)
        e->holders++;
    pthread_mutex_unlock(&c->shared_lock);
    return e;
}

/* Offers a fresh executable to the table: *e becomes the one kept there
 * (another compile of the same module may have got there first: ours is
 * then destroyed). True when *e is one that was already there. */
static bool shared_offer(pjs_rt_client *c, pjs_rt_executable **e)
{
    pthread_mutex_lock(&c->shared_lock);
    pjs_rt_executable *there = shared_find(c, (*e)->key);
    if (there != NULL)
        there->holders++;
    else
        (*e)->keyed = shared_add(c, *e);
    pthread_mutex_unlock(&c->shared_lock);
    if (there == NULL)
        return false;
    (*e)->keyed = false;
    pjs_rt_executable_destroy(*e);
    *e = there;
    return true;
}

int pjs_rt_compile(pjs_rt_client *c, const void *module, size_t module_size, pjs_exec_cache *cache,
                   const char *label, pjs_rt_executable **out, pjs_error *err)
{
    return pjs_rt_compile_shared(c, module, module_size, cache, label, out, NULL, err);
}

int pjs_rt_compile_shared(pjs_rt_client *c, const void *module, size_t module_size,
                          pjs_exec_cache *cache, const char *label, pjs_rt_executable **out,
                          bool *out_shared, pjs_error *err)
{
    unsigned char key[PJS_EXEC_CACHE_KEY_SIZE];
    cache_key(c, module, module_size, key);
    static const unsigned char no_key[PJS_EXEC_CACHE_KEY_SIZE];
    bool keyable = memcmp(key, no_key, sizeof key) != 0;
    if (out_shared != NULL)
        *out_shared = false;
    pjs_rt_executable *there = keyable ? shared_take(c, key) : NULL;
    if (there != NULL) {
        if (out_shared != NULL)
            *out_shared = true;
        *out = there;
        return 0;
    }
    pjs_rt_executable *e = calloc(1, sizeof *e);
    if (e == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    e->client = c;
    e->holders = 1;
    memcpy(e->key, key, sizeof key);
    double start = now_seconds();
    if (cache != NULL && keyable && load_cached(c, cache, key, e, label)) {
        e->from_cache = true;
        e->compile_seconds = now_seconds() - start;
        if (keyable && shared_offer(c, &e) && out_shared != NULL)
            *out_shared = true;
        *out = e;
        return 0;
    }
    struct pjrt_program prog = {.struct_size = sizeof prog,
                                .code = (char *)module,
                                .code_size = module_size,
                                .format = "mlir",
                                .format_size = 4};
    struct pjrt_client_compile_args a = {.struct_size = sizeof a,
                                         .client = c->client,
                                         .program = &prog,
                                         .compile_options = compile_options,
                                         .compile_options_size = sizeof compile_options};
    int rc = CALL(c->plugin->api, client_compile, &a, "compiling", err);
    if (rc != 0) {
        pjs_error_prefix(err, "%s: ", label);
        free(e);
        return rc;
    }
    e->loaded = a.executable;
    rc = read_signature(c, e, label, err);
    if (rc != 0) {
        pjs_rt_executable_destroy(e);
        return rc;
    }
    e->compile_seconds = now_seconds() - start;
    if (cache != NULL && keyable)
        store_cached(c, cache, key, e, label);
    if (keyable && shared_offer(c, &e) && out_shared != NULL)
        *out_shared = true;
    *out = e;
    return 0;
}

void pjs_rt_executable_destroy(pjs_rt_executable *e)
{
    if (e == NULL)
        return;
    if (e->keyed) {
        pjs_rt_client *c = e->client;
        pthread_mutex_lock(&c->shared_lock);
        bool last = --e->holders == 0;
        if (last)
            shared_remove(c, e);
        pthread_mutex_unlock(&c->shared_lock);
        if (!last)
            return;
    }
    destroy_loaded(e->client->plugin->api, e->loaded);
    struct pjs_rt_read_plan *plan = atomic_load(&e->read_plan);
    if (plan != &plugin_row_major)
        free(plan);
    free(e->params);
    free(e->results);
    free(e);
}

/* ---- buffers and execution --------------------------------------------- */

/* The byte strides of a dense array of `shape` whose dimensions lie in
 * memory in `minor_to_major` order (the fastest first); returns its size. */
static size_t layout_strides(const pjs_shape *shape, size_t elem, const uint8_t *minor_to_major,
                             size_t *strides)
{
    size_t step = elem;
    for (int i = 0; i < shape->rank; i++) {
        strides[minor_to_major[i]] = step;
        step *= (size_t)shape->dims[minor_to_major[i]];
    }
    return step;
}

/* Copies a dense array of `shape` from src to dst between row-major order
 * and the order `minor_to_major`: src is laid out so and dst row-major when
 * to_row_major, the other way round when not. */
static void copy_relayout(void *dst, const void *src, const pjs_shape *shape, size_t elem,
                          const uint8_t *minor_to_major, bool to_row_major)
{
    int rank = shape->rank;
    if (elem == 0)
        return;
    size_t stride[PJS_MAX_RANK];
    size_t total = layout_strides(shape, elem, minor_to_major, stride) / elem;
    size_t idx[PJS_MAX_RANK] = {0}, at = 0; /* the row-major index, its laid-out offset */
    unsigned char *out = dst;
    const unsigned char *in = src;
    for (size_t k = 0; k < total; k++) {
        if (to_row_major)
            memcpy(out + k * elem, in + at, elem);
        else
            memcpy(out + at, in + k * elem, elem);
        for (int d = rank - 1; d >= 0; d--) { /* next row-major index */
            at += stride[d];
            if (++idx[d] < (size_t)shape->dims[d])
                break;
            at -= stride[d] * idx[d];
            idx[d] = 0;
        }
    }
}

/* An upload issued to the plugin whose host data may still be read: what
 * finishing it waits for and frees. */
typedef struct upload_pending {
    pjrt_event *done; /* done with the host data; NULL: it was within the call */
    void *laid_out;   /* the reordered copy the plugin reads, or NULL */
} upload_pending;

/* Starts copying row-major host data to a new device buffer (*out); the
 * data must stay as it is until upload_finish. */
static int upload_issue(pjs_rt_client *c, pjs_dtype dtype, const pjs_shape *shape,
                        const pjs_rt_tensor_type *param, const void *data, pjrt_buffer **out,
                        upload_pending *pending, pjs_error *err)
{
    const struct pjrt_api *api = c->plugin->api;
    *pending = (upload_pending){0};
    /* A small input is copied by the plugin within the call (into its own
     * staging memory on a device), so no wait for the transfer follows; a
     * large one is read in place until the transfer completes, sparing a
     * second host copy. */
    uint64_t nbytes = 0;
    bool staged = pjs_shape_nbytes(shape, pjs_dtype_size(dtype), &nbytes) &&
                  nbytes <= PJS_RT_STAGED_UPLOAD_MAX;
    struct pjrt_client_buffer_from_host_buffer_args a = {
        .struct_size = sizeof a,
        .client = c->client,
        .data = data,
        .type = pjs_dtype_to_pjrt(dtype),
        .dims = shape->dims,
        .num_dims = (size_t)shape->rank,
        .host_buffer_semantics = staged ? PJRT_HOST_IMMUTABLE_ONLY_DURING_CALL
                                        : PJRT_HOST_IMMUTABLE_UNTIL_TRANSFER_COMPLETES,
        .device = c->device};
    /* A parameter the module lays out in another order: the buffer is made
     * in that layout, by the plugin from the row-major data, or, where the
     * plugin keeps row-major bytes whatever the layout, by reordering the
     * data here and handing it over as it is. */
    void *laid_out = NULL;
    int64_t minor_to_major[PJS_MAX_RANK];
    struct pjrt_buffer_memory_layout layout = {.struct_size = sizeof layout,
                                               .type = PJRT_BUFFER_MEMORY_LAYOUT_TILED};
    if (param != NULL && param->other_layout && c->stores_device_layouts) {
        for (int i = 0; i < shape->rank; i++)
            minor_to_major[i] = param->minor_to_major[i];
        layout.tiled = (struct pjrt_buffer_memory_layout_tiled){
            .struct_size = sizeof layout.tiled,
            .minor_to_major = minor_to_major,
            .minor_to_major_size = (size_t)shape->rank};
        a.device_layout = &layout;
    } else if (param != NULL && param->other_layout && nbytes > 0) {
        laid_out = malloc((size_t)nbytes);
        if (laid_out == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "no memory to lay out %llu bytes",
                                 (unsigned long long)nbytes);
        copy_relayout(laid_out, data, shape, pjs_dtype_size(dtype), param->minor_to_major, false);
        a.data = laid_out;
    }
    int rc = CALL(api, client_buffer_from_host_buffer, &a, "copying to the device", err);
    if (rc != 0) {
        free(laid_out);
        return rc;
    }
    *pending = (upload_pending){.done = a.done_with_host_buffer, .laid_out = laid_out};
    *out = a.buffer;
    return 0;
}

/* Waits until the plugin is done with an issued upload's host data. */
static int upload_finish(pjs_rt_client *c, upload_pending *pending, pjs_error *err)
{
    int rc = await_event(c->plugin->api, pending->done, "copying to the device", err);
    free(pending->laid_out);
    *pending = (upload_pending){0};
    return rc;
}

int pjs_rt_buffer_from_host(pjs_rt_client *c, pjs_dtype dtype, const pjs_shape *shape,
                            const pjs_rt_tensor_type *param, const void *data, pjrt_buffer **out,
                            pjs_error *err)
{
    upload_pending pending;
    int rc = upload_issue(c, dtype, shape, param, data, out, &pending, err);
    if (rc != 0)
        return rc;
    rc = upload_finish(c, &pending, err);
    if (rc != 0) {
        pjs_rt_buffer_destroy(c, *out);
        *out = NULL;
    }
    return rc;
}

/* Every copy is issued before the first is waited for: the device takes
 * them back to back instead of after one host round trip each (a
 * ResNet-50's 161 weights took 8 ms one by one on an H200). */
int pjs_rt_buffers_from_host(pjs_rt_client *c, size_t n, const pjs_rt_upload *uploads,
                             pjrt_buffer **out, size_t *failed, pjs_error *err)
{
    upload_pending *pending = calloc(n > 0 ? n : 1, sizeof *pending);
    if (pending == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory to upload %zu buffers", n);
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    size_t issued = 0;
    int rc = 0;
    for (; issued < n; issued++) {
        const pjs_rt_upload *u = &uploads[issued];
        rc = upload_issue(c, u->dtype, u->shape, u->param, u->data, &out[issued],
                          &pending[issued], err);
        if (rc != 0)
            break;
    }
    *failed = issued;
    /* Every issued copy is waited for, even after a failure: the caller may
     * free the host data when this returns. */
    for (size_t i = 0; i < issued; i++) {
        pjs_error why;
        if (upload_finish(c, &pending[i], &why) != 0 && rc == 0) {
            rc = why.code;
            *err = why;
            *failed = i;
        }
    }
    free(pending);
    if (rc != 0) {
        for (size_t i = 0; i < issued; i++) {
            pjs_rt_buffer_destroy(c, out[i]);
            out[i] = NULL;
        }
    }
    return rc;
}

/* Waits until the buffer's contents are on the device. */
static int await_ready(pjs_rt_client *c, pjrt_buffer *b, pjs_error *err)
{
    const struct pjrt_api *api = c->plugin->api;
    struct pjrt_buffer_ready_event_args a = {.struct_size = sizeof a, .buffer = b};
    int rc = CALL(api, buffer_ready_event, &a, "waiting for a copy to the device", err);
    return rc != 0 ? rc : await_event(api, a.event, "copying to the device", err);
}

/* Whether views of uploads[i] at offsets[i] within a block can be made. */
static int block_views_supported(pjs_rt_client *c, size_t n, const pjs_rt_upload *uploads,
                                 const size_t *offsets, pjs_error *err)
{
    const struct pjrt_api *api = c->plugin->api;
    if (!HAS_SLOT(api, client_create_view_of_device_buffer) ||
        !HAS_SLOT(api, buffer_opaque_device_memory_data_pointer) ||
        !HAS_SLOT(api, buffer_ready_event))
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED, "the plugin makes no views");
    for (size_t i = 0; i < n; i++)
        if ((uploads[i].param != NULL && uploads[i].param->other_layout) ||
            offsets[i] % PJS_RT_BLOCK_ALIGN != 0)
            return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                                 "buffer %zu is laid out or placed otherwise", i);
    return 0;
}

int pjs_rt_block_upload_start(pjs_rt_client *c, const void *data, size_t size, size_t n,
                              const pjs_rt_upload *uploads, const size_t *offsets,
                              pjs_rt_block_upload *u, pjs_error *err)
{
    *u = (pjs_rt_block_upload){0};
    int rc = block_views_supported(c, n, uploads, offsets, err);
    if (rc != 0)
        return rc;
    upload_pending pending;
    pjs_shape bytes = {.rank = 1, .dims = {(int64_t)size}};
    rc = upload_issue(c, PJS_DTYPE_U8, &bytes, NULL, data, &u->block, &pending, err);
    if (rc == 0)
        u->done = pending.done; /* no relayout for bytes: nothing else pending */
    return rc;
}

void pjs_rt_block_upload_cancel(pjs_rt_client *c, pjs_rt_block_upload *u)
{
    upload_pending pending = {.done = u->done};
    if (u->block != NULL)
        upload_finish(c, &pending, NULL);
    pjs_rt_buffer_destroy(c, u->block);
    *u = (pjs_rt_block_upload){0};
}

int pjs_rt_block_upload_finish(pjs_rt_client *c, pjs_rt_block_upload *u, size_t n,
                               const pjs_rt_upload *uploads, const size_t *offsets,
                               pjrt_buffer **block, pjrt_buffer **out, pjs_error *err)
{
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    *block = NULL;
    upload_pending pending = {.done = u->done};
    u->done = NULL;
    int rc = upload_finish(c, &pending, err);
    uint64_t base = 0;
    if (rc == 0)
        rc = await_ready(c, u->block, err);
    if (rc == 0)
        rc = pjs_rt_buffer_device_address(c, u->block, &base, err);
    /* The CPU plugin's allocations are 64-byte aligned, what its
     * executables assume of their arguments. */
    uint64_t align = strcmp(pjs_rt_client_platform(c), "cpu") == 0 ? 64 : PJS_RT_BLOCK_ALIGN;
    if (rc == 0 && base % align != 0)
        rc = pjs_error_set(err, PJS_ERR_UNSUPPORTED, "the block lies at %#llx",
                           (unsigned long long)base);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = pjs_rt_buffer_view_device(c, uploads[i].dtype, uploads[i].shape, NULL,
                                       base + offsets[i], &out[i], err);
    if (rc != 0) {
        for (size_t i = 0; i < n; i++) {
            if (out[i] != NULL)
                pjs_rt_buffer_destroy(c, out[i]);
            out[i] = NULL;
        }
        pjs_rt_buffer_destroy(c, u->block);
    } else {
        *block = u->block;
    }
    u->block = NULL;
    return rc;
}

int pjs_rt_block_from_host(pjs_rt_client *c, const void *data, size_t size, size_t n,
                           const pjs_rt_upload *uploads, const size_t *offsets,
                           pjrt_buffer **block, pjrt_buffer **out, pjs_error *err)
{
    pjs_rt_block_upload u;
    *block = NULL;
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    int rc = pjs_rt_block_upload_start(c, data, size, n, uploads, offsets, &u, err);
    if (rc == 0)
        rc = pjs_rt_block_upload_finish(c, &u, n, uploads, offsets, block, out, err);
    return rc;
}

/* ---- device memory a client shares ----------------------------------------- */

int pjs_rt_client_hardware_id(const pjs_rt_client *c)
{
    return c->hardware_id;
}

/* A view's memory belongs to whoever shared it: nothing to do when the
 * view goes (the CPU plugin calls this unconditionally). */
static void view_released(void *device_buffer_ptr, void *user_arg)
{
    (void)device_buffer_ptr;
    (void)user_arg;
}

int pjs_rt_buffer_view_device(pjs_rt_client *c, pjs_dtype dtype, const pjs_shape *shape,
                              const pjs_rt_tensor_type *param, uint64_t device_ptr,
                              pjrt_buffer **out, pjs_error *err)
{
    if (param != NULL && param->other_layout)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "the module lays this parameter out in another order than "
                             "row-major");
    struct pjrt_client_create_view_of_device_buffer_args a = {
        .struct_size = sizeof a,
        .client = c->client,
        .device_buffer_ptr = (void *)(uintptr_t)device_ptr,
        .dims = shape->dims,
        .num_dims = (size_t)shape->rank,
        .element_type = pjs_dtype_to_pjrt(dtype),
        .device = c->device,
        .on_delete_callback = view_released};
    int rc = CALL(c->plugin->api, client_create_view_of_device_buffer, &a,
                  "viewing device memory", err);
    if (rc == 0)
        *out = a.buffer;
    return rc;
}

int pjs_rt_buffer_device_address(pjs_rt_client *c, pjrt_buffer *b, uint64_t *out,
                                 pjs_error *err)
{
    struct pjrt_buffer_opaque_device_memory_data_pointer_args a = {.struct_size = sizeof a,
                                                                   .buffer = b};
    int rc = CALL(c->plugin->api, buffer_opaque_device_memory_data_pointer, &a,
                  "locating a buffer on the device", err);
    if (rc == 0)
        *out = (uint64_t)(uintptr_t)a.device_memory_ptr;
    return rc;
}

/* ---- host memory of the transfer path ----------------------------------- */

int pjs_rt_host_pin(pjs_rt_client *c, void *data, size_t size, pjs_error *err)
{
    const struct pjrt_api *api = c->plugin->api;
    struct pjrt_client_dma_map_args a = {
        .struct_size = sizeof a, .client = c->client, .data = data, .size = size};
    return CALL(api, client_dma_map, &a, "page-locking host memory for the device", err);
}

void pjs_rt_host_unpin(pjs_rt_client *c, void *data)
{
    const struct pjrt_api *api = c->plugin->api;
    struct pjrt_client_dma_unmap_args a = {.struct_size = sizeof a, .client = c->client, .data = data};
    pjs_error err;
    if (CALL(api, client_dma_unmap, &a, "unmapping host memory from the device", &err) != 0)
        pjs_warn("%s", err.msg);
}

const char *pjs_rt_client_host_memory(const pjs_rt_client *c)
{
    switch (atomic_load(&c->host_memory)) {
    case HOST_DMA_MAPPED: return "dma-mapped";
    case HOST_PAGEABLE: return "pageable";
    default: return "undecided";
    }
}

/* The first answer of the plugin decides the client's path and logs it
 * once: mapped, or UNSUPPORTED (pageable from then on, without asking
 * again). A refusal of one range by a plugin that maps is a warning each
 * time: that memory stays pageable, the next allocation tries again. */
static void note_host_memory(pjs_rt_client *c, int pin_rc, size_t size, const pjs_error *why)
{
    int undecided = HOST_UNDECIDED;
    if (pin_rc == 0) {
        if (atomic_compare_exchange_strong(&c->host_memory, &undecided, HOST_DMA_MAPPED))
            pjs_info("host weights: page-locked and DMA-mapped for the %s device "
                     "(PJRT_Client_DmaMap); loads copy from them directly",
                     c->platform);
    } else if (pin_rc == PJS_ERR_UNSUPPORTED) {
        if (atomic_compare_exchange_strong(&c->host_memory, &undecided, HOST_PAGEABLE))
            pjs_info("host weights: pageable memory; the %s plugin maps no host memory for "
                     "DMA (%s)",
                     c->platform, why->msg);
    } else {
        pjs_warn("host weights: %zu bytes stay pageable, loads from them go through the "
                 "plugin's staging copy: %s; raise the locked-memory limit (ulimit -l) if "
                 "that is what refused",
                 size, why->msg);
    }
}

/* Host blocks are mapped fresh (mmap: zero-filled by the kernel, page by
 * page as they are first touched) and unmapped when freed, except that a
 * freed block of at most HOST_SPARE_BYTES is kept (the oldest kept ones
 * unmapped to stay within HOST_SPARE_BLOCKS blocks and HOST_SPARE_BYTES in
 * all) and handed to the next allocation of its size, zeroed by memset: under a host budget, floors are freed and
 * read again all the time, mostly at the sizes of the models being evicted,
 * and a kept block spares the read its page faults, the kernel's zeroing,
 * the unmap's TLB shootdown and, where memory is DMA-mapped, a new mapping. */
static bool take_spare(pjs_rt_client *c, size_t rounded, pjs_rt_host_memory *out)
{
    bool found = false;
    pthread_mutex_lock(&c->spare_lock);
    for (size_t i = c->n_spare; i-- > 0 && !found;) /* the newest first */
        if (c->spare[i].size == rounded) {
            *out = c->spare[i];
            memmove(&c->spare[i], &c->spare[i + 1], (c->n_spare - i - 1) * sizeof *c->spare);
            c->n_spare--;
            c->spare_bytes -= rounded;
            found = true;
        }
    pthread_mutex_unlock(&c->spare_lock);
    if (found)
        memset(out->data, 0, out->size);
    return found;
}

static void release_host_block(pjs_rt_client *c, pjs_rt_host_memory *m)
{
    if (m->pinned)
        pjs_rt_host_unpin(c, m->data);
    munmap(m->data, m->size);
    *m = (pjs_rt_host_memory){0};
}

int pjs_rt_host_alloc(pjs_rt_client *c, size_t size, pjs_rt_host_memory *out, pjs_error *err)
{
    *out = (pjs_rt_host_memory){0};
    if (size == 0)
        return 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t rounded = (size + page - 1) / page * page;
    if (take_spare(c, rounded, out))
        return 0;
    void *data = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED)
        return pjs_error_set(err, PJS_ERR_NOMEM,
                             "out of memory for %zu bytes of host memory", rounded);
    /* Large blocks in huge pages where the kernel offers them on request:
     * filling a floor read from its file then faults 512 times less. */
    if (rounded >= HUGE_PAGE_BYTES)
        (void)madvise(data, rounded, MADV_HUGEPAGE);
    bool pinned = false;
    if (atomic_load(&c->host_memory) != HOST_PAGEABLE) {
        pjs_error why;
        int rc = pjs_rt_host_pin(c, data, rounded, &why);
        pinned = rc == 0;
        note_host_memory(c, rc, rounded, &why);
    }
    *out = (pjs_rt_host_memory){.data = data, .size = rounded, .pinned = pinned};
    return 0;
}

void pjs_rt_host_free(pjs_rt_client *c, pjs_rt_host_memory *m)
{
    if (m->data == NULL)
        return;
    if (m->size > HOST_SPARE_BYTES) {
        release_host_block(c, m);
        return;
    }
    pjs_rt_host_memory oldest[HOST_SPARE_BLOCKS];
    size_t n_oldest = 0;
    pthread_mutex_lock(&c->spare_lock);
    while (c->n_spare == HOST_SPARE_BLOCKS || m->size > HOST_SPARE_BYTES - c->spare_bytes) {
        oldest[n_oldest] = c->spare[0];
        c->spare_bytes -= oldest[n_oldest++].size;
        memmove(&c->spare[0], &c->spare[1], --c->n_spare * sizeof *c->spare);
    }
    c->spare[c->n_spare++] = *m;
    c->spare_bytes += m->size;
    pthread_mutex_unlock(&c->spare_lock);
    *m = (pjs_rt_host_memory){0};
    for (size_t i = 0; i < n_oldest; i++) /* outside the lock: unmapping takes a while */
        release_host_block(c, &oldest[i]);
}

/* Starts copying b into dst (dst_size its exact size), in the buffer's own
 * layout; *ev completes when dst is written. */
static int read_start(pjs_rt_client *c, pjrt_buffer *b, void *dst, size_t dst_size,
                      pjrt_event **ev, pjs_error *err)
{
    const struct pjrt_api *api = c->plugin->api;
    *ev = NULL;
    struct pjrt_buffer_to_host_buffer_args q = {.struct_size = sizeof q, .src = b};
    int rc = CALL(api, buffer_to_host_buffer, &q, "sizing a device buffer", err);
    if (rc != 0)
        return rc;
    if (q.dst_size != dst_size)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "device buffer holds %zu bytes, expected %zu", q.dst_size, dst_size);
    struct pjrt_buffer_to_host_buffer_args a = {
        .struct_size = sizeof a, .src = b, .dst = dst, .dst_size = dst_size};
    rc = CALL(api, buffer_to_host_buffer, &a, "copying from the device", err);
    if (rc == 0)
        *ev = a.event;
    return rc;
}

int pjs_rt_buffer_to_host(pjs_rt_client *c, pjrt_buffer *b, void *dst, size_t dst_size,
                          pjs_error *err)
{
    pjrt_event *ev;
    int rc = read_start(c, b, dst, dst_size, &ev, err);
    if (rc != 0)
        return rc;
    return await_event(c->plugin->api, ev, "copying from the device", err);
}

/* ---- reading outputs back ---------------------------------------------- */

/* The dense size of result o of e; false when it does not fit a size_t. */
static bool result_bytes(const pjs_rt_executable *e, size_t o, size_t *out)
{
    uint64_t n;
    if (!pjs_shape_nbytes(&e->results[o].shape, pjs_dtype_size(e->results[o].dtype), &n) ||
        n > SIZE_MAX)
        return false;
    *out = (size_t)n;
    return true;
}

/* Fills plan->out[o] from b's layout; false when b is not dense (tiled,
 * strided, padded, or the layout unknown). */
static bool plan_output(const pjs_rt_executable *e, size_t o, pjrt_buffer *b,
                        struct pjs_rt_read_plan *plan)
{
    const struct pjrt_api *api = e->client->plugin->api;
    pjs_error ignored;
    size_t nbytes;
    struct pjrt_buffer_get_memory_layout_args l = {.struct_size = sizeof l, .buffer = b};
    struct pjrt_buffer_on_device_size_in_bytes_args z = {.struct_size = sizeof z, .buffer = b};
    if (!result_bytes(e, o, &nbytes) ||
        CALL(api, buffer_get_memory_layout, &l, "reading a buffer's layout", &ignored) != 0 ||
        CALL(api, buffer_on_device_size_in_bytes, &z, "sizing a buffer", &ignored) != 0)
        return false;
    const struct pjrt_buffer_memory_layout_tiled *t = &l.layout.tiled;
    size_t rank = (size_t)e->results[o].shape.rank;
    if (l.layout.type != PJRT_BUFFER_MEMORY_LAYOUT_TILED || t->num_tiles != 0 ||
        t->minor_to_major_size != rank || z.on_device_size_in_bytes != nbytes)
        return false;
    bool row_major = true, seen[PJS_MAX_RANK] = {false};
    for (size_t i = 0; i < rank; i++) {
        int64_t d = t->minor_to_major[i];
        if (d < 0 || (size_t)d >= rank || seen[d])
            return false;
        seen[d] = true;
        plan->out[o].minor_to_major[i] = (uint8_t)d;
        row_major = row_major && (size_t)d == rank - 1 - i;
    }
    plan->out[o].row_major = row_major;
    plan->out[o].dense = true;
    return true;
}

/* e's plan, decided from `outputs` (those of an execution just started)
 * the first time. */
static const struct pjs_rt_read_plan *read_plan(pjs_rt_executable *e, pjrt_buffer *const *outputs)
{
    struct pjs_rt_read_plan *plan = atomic_load_explicit(&e->read_plan, memory_order_acquire);
    if (plan != NULL)
        return plan;
    const struct pjrt_api *api = e->client->plugin->api;
    plan = calloc(1, sizeof *plan + e->n_results * sizeof plan->out[0]);
    if (plan == NULL)
        return &plugin_row_major;
    plan->n = e->n_results;
    bool dense = true;
    for (size_t o = 0; o < e->n_results; o++) {
        plan->out[o].row_major = true; /* what is assumed of a layout the plugin cannot tell */
        dense = plan_output(e, o, outputs[o], plan) && dense;
    }
    plan->path = dense && strcmp(e->client->platform, "cpu") == 0 &&
                         HAS_SLOT(api, buffer_unsafe_pointer)
                     ? PJS_RT_READ_IN_PLACE
                     : PJS_RT_READ_BY_PLUGIN;
    struct pjs_rt_read_plan *none = NULL;
    if (!atomic_compare_exchange_strong_explicit(&e->read_plan, &none, plan,
                                                 memory_order_acq_rel, memory_order_acquire)) {
        free(plan); /* another execution decided first: the same plan */
        return none;
    }
    return plan;
}

bool pjs_rt_output_device_row_major(const pjs_rt_executable *e, size_t o)
{
    const struct pjs_rt_read_plan *plan =
        atomic_load_explicit(&((pjs_rt_executable *)e)->read_plan, memory_order_acquire);
    return plan != NULL && o < plan->n && plan->out[o].dense && plan->out[o].row_major;
}

int pjs_rt_executable_read_path(const pjs_rt_executable *e)
{
    const struct pjs_rt_read_plan *plan =
        atomic_load_explicit(&((pjs_rt_executable *)e)->read_plan, memory_order_acquire);
    return plan == NULL ? PJS_RT_READ_UNDECIDED : plan->path;
}

/* Copies output o (ready) into dst, dst_size its exact size, row-major. */
static int read_output(pjs_rt_executable *e, const struct pjs_rt_read_plan *plan,
                       pjrt_buffer *const *outputs, size_t o, void *dst, size_t dst_size,
                       pjs_error *err)
{
    bool row_major = o >= plan->n || plan->out[o].row_major;
    const pjs_rt_tensor_type *t = &e->results[o];
    if (plan->path != PJS_RT_READ_IN_PLACE) {
        if (row_major)
            return pjs_rt_buffer_to_host(e->client, outputs[o], dst, dst_size, err);
        void *tmp = malloc(dst_size > 0 ? dst_size : 1);
        if (tmp == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "no memory to read back %zu bytes",
                                 dst_size);
        int rc = pjs_rt_buffer_to_host(e->client, outputs[o], tmp, dst_size, err);
        if (rc == 0)
            copy_relayout(dst, tmp, &t->shape, pjs_dtype_size(t->dtype),
                          plan->out[o].minor_to_major, true);
        free(tmp);
        return rc;
    }
    size_t nbytes = 0;
    result_bytes(e, o, &nbytes); /* fits: checked when the plan was made */
    if (nbytes != dst_size)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "device buffer holds %zu bytes, expected %zu",
                             nbytes, dst_size);
    if (nbytes == 0)
        return 0;
    struct pjrt_buffer_unsafe_pointer_args a = {.struct_size = sizeof a, .buffer = outputs[o]};
    int rc = CALL(e->client->plugin->api, buffer_unsafe_pointer, &a, "locating an output", err);
    if (rc != 0)
        return rc;
    if (row_major)
        memcpy(dst, (const void *)a.buffer_pointer, nbytes);
    else
        copy_relayout(dst, (const void *)a.buffer_pointer, &t->shape, pjs_dtype_size(t->dtype),
                      plan->out[o].minor_to_major, true);
    return 0;
}

void pjs_rt_buffer_destroy(pjs_rt_client *c, pjrt_buffer *b)
{
    if (b == NULL)
        return;
    struct pjrt_buffer_destroy_args d = {.struct_size = sizeof d, .buffer = b};
    pjs_error err;
    if (CALL(c->plugin->api, buffer_destroy, &d, "destroying a buffer", &err) != 0)
        pjs_warn("%s", err.msg);
}


void pjs_rt_client_set_read_ahead(pjs_rt_client *c, bool read_ahead)
{
    c->reads_ahead = read_ahead;
}

/* Waiting for an execution. Blocking in PJRT_Event_Await puts the thread to
 * sleep until the plugin's thread wakes it: two context switches and their
 * latency, which for an execution of a few microseconds cost more than the
 * execution. So when an executable usually takes at most
 * PJS_RT_SPIN_UNDER_NS (an average of its last executions, from the execute
 * call to the event seen ready), the wait first polls the event for twice
 * that. Under contention executions look longer (the plugin's thread waits
 * for a CPU), so polling stops where it would take a CPU from others. */
static uint64_t spin_budget_ns(const pjs_rt_executable *e)
{
    uint64_t usual = atomic_load_explicit(&e->usual_exec_ns, memory_order_relaxed);
    return usual <= PJS_RT_SPIN_UNDER_NS ? 2 * usual : 0;
}

/* Folds one execution's time into the average (weight 1/8). */
static void note_execution_time(pjs_rt_executable *e, uint64_t ns)
{
    uint64_t usual = atomic_load_explicit(&e->usual_exec_ns, memory_order_relaxed);
    uint64_t next = usual == 0 ? ns : usual - usual / 8 + ns / 8;
    atomic_store_explicit(&e->usual_exec_ns, next > 0 ? next : 1, memory_order_relaxed);
}

/* Queues one execution of e; *done (done NULL: not wanted) becomes its
 * completion event. */
static int launch(pjs_rt_executable *e, pjrt_buffer *const *args, pjrt_buffer **outputs,
                  pjrt_event **done, pjs_error *err)
{
    const struct pjrt_api *api = e->client->plugin->api;
    struct pjrt_execute_options opts = {.struct_size = sizeof opts};
    pjrt_buffer *const *arg_lists[1] = {args};
    pjrt_buffer **out_lists[1] = {outputs};
    for (size_t i = 0; i < e->n_results; i++)
        outputs[i] = NULL;
    struct pjrt_loaded_executable_execute_args a = {.struct_size = sizeof a,
                                                    .executable = e->loaded,
                                                    .options = &opts,
                                                    .argument_lists = arg_lists,
                                                    .num_devices = 1,
                                                    .num_args = e->n_params,
                                                    .output_lists = out_lists,
                                                    .device_complete_events = done};
    int rc = CALL(api, loaded_executable_execute, &a, "executing", err);
    if (rc != 0 && done != NULL) {
        destroy_event(api, *done);
        *done = NULL;
    }
    return rc;
}

int pjs_rt_execute_launch(pjs_rt_executable *e, pjrt_buffer *const *args, pjrt_buffer **outputs,
                          pjs_error *err)
{
    return launch(e, args, outputs, NULL, err);
}

int pjs_rt_execute(pjs_rt_executable *e, pjrt_buffer *const *args, pjrt_buffer **outputs,
                   pjs_error *err)
{
    return pjs_rt_execute_read(e, args, outputs, NULL, NULL, NULL, err);
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int pjs_rt_execute_read(pjs_rt_executable *e, pjrt_buffer *const *args, pjrt_buffer **outputs,
                        void *const *dst, const size_t *dst_size, pjs_rt_exec_times *times,
                        pjs_error *err)
{
    bool cpu = times != NULL && times->want_cpu;
    uint64_t cpu_start = cpu ? thread_cpu_ns() : 0;
    const struct pjrt_api *api = e->client->plugin->api;
    pjrt_event *done = NULL;
    uint64_t start = monotonic_ns();
    int rc = launch(e, args, outputs, &done, err);
    uint64_t cpu_launched = cpu ? thread_cpu_ns() : 0;
    /* A device plugin queues each copy behind the execution on its stream, so
     * starting the reads before waiting saves a round trip to the device per
     * output. The CPU plugin copies a ready buffer inline but hands a pending
     * one to its thread pool: there the reads start once the execution is done. */
    const struct pjs_rt_read_plan *plan = rc == 0 && dst != NULL ? read_plan(e, outputs) : NULL;
    bool read_ahead = e->client->reads_ahead;
    size_t started = 0;
    pjrt_event *reads[PJS_RT_MAX_READS_AHEAD];
    bool read[PJS_RT_MAX_READS_AHEAD] = {false};
    if (plan != NULL && read_ahead && e->n_results <= PJS_RT_MAX_READS_AHEAD) {
        for (; started < e->n_results && rc == 0; started++) {
            reads[started] = NULL;
            /* an output to reorder is read after the wait, with a copy */
            read[started] = dst[started] != NULL &&
                            (started >= plan->n || plan->out[started].row_major);
            if (read[started])
                rc = read_start(e->client, outputs[started], dst[started], dst_size[started],
                                &reads[started], err);
        }
    } else {
        read_ahead = false;
    }
    /* every started copy is waited for, failed or not: dst must not be
     * written after we return */
    spin_until_ready(api, done, spin_budget_ns(e));
    int waited = await_event(api, done, "executing", rc == 0 ? err : NULL);
    rc = rc != 0 ? rc : waited;
    uint64_t end = monotonic_ns();
    if (rc == 0)
        note_execution_time(e, end - start);
    uint64_t cpu_executed = cpu ? thread_cpu_ns() : 0;
    if (times != NULL)
        times->executed_ns = end;
    for (size_t o = 0; o < started; o++) {
        waited = await_event(api, reads[o], "copying from the device", rc == 0 ? err : NULL);
        rc = rc != 0 ? rc : waited;
    }
    for (size_t o = 0; rc == 0 && plan != NULL && o < e->n_results; o++)
        if (dst[o] != NULL && !(read_ahead && read[o]))
            rc = read_output(e, plan, outputs, o, dst[o], dst_size[o], err);
    if (rc != 0) {
        for (size_t i = 0; i < e->n_results; i++) {
            pjs_rt_buffer_destroy(e->client, outputs[i]);
            outputs[i] = NULL;
        }
    }
    if (cpu) {
        times->launch_cpu_ns = cpu_launched - cpu_start;
        times->wait_cpu_ns = cpu_executed - cpu_launched;
        times->read_cpu_ns = thread_cpu_ns() - cpu_executed;
    }
    return rc;
}
