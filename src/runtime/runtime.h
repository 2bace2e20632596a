/*
 * runtime.h - the PJRT runtime: plugin, client, compile, buffers, execute.
 *
 * pjs_rt_plugin: one dlopen'ed PJRT plugin. Loaded once per process and never
 *   unloaded (plugins do not support it); initialized exactly once.
 * pjs_rt_client: one PJRT client over the plugin's devices. pjserve uses the
 *   first addressable device.
 * pjs_rt_executable: a compiled module plus its signature (parameter and
 *   result types), compiled or loaded from the executable cache.
 * Buffers are plain pjrt_buffer pointers owned by whoever created them.
 *
 * Every PJRT error becomes a pjs_error whose message carries the plugin's own
 * text. Threading: compile, upload and execute may run on different threads;
 * destruction of buffers and executables happens on one thread (the dispatch
 * thread in the server) and always before the client is destroyed.
 */
#ifndef PJS_RUNTIME_RUNTIME_H
#define PJS_RUNTIME_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"
#include "runtime/pjrt_abi.h"

typedef struct pjs_rt_plugin pjs_rt_plugin;
typedef struct pjs_rt_client pjs_rt_client;
typedef struct pjs_exec_cache pjs_exec_cache;

/* Oldest plugin API minor version we accept (0.x). */
#define PJS_RT_MIN_API_MINOR 50

/* What a plugin says about itself. */
typedef struct pjs_rt_plugin_info {
    const char *path;
    int api_major, api_minor;
    int64_t xla_version;            /* -1 when not reported */
    int64_t stablehlo_current[3];   /* {-1,-1,-1} when not reported */
    int64_t stablehlo_minimum[3];
} pjs_rt_plugin_info;

/* Picks the plugin path: `explicit_path` when given, else $PJSERVE_PJRT_PLUGIN,
 * else the xla-cpu-pjrt plugin in the project's .venv (next to the running
 * executable's source tree or in the current directory). */
int pjs_rt_plugin_resolve(const char *explicit_path, char *out, size_t outsize, pjs_error *err);

/* Loads (or returns the already loaded) plugin at path. */
int pjs_rt_plugin_load(const char *path, pjs_rt_plugin **out, pjs_error *err);
const pjs_rt_plugin_info *pjs_rt_plugin_get_info(const pjs_rt_plugin *p);

/* One client creation option, parsed from "key=value" (see
 * pjs_rt_option_parse): bool (true/false), integer, float, or string. */
typedef struct pjs_rt_option {
    char key[64];
    enum pjrt_named_value_type type;
    char string_value[192];
    int64_t int_value;
    float float_value;
    bool bool_value;
} pjs_rt_option;

int pjs_rt_option_parse(const char *key_eq_value, pjs_rt_option *out, pjs_error *err);

/* Creates a client with the options (none: NULL, 0). The option
 * PJS_RT_OPTION_CPU_THREADS (runtime/cpu_threads.h) is the runtime's own: on
 * the CPU plugin it sizes the plugin's thread pools, and creates the client
 * on one device unless cpu_device_count is given; it never reaches the
 * plugin. */
int pjs_rt_client_create(pjs_rt_plugin *p, const pjs_rt_option *options, size_t n_options,
                         pjs_rt_client **out, pjs_error *err);
/* Resolves the plugin (as pjs_rt_plugin_resolve), loads it and creates a
 * client: the start-up every command that executes shares. */
int pjs_rt_client_open(const char *plugin_path, const pjs_rt_option *options, size_t n_options,
                       pjs_rt_client **out, pjs_error *err);
/* Destroys the client; every buffer and executable must be gone. */
void pjs_rt_client_destroy(pjs_rt_client *c);

const char *pjs_rt_client_platform(const pjs_rt_client *c);         /* "cpu", "cuda" */
const char *pjs_rt_client_platform_version(const pjs_rt_client *c);
pjs_rt_plugin *pjs_rt_client_plugin(const pjs_rt_client *c);
size_t pjs_rt_client_device_count(const pjs_rt_client *c);
/* Threads in each of the CPU plugin's pools (intra-op and client), as the
 * plugin sized them at creation; 0 on other platforms. */
