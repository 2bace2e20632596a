/*
 * raw_execute.c - the in-process limit for serving a bundle: time PJRT alone.
 *
 *   pjs_bench_raw_execute BUNDLE [--batch-size N] [--iterations N] [--warmup N]
 *                         [--pjrt-plugin PATH] [--cpu-intra-op-threads N|auto]
 *                         [--execution-wait await|callback] [--idle-us N] [--json]
 *
 * Opens and compiles the bundle's module for batch size N (default 1) with
 * the same library calls `pjserve run` and the server use, uploads the weights
 * once, and then times --iterations rounds of what one request costs the
 * device side of a server:
 *
 *   upload every input (pjs_rt_buffer_from_host), execute and read every
 *   output back (pjs_rt_execute_read, the server's call), free the buffers
 *
 * and, separately, the execution alone (from its start until it is seen
 * done). Inputs are fixed pseudo-random
 * values (floats in [-1, 1), other types zero). Prints p50, p90, p99, mean
 * and min in microseconds of both, as a table or (--json) as one JSON object,
 * with where the CPU goes: the calling thread's mean CPU time uploading,
 * launching the execution, waiting for it and reading back (the phases of
 * pjs_rt_exec_times), and the whole process's CPU time per round trip (the
 * plugin's own threads included). --execution-wait picks how the waits are
 * made, as pjserve's flag of that name does. --idle-us sleeps that long
 * after each round trip (not timed), leaving the device and the thread idle
 * as a server's are between one client's requests; back to back (0, the
 * default), clocks and caches stay warm, which a served request at
 * concurrency 1 never sees.
 * No network, no protocol, no queueing: what is left between this and a
 * server's latency is the server's own overhead (plus the client's). The
 * client is the server's too: on the CPU plugin one device and the thread
 * count `pjserve serve` would pick for this bundle alone (auto, or
 * --cpu-intra-op-threads).
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "registry/bundle.h"
#include "runtime/cpu_threads.h"

static const char usage[] =
    "usage: pjs_bench_raw_execute BUNDLE [--batch-size N] [--iterations N] [--warmup N]\n"
    "                             [--pjrt-plugin PATH] [--cpu-intra-op-threads N|auto]\n"
    "                             [--execution-wait await|callback] [--idle-us N] [--json]\n";

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double thread_cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double process_cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct summary {
    double p50, p90, p99, mean, min;
} summary;

/* Sorts v in place. Percentiles by the nearest-rank method. */
static summary summarize(double *v, long n)
{
    summary s = {0};
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (long i = 0; i < n; i++)
        sum += v[i];
    long i50 = (long)(0.50 * (double)n + 0.999999) - 1;
    long i90 = (long)(0.90 * (double)n + 0.999999) - 1;
    long i99 = (long)(0.99 * (double)n + 0.999999) - 1;
    s.p50 = v[i50 < 0 ? 0 : i50];
    s.p90 = v[i90 < 0 ? 0 : i90];
    s.p99 = v[i99 < 0 ? 0 : i99];
    s.mean = sum / (double)n;
    s.min = v[0];
    return s;
}

static long parse_positive(const char *flag, const char *arg)
{
    char *end;
    errno = 0;
    long long v = strtoll(arg, &end, 10);
    if (errno != 0 || *end != '\0' || v < 1 || v > 100000000) {
        fprintf(stderr, "pjs_bench_raw_execute: %s %s: expected a positive integer\n", flag, arg);
        exit(2);
    }
    return (long)v;
}

static size_t tensor_bytes(pjs_dtype dtype, const pjs_shape *shape)
{
    size_t n = pjs_dtype_size(dtype);
    for (int d = 0; d < shape->rank; d++)
        n *= (size_t)shape->dims[d];
    return n;
}

/* The spec's shape with the batch axis (if any) set to batch. */
static pjs_shape concrete_shape(const pjs_tensor_spec *s, int64_t batch)
{
    pjs_shape shape = s->shape;
    if (s->batched)
        shape.dims[0] = batch;
    return shape;
}

