/*
 * cpu_threads.h - how many threads the XLA CPU plugin's pools get.
 *
 * The XLA CPU plugin keeps two thread pools per client, both sized once,
 * when the client is created, to max(PJRT_NPROC (else NPROC, else the CPUs
 * the process may run on), the client's device count), and the plugin makes
 * four devices unless told cpu_device_count:
 *
 *   - the client pool runs every execution the plugin does not judge trivial
 *     (1000 FLOPs or more), so even a tiny model hops onto it once per call;
 *   - the intra-op pool (threads named tf_XLAEigen) takes the parts of one
 *     execution that the compiler partitioned or that Eigen splits. The
 *     compiler partitions loops into as many tasks as this pool has threads,
 *     so the compiled code depends on the count.
 *
 * Idle workers of a pool of two threads or more spin in Eigen's
 * work-stealing loop after every task before they sleep; a one-thread pool
 * polls only its own queue. Which count serves best depends on the models:
 * one thread for models too small to split, every CPU for large ones
 * (docs/runtime.md, section "CPU plugin threads", has the measurements).
 *
 * pjserve picks the count from the model with the most work in its smallest
 * execution (pjs_rt_cpu_threads_auto) unless --cpu-intra-op-threads gives
 * it, and hands it to pjs_rt_client_create as the client option
 * PJS_RT_OPTION_CPU_THREADS, which the runtime applies and never passes to
 * the plugin. Every function here is pure or reads the environment only.
 */
#ifndef PJS_RUNTIME_CPU_THREADS_H
#define PJS_RUNTIME_CPU_THREADS_H

#include "core/manifest.h"
#include "core/safetensors.h"
#include "core/status.h"

/* The client option carrying the thread count (an integer >= 1). Applied by
 * the runtime on the CPU plugin (through PJRT_NPROC and cpu_device_count=1),
 * ignored on other plugins, never passed to any. */
#define PJS_RT_OPTION_CPU_THREADS "pjserve.cpu_threads"

/* Largest count accepted (XLA's own cap on the intra-op pool). */
#define PJS_RT_CPU_THREADS_MAX 256

/* Estimated FLOPs of a model's smallest execution from which a server's
 * pools get every CPU rather than one thread (measured on 2 CPUs,
 * docs/runtime.md). */
#define PJS_RT_CPU_PARALLEL_FLOPS 50e6

/* Parses a --cpu-intra-op-threads value: "auto" gives 0, an integer gives
 * itself (1..PJS_RT_CPU_THREADS_MAX). */
int pjs_rt_cpu_threads_parse(const char *arg, int *out, pjs_error *err);

/* The count XLA would pick by itself, before the device count floor:
 * PJRT_NPROC, else NPROC (when they hold a number), else the CPUs this
 * process may run on. At least 1. */
int pjs_rt_cpu_threads_xla_default(void);

/* The count for a server whose largest model does `flops` in its smallest
 * execution (negative: no model known): 1 below PJS_RT_CPU_PARALLEL_FLOPS or
 * with no model known, else every CPU (pjs_rt_cpu_threads_xla_default).
 * PJRT_NPROC or NPROC set in the environment wins: their count is used. */
int pjs_rt_cpu_threads_auto(double flops);

/* An upper estimate of the FLOPs one execution of a bundle takes at its
 * smallest compiled batch size (the least any execution of it does), from
 * its weights alone: every weight element is multiplied once per example,
 * and an element of a weight of rank 3 or more (a convolution kernel) once
 * per position of the largest input's spatial extent (its extents but the
 * batch axis and the channel axis). 0 for a bundle without weights or batch
 * sizes. */
double pjs_rt_cpu_flops_estimate(const pjs_manifest *m, const pjs_safetensors *w);

#endif