int pjs_rt_client_cpu_threads(const pjs_rt_client *c);
/* "0: cpu (TFRT_CPU_0)"-style description of device i into buf. */
void pjs_rt_client_describe_device(const pjs_rt_client *c, size_t i, char *buf, size_t bufsize);
/* The memory device i can allocate from (PJRT memory stats' bytes_limit).
 * UNSUPPORTED when the plugin reports none (the CPU plugin). */
int pjs_rt_client_device_memory(const pjs_rt_client *c, size_t i, uint64_t *bytes_limit,
                                pjs_error *err);

/* A parameter or result of a compiled module. */
typedef struct pjs_rt_tensor_type {
    pjs_dtype dtype;
    pjs_shape shape;
    /* The layout the module gave it (mhlo.layout_mode), when not row-major:
     * its dimensions, the fastest varying first. Parameters are uploaded in
     * it (pjs_rt_buffer_from_host's layout). */
    bool other_layout;
    uint8_t minor_to_major[PJS_MAX_RANK];
} pjs_rt_tensor_type;

typedef struct pjs_rt_executable {
    pjs_rt_client *client;
    pjrt_loaded_executable *loaded;
    size_t n_params;
    pjs_rt_tensor_type *params;
    size_t n_results;
    pjs_rt_tensor_type *results;
    bool from_cache;        /* loaded from the executable cache, not compiled */
    double compile_seconds; /* time to compile or deserialize */
    /* How pjs_rt_execute_read reads the outputs back (runtime.c); NULL
     * until its first execution. */
    struct pjs_rt_read_plan *_Atomic read_plan;
    /* Its executions' usual time, from the execute call to completion
     * (an average; 0 before the first); shortens waits (runtime.c). */
    _Atomic uint64_t usual_exec_ns;
    /* The fastest of the first model's warm-up executions of it (0 before):
     * another model sharing it seeds its costs from this and runs none. */
    _Atomic uint64_t warm_cost_ns;
    /* Compiles of the same module with the same options share one
     * executable in memory: holders counts them, each destroy drops one
     * (the client's table, runtime.c, under its lock). */
    unsigned holders;
    bool keyed; /* in the client's table under key */
    unsigned char key[32];
    struct pjs_rt_executable *next_shared;
} pjs_rt_executable;

/* Executions that usually take at most this long are waited for by
 * polling their completion event first, for twice their usual time, rather
 * than sleeping at once: that saves two thread wake-ups when the execution
 * is quick (docs/runtime.md, "Waiting for an execution"). */
#define PJS_RT_SPIN_UNDER_NS 50000u

/* Compiles a module (MLIR text, bytecode or a StableHLO portable artifact).
 * An executable of the same module and options already loaded on this
 * client is shared instead (*shared set when out_shared is not NULL): a
 * catalogue of copies of one architecture holds one executable per module,
 * not one per model. Otherwise, with a cache, a valid entry is loaded
 * instead and a fresh compile is stored. `label` names the module in
 * errors ("mlp/model.b4.mlir"). Each compile is matched by one
 * pjs_rt_executable_destroy. */
int pjs_rt_compile_shared(pjs_rt_client *c, const void *module, size_t module_size,
                          pjs_exec_cache *cache, const char *label, pjs_rt_executable **out,
                          bool *out_shared, pjs_error *err);
int pjs_rt_compile(pjs_rt_client *c, const void *module, size_t module_size, pjs_exec_cache *cache,
                   const char *label, pjs_rt_executable **out, pjs_error *err);
void pjs_rt_executable_destroy(pjs_rt_executable *e);

/* Inputs of at most this many bytes are uploaded with the plugin copying them
 * during the call (PJRT's "immutable only during call"); larger ones are read
 * in place and waited for. */
#define PJS_RT_STAGED_UPLOAD_MAX (256u << 10)

/* Copies row-major host data to a new device buffer; when it returns, the
 * data may be changed or freed. `param` (may be NULL: the device's default
 * layout) is the executable parameter the buffer is for: the buffer gets its
 * layout, reordered by the plugin as it copies, or here first where the
 * plugin keeps row-major bytes whatever the layout (the CPU plugin). */