static void fill_input(void *data, pjs_dtype dtype, size_t bytes, uint32_t seed)
{
    memset(data, 0, bytes);
    if (dtype != PJS_DTYPE_F32)
        return;
    float *f = data;
    uint32_t x = seed * 2654435761u + 1u;
    for (size_t i = 0; i < bytes / sizeof *f; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        f[i] = (float)((double)x / 4294967296.0 * 2.0 - 1.0);
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"batch-size", required_argument, NULL, 'b'},
                                         {"iterations", required_argument, NULL, 'n'},
                                         {"warmup", required_argument, NULL, 'w'},
                                         {"pjrt-plugin", required_argument, NULL, 'p'},
                                         {"cpu-intra-op-threads", required_argument, NULL, 't'},
                                         {"execution-wait", required_argument, NULL, 'e'},
                                         {"idle-us", required_argument, NULL, 'i'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    long batch = 1, iterations = 10000, warmup = 1000, idle_us = 0;
    const char *plugin_path = NULL;
    int json = 0, opt, threads = 0; /* 0: auto */
    pjs_error err;
    pjs_rt_wait_mode wait = PJS_RT_WAIT_AWAIT;
    while ((opt = getopt_long(argc, argv, "b:n:w:p:t:e:i:jh", opts, NULL)) != -1) {
        switch (opt) {
        case 'b': batch = parse_positive("--batch-size", optarg); break;
        case 'n': iterations = parse_positive("--iterations", optarg); break;
        case 'w': warmup = parse_positive("--warmup", optarg); break;
        case 'i': idle_us = parse_positive("--idle-us", optarg); break;
        case 'p': plugin_path = optarg; break;
        case 't':
            if (pjs_rt_cpu_threads_parse(optarg, &threads, &err) != 0) {
                fprintf(stderr, "pjs_bench_raw_execute: %s\n", err.msg);
                return 2;
            }
            break;
        case 'e':
            if (pjs_rt_wait_mode_parse(optarg, &wait, &err) != 0) {
                fprintf(stderr, "pjs_bench_raw_execute: %s\n", err.msg);
                return 2;
            }
            break;
        case 'j': json = 1; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    if (argc - optind != 1) {
        fputs(usage, stderr);
        return 2;
    }
    const char *dir = argv[optind];
    pjs_rt_set_wait_mode(wait);

    pjs_bundle *b = NULL;
    pjs_rt_plugin *plugin = NULL;
    pjs_rt_client *client = NULL;
    char path[4096];
    int rc = 1;
    pjs_rt_option cpu = {.key = PJS_RT_OPTION_CPU_THREADS, .type = PJRT_NAMED_INT64};
    if (pjs_bundle_open(dir, &b, &err) == 0)
        cpu.int_value = threads > 0 ? threads
                                    : pjs_rt_cpu_threads_auto(
                                          pjs_rt_cpu_flops_estimate(&b->manifest, &b->weights));
    if (b == NULL ||
        pjs_rt_plugin_resolve(plugin_path, path, sizeof path, &err) != 0 ||
        pjs_rt_plugin_load(path, &plugin, &err) != 0 ||
        pjs_rt_client_create(plugin, &cpu, 1, &client, &err) != 0) {
        fprintf(stderr, "pjs_bench_raw_execute: %s\n", err.msg);
        pjs_bundle_close(b);
        return 1;
    }
    const pjs_manifest *m = &b->manifest;
    /* The top-level shapes (variant 0), which m->inputs and m->outputs describe. */
    pjs_bundle_module *mod = pjs_bundle_module_for(b, 0, batch);
    if (m->kind != PJS_KIND_MODEL || mod == NULL) {
        fprintf(stderr, "pjs_bench_raw_execute: bundle %s: %s\n", m->name,
                m->kind != PJS_KIND_MODEL ? "not a model bundle (kind meta)"
                                          : "no module compiled for that batch size");
        pjs_bundle_close(b);
        pjs_rt_client_destroy(client);
        return 1;
    }
    if (pjs_bundle_compile_module(b, mod, client, NULL, &err) != 0) {
        fprintf(stderr, "pjs_bench_raw_execute: %s\n", err.msg);
        pjs_bundle_close(b);
        pjs_rt_client_destroy(client);
        return 1;
    }

    size_t n_w = b->weights.n_tensors, n_in = m->n_inputs, n_out = m->n_outputs;
    pjrt_buffer **args = calloc(n_w + n_in + 1, sizeof *args);
    pjrt_buffer **results = calloc(n_out + 1, sizeof *results);
    void **in_data = calloc(n_in + 1, sizeof *in_data);
    void **out_data = calloc(n_out + 1, sizeof *out_data);
    size_t *out_bytes = calloc(n_out + 1, sizeof *out_bytes);
    pjs_shape *in_shapes = calloc(n_in + 1, sizeof *in_shapes);
    double *total = malloc((size_t)iterations * sizeof *total);
    double *exec = malloc((size_t)iterations * sizeof *exec);
    int weights_uploaded = 0;
    if (!args || !results || !in_data || !out_data || !out_bytes || !in_shapes || !total || !exec) {
        fprintf(stderr, "pjs_bench_raw_execute: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < n_in; i++) {
        in_shapes[i] = concrete_shape(&m->inputs[i], batch);
        size_t bytes = tensor_bytes(m->inputs[i].dtype, &in_shapes[i]);
        in_data[i] = malloc(bytes ? bytes : 1);
        if (in_data[i] == NULL) {
            fprintf(stderr, "pjs_bench_raw_execute: out of memory\n");
            goto out;
        }
        fill_input(in_data[i], m->inputs[i].dtype, bytes, (uint32_t)i + 1);
    }
    for (size_t o = 0; o < n_out; o++) {
        pjs_shape shape = concrete_shape(&m->outputs[o], batch);
        out_bytes[o] = tensor_bytes(m->outputs[o].dtype, &shape);
        out_data[o] = malloc(out_bytes[o] ? out_bytes[o] : 1);
        if (out_data[o] == NULL) {
            fprintf(stderr, "pjs_bench_raw_execute: out of memory\n");
            goto out;
        }
    }
    if (pjs_bundle_upload_weights(b, client, NULL, args, &err) != 0) {
        fprintf(stderr, "pjs_bench_raw_execute: %s\n", err.msg);
        goto out;
    }
    weights_uploaded = 1;

    /* the calling thread's CPU time by phase, and the process's, summed over
     * the timed iterations */
    double cpu_upload = 0, cpu_launch = 0, cpu_wait = 0, cpu_read = 0, cpu_process = 0;
    double cpu_idle = 0; /* this thread's in the idle sleeps, kept out of the process's */
    for (long it = -warmup; it < iterations; it++) {
        if (it == 0)
            cpu_process = -process_cpu_us();
        double c0 = thread_cpu_us();
        double t0 = now_us();
        size_t up = 0;
        for (; up < n_in; up++)
            if (pjs_rt_buffer_from_host(client, m->inputs[up].dtype, &in_shapes[up],
                                        &mod->exec->params[n_w + up], in_data[up],
                                        &args[n_w + up], &err) != 0)
                break;
        double t1 = now_us();
        double c1 = thread_cpu_us();
        pjs_rt_exec_times times = {.want_cpu = true};
        int ok = up == n_in && pjs_rt_execute_read(mod->exec, args, results, out_data, out_bytes,
                                                   &times, &err) == 0;
        double t2 = (double)times.executed_ns / 1e3;
        for (size_t i = 0; i < up; i++)
            pjs_rt_buffer_destroy(client, args[n_w + i]);
        for (size_t o = 0; ok && o < n_out; o++)
            pjs_rt_buffer_destroy(client, results[o]);
        double t3 = now_us();
        if (!ok) {
            fprintf(stderr, "pjs_bench_raw_execute: bundle %s: %s\n", m->name, err.msg);
            goto out;
        }
        if (idle_us > 0) {
            struct timespec idle = {.tv_sec = idle_us / 1000000,
                                    .tv_nsec = (idle_us % 1000000) * 1000};
            double i0 = thread_cpu_us();
            while (nanosleep(&idle, &idle) != 0 && errno == EINTR)
                ;
            cpu_idle += thread_cpu_us() - i0;
        }
        if (it >= 0) {
            total[it] = t3 - t0;
            exec[it] = t2 - t1;
            cpu_upload += c1 - c0;
            cpu_launch += (double)times.launch_cpu_ns / 1e3;
            cpu_wait += (double)times.wait_cpu_ns / 1e3;
            cpu_read += (double)times.read_cpu_ns / 1e3;
        }
    }
    cpu_process += process_cpu_us() - cpu_idle;
    double per = 1.0 / (double)iterations;

    summary st = summarize(total, iterations), se = summarize(exec, iterations);
    if (json) {
        printf("{\"bundle\": \"%s\", \"model\": \"%s\", \"batch_size\": %ld, \"iterations\": %ld, "
               "\"warmup\": %ld, \"idle_us\": %ld, \"platform\": \"%s\", \"cpu_threads\": %lld,\n",
               dir, m->name, batch, iterations, warmup, idle_us, pjs_rt_client_platform(client),
               (long long)cpu.int_value);
        printf(" \"round_trip_us\": {\"p50\": %.2f, \"p90\": %.2f, \"p99\": %.2f, \"mean\": %.2f, "
               "\"min\": %.2f},\n",
               st.p50, st.p90, st.p99, st.mean, st.min);
        printf(" \"execute_us\": {\"p50\": %.2f, \"p90\": %.2f, \"p99\": %.2f, \"mean\": %.2f, "
               "\"min\": %.2f},\n",
               se.p50, se.p90, se.p99, se.mean, se.min);
        printf(" \"execution_wait\": \"%s\", \"thread_cpu_us\": {\"upload\": %.2f, "
               "\"launch\": %.2f, \"wait\": %.2f, \"read\": %.2f}, "
               "\"process_cpu_us\": %.2f}\n",
               wait == PJS_RT_WAIT_CALLBACK ? "callback" : "await", cpu_upload * per,
               cpu_launch * per, cpu_wait * per, cpu_read * per, cpu_process * per);
    } else {
        printf("bundle %s (model %s), batch size %ld, %ld iterations after %ld warm-up, "
               "platform %s (CPU plugin threads: %lld)\n",
               dir, m->name, batch, iterations, warmup, pjs_rt_client_platform(client),
               (long long)cpu.int_value);
        printf("%-40s %9s %9s %9s %9s %9s\n", "microseconds", "p50", "p90", "p99", "mean", "min");
        printf("%-40s %9.2f %9.2f %9.2f %9.2f %9.2f\n", "upload + execute + read back (round trip)",
               st.p50, st.p90, st.p99, st.mean, st.min);
        printf("%-40s %9.2f %9.2f %9.2f %9.2f %9.2f\n", "execute only", se.p50, se.p90, se.p99,
               se.mean, se.min);
        printf("CPU per round trip (us, mean): this thread uploading %.2f, launching %.2f, "
               "waiting %.2f, reading back %.2f; the whole process %.2f\n",
               cpu_upload * per, cpu_launch * per, cpu_wait * per, cpu_read * per,
               cpu_process * per);
    }
    rc = 0;
out:
    if (weights_uploaded)
        for (size_t i = 0; i < n_w; i++)
            pjs_rt_buffer_destroy(client, args[i]);
    for (size_t i = 0; in_data && i < n_in; i++)
        free(in_data[i]);
    for (size_t o = 0; out_data && o < n_out; o++)
        free(out_data[o]);
    free(args);
    free(results);
    free(in_data);
    free(out_data);
    free(out_bytes);
    free(in_shapes);
    free(total);
    free(exec);
    pjs_bundle_close(b); /* executables go before the client */
    pjs_rt_client_destroy(client);
    return rc;
}