int pjs_rt_buffer_from_host(pjs_rt_client *c, pjs_dtype dtype, const pjs_shape *shape,
                            const pjs_rt_tensor_type *param, const void *data, pjrt_buffer **out,
                            pjs_error *err);
/* One buffer of pjs_rt_buffers_from_host, as pjs_rt_buffer_from_host's
 * arguments. */
typedef struct pjs_rt_upload {
    pjs_dtype dtype;
    const pjs_shape *shape;
    const pjs_rt_tensor_type *param; /* NULL: the device's default layout */
    const void *data;
} pjs_rt_upload;

/* Copies n host arrays to n new device buffers, all in flight at once; when
 * it returns, the data may be changed or freed. On failure every out[i] is
 * NULL and *failed is the index of the upload that failed. */
int pjs_rt_buffers_from_host(pjs_rt_client *c, size_t n, const pjs_rt_upload *uploads,
                             pjrt_buffer **out, size_t *failed, pjs_error *err);
/* Device buffers at this alignment within one block (pjs_rt_block_from_host)
 * are handed to executables, as DEVICE_VIEW_ALIGN is. */
#define PJS_RT_BLOCK_ALIGN 256u
/* Copies `size` bytes of host memory to one device buffer (*block), then
 * makes out[i] a view of uploads[i] at offsets[i] within it (each a multiple
 * of PJS_RT_BLOCK_ALIGN; uploads[i].data is not read): one copy instead of
 * n, whose calls cost more than their bytes on a GPU. Destroy the views
 * before the block. UNSUPPORTED (nothing made) where the plugin makes no
 * views, or the block lies at a device address not so aligned (64 bytes on
 * the CPU plugin, whose allocations are), or an upload's param wants
 * another layout: then upload them one by one. */
int pjs_rt_block_from_host(pjs_rt_client *c, const void *data, size_t size, size_t n,
                           const pjs_rt_upload *uploads, const size_t *offsets,
                           pjrt_buffer **block, pjrt_buffer **out, pjs_error *err);
/* pjs_rt_block_from_host in two halves, so that other work can be queued
 * while the block travels (pipelined swap-in, docs/residency.md): start
 * issues the copy and returns at once; the host data must stay unchanged
 * until finish, which waits for the block to be on the device and makes the
 * views (every view, and the block, then the caller's), or cancel, which
 * waits for the plugin to be done with the data and destroys the block.
 * UNSUPPORTED from start (nothing issued) or finish (nothing left) as
 * pjs_rt_block_from_host says. */
typedef struct pjs_rt_block_upload {
    pjrt_buffer *block;
    pjrt_event *done; /* the plugin is done with the host data */
} pjs_rt_block_upload;
int pjs_rt_block_upload_start(pjs_rt_client *c, const void *data, size_t size, size_t n,
                              const pjs_rt_upload *uploads, const size_t *offsets,
                              pjs_rt_block_upload *u, pjs_error *err);
int pjs_rt_block_upload_finish(pjs_rt_client *c, pjs_rt_block_upload *u, size_t n,
                               const pjs_rt_upload *uploads, const size_t *offsets,
                               pjrt_buffer **block, pjrt_buffer **out, pjs_error *err);
void pjs_rt_block_upload_cancel(pjs_rt_client *c, pjs_rt_block_upload *u);
/* Copies a buffer back to host memory (dst_size must be its exact size). */
int pjs_rt_buffer_to_host(pjs_rt_client *c, pjrt_buffer *b, void *dst, size_t dst_size,
                          pjs_error *err);
void pjs_rt_buffer_destroy(pjs_rt_client *c, pjrt_buffer *b);

/* Device memory that clients share (CUDA shared memory, core/cuda_ipc.h)
 * is read and written in place: */
/* The platform's number of the client's device (the CUDA ordinal on the
 * CUDA plugin), or -1 where the plugin does not tell. */
int pjs_rt_client_hardware_id(const pjs_rt_client *c);
/* A buffer viewing the device memory at device_ptr (row-major, the
 * shape's bytes): nothing is copied, and the memory must hold its value
 * until the buffer is destroyed. UNSUPPORTED where the plugin makes no
 * views, or `param` wants another layout than row-major. */
int pjs_rt_buffer_view_device(pjs_rt_client *c, pjs_dtype dtype, const pjs_shape *shape,
                              const pjs_rt_tensor_type *param, uint64_t device_ptr,
                              pjrt_buffer **out, pjs_error *err);
/* The device address of a ready buffer's data. */
int pjs_rt_buffer_device_address(pjs_rt_client *c, pjrt_buffer *b, uint64_t *out,
                                 pjs_error *err);

/* Host memory the device reads again and again (a model's host floor).
 * Where the plugin DMA-maps host memory (PJRT_Client_DmaMap: the CUDA
 * plugin) it is page-locked and registered with the device, so host-to-device
 * copies read it directly rather than through the plugin's own staging
 * buffer; elsewhere (the CPU plugin) it is ordinary pageable memory. Either
 * way it is page-aligned and zero-filled, and the first allocation of a
 * client logs once which of the two its host memory is. */
typedef struct pjs_rt_host_memory {
    void *data;  /* NULL for a size of 0 */
    size_t size; /* the size asked for, rounded up to whole pages */
    bool pinned; /* DMA-mapped: pjs_rt_host_free unmaps it first */
} pjs_rt_host_memory;

/* Allocates; fails only when memory itself cannot be had (a plugin that
 * refuses to map falls back to pageable memory). */
int pjs_rt_host_alloc(pjs_rt_client *c, size_t size, pjs_rt_host_memory *out, pjs_error *err);
/* Frees (a small block may be kept, for a while, for the next allocation
 * of its size: see runtime.c); m is zeroed. A zeroed m is a no-op. */
void pjs_rt_host_free(pjs_rt_client *c, pjs_rt_host_memory *m);

/* DMA-maps [data, data + size) (page-aligned, not yet mapped) for the
 * client's devices. UNSUPPORTED when the plugin maps nothing (no
 * client_dma_map slot, or it answers UNIMPLEMENTED); another status, with the
 * plugin's message, when it maps but refused this range (a locked-memory
 * limit, say). */
int pjs_rt_host_pin(pjs_rt_client *c, void *data, size_t size, pjs_error *err);
/* Undoes pjs_rt_host_pin; the memory stays allocated. */
void pjs_rt_host_unpin(pjs_rt_client *c, void *data);
/* Which host memory the client's allocations got: "dma-mapped",
 * "pageable", or "undecided" before the first one. */
const char *pjs_rt_client_host_memory(const pjs_rt_client *c);

/* Runs e on the client's device and waits for completion. args has
 * e->n_params buffers; outputs receives e->n_results new buffers owned by the
 * caller. */
int pjs_rt_execute(pjs_rt_executable *e, pjrt_buffer *const *args, pjrt_buffer **outputs,
                   pjs_error *err);

/* Queues e on the client's device and returns without waiting: outputs are
 * new buffers, defined once it ran, which later executions may take as
 * arguments (the plugin orders them); whatever waits for the last of them
 * waits for this one too. args must outlive the execution (destroy them
 * after such a wait). */
int pjs_rt_execute_launch(pjs_rt_executable *e, pjrt_buffer *const *args, pjrt_buffer **outputs,
                          pjs_error *err);

/* The most outputs whose copies pjs_rt_execute_read starts ahead; an
 * executable with more reads them after the execution. */
#define PJS_RT_MAX_READS_AHEAD 64

/* What pjs_rt_execute_read tells of one execution. */
typedef struct pjs_rt_exec_times {
    uint64_t executed_ns; /* CLOCK_MONOTONIC when the execution was seen done */
    /* With want_cpu set by the caller: the calling thread's CPU time in the
     * execute call (launching), in waiting for it, and in reading the
     * outputs back (benchmarks; two clock reads more per phase). */
    bool want_cpu;
    uint64_t launch_cpu_ns, wait_cpu_ns, read_cpu_ns;
} pjs_rt_exec_times;

/* pjs_rt_execute, then output o copied into dst[o] (dst_size[o] bytes, its
 * exact size) where dst[o] is not NULL; dst may be NULL (no copies). On a
 * device plugin the copies are queued behind the execution before waiting
 * for it, so one wait covers both. times may be NULL. On error every output
 * buffer is destroyed and nothing more is written into dst. */
int pjs_rt_execute_read(pjs_rt_executable *e, pjrt_buffer *const *args, pjrt_buffer **outputs,
                        void *const *dst, const size_t *dst_size, pjs_rt_exec_times *times,
                        pjs_error *err);

/* How a thread waits for an execution, an upload or a copy back:
 *   AWAIT     blocks in PJRT_Event_Await (the plugin's own wait)
 *   CALLBACK  registers PJRT_Event_OnReady and sleeps on pjserve's own
 *             condition variable, which the plugin's thread signals
 * Process-wide (--execution-wait); a plugin without OnReady is awaited. */
typedef enum { PJS_RT_WAIT_AWAIT = 0, PJS_RT_WAIT_CALLBACK } pjs_rt_wait_mode;
int pjs_rt_wait_mode_parse(const char *s, pjs_rt_wait_mode *out, pjs_error *err);
void pjs_rt_set_wait_mode(pjs_rt_wait_mode mode);

/* How a model's host floor goes to the device (--weight-upload), process-wide:
 *   BLOCK  one copy of the whole floor, the weights views of it
 *          (pjs_rt_block_from_host)
 *   EACH   one copy per weight, all in flight at once
 *   AUTO   BLOCK where the device's memory is not the host's; EACH on the
 *          CPU plugin, where a block is fresh host memory whose page faults
 *          cost more than the calls it saves (a ResNet-50, 102 MB: 45 ms as
 *          a block, 9-12 ms weight by weight, docs/residency.md) */
typedef enum { PJS_RT_UPLOAD_AUTO = 0, PJS_RT_UPLOAD_BLOCK, PJS_RT_UPLOAD_EACH } pjs_rt_upload_mode;
int pjs_rt_upload_mode_parse(const char *s, pjs_rt_upload_mode *out, pjs_error *err);
void pjs_rt_set_upload_mode(pjs_rt_upload_mode mode);
/* Whether floors go to c's device as one block. */
bool pjs_rt_uploads_blocks(const pjs_rt_client *c);

/* The CUDA context schedule of XLA's GPU plugins, read from this variable
 * when the plugin creates its first client: spin, yield or blocking_sync;
 * unset (auto) lets CUDA choose (it spins while a process has fewer active
 * contexts than CPUs). */
#define PJS_RT_DEVICE_SCHEDULE_ENV "TF_CUDA_PLATFORM_GPU_DEVICE_SCHEDULE"
/* --device-schedule: auto | spin | yield | blocking_sync. Call before the
 * first client is created. */
int pjs_rt_set_device_schedule(const char *schedule, pjs_error *err);
/* --xla-flags: appends to XLA_FLAGS, which XLA's plugins parse for every
 * debug option the compile options leave unset. Part of every executable
 * cache key (as any XLA_FLAGS is). Call before the first client is created. */
int pjs_rt_add_xla_flags(const char *flags, pjs_error *err);
/* Whether pjs_rt_execute_read starts the copies before the execution is done:
 * by default on every plugin but the CPU one (see runtime.c); changed for a
 * client (tests run the device plugins' order on the CPU plugin). */
void pjs_rt_client_set_read_ahead(pjs_rt_client *c, bool read_ahead);

/* How pjs_rt_execute_read reads e's outputs back, decided at its first
 * execution from their layouts: on the CPU plugin, when every output is
 * dense, copied from the buffers' memory (IN_PLACE); otherwise through
 * PJRT_Buffer_ToHostBuffer (BY_PLUGIN). Outputs laid out in another order
 * than row-major are reordered either way. */
enum { PJS_RT_READ_UNDECIDED = 0, PJS_RT_READ_IN_PLACE, PJS_RT_READ_BY_PLUGIN };
int pjs_rt_executable_read_path(const pjs_rt_executable *e);
/* Whether output o of e is dense and row-major on the device, as its first
 * execution's read showed (false before one), so that its device memory
 * holds exactly the bytes a client gets. */
bool pjs_rt_output_device_row_major(const pjs_rt_executable *e, size_t o);

#endif
