/*
 * node.c - the worker supervisor of `pjserve node` (node.h).
 *
 * Threads: the caller's (pjs_node_run waits for a stop signal, pjs_node_stop
 * wakes and joins the others) and one per worker (supervise). A worker's
 * thread alone starts, probes, kills and waits for its process; the fields
 * others read (state, pid, restarts, last exit, models) change under
 * node->lock, and every change ends in status_changed, which rewrites the
 * status file.
 */
#include "core/thread_name.h"
#include "node/node.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/unix_addr.h"
#include "node/probe.h"

extern char **environ;

/* A line of worker stderr longer than this is written in pieces. */
#define LINE_MAX_BYTES 4096

typedef enum instance_end {
    END_EXITED,    /* the process exited (status in *status) */
    END_UNHEALTHY, /* probes failed: kill it */
    END_STOP,      /* the node stops */
} instance_end;

typedef struct worker {
    pjs_node *node;
    size_t id;
    /* Copied from the spec; immutable. */
    char device[64];
    char **argv, **envp;
    char probe_host[PJS_UNIX_PATH_MAX + 8]; /* or "unix:/path" */
    int probe_port;
    char grpc[280], http[280];
    /* Under node->lock. */
    pjs_node_worker_state state;
    pid_t pid;            /* 0: no process */
    unsigned restarts;
    char last_exit[64];   /* "" until a process ended */
    char **models;
    size_t n_models;
    /* The supervising thread's own. */
    pthread_t thread;
    bool thread_started;
    int wake_fd;          /* eventfd written by pjs_node_stop */
    int pidfd, err_fd;    /* of the current process; -1: none */
    char line[LINE_MAX_BYTES];
    size_t line_len;
    pjs_node_restart restart;
    int64_t ready_since;  /* monotonic ms the current (or just ended) instance
                             became ready; -1: not ready. after_exit reads
                             it for the restart decision, then clears it */
    bool ever_ready;      /* since the node started */
} worker;

struct pjs_node {
    pjs_node_options o;
    char routing[32];
    char *status_name;
    worker *workers;
    size_t n_workers;
    pthread_mutex_t lock;      /* worker fields marked above */
    pthread_mutex_t file_lock; /* one writer of the status file at a time */
    atomic_bool stopping;
    atomic_int outcome;        /* 0 running; else the exit status */
    bool stopped;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *pjs_node_worker_state_name(pjs_node_worker_state s)
{
    switch (s) {
    case PJS_NODE_STARTING: return "starting";
    case PJS_NODE_READY: return "ready";
    case PJS_NODE_UNHEALTHY: return "unhealthy";
    case PJS_NODE_RESTARTING: return "restarting";
    case PJS_NODE_STOPPING: return "stopping";
    case PJS_NODE_FAILED: return "failed";
    }
    return "unknown";
}

/* "exit status 1" or "signal SIGKILL". */
static void describe_exit(int status, char *buf, size_t size)
{
    if (WIFEXITED(status)) {
        snprintf(buf, size, "exit status %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        const char *abbrev = sigabbrev_np(WTERMSIG(status));
        if (abbrev != NULL)
            snprintf(buf, size, "signal SIG%s%s", abbrev, WCOREDUMP(status) ? " (core dumped)" : "");
        else
            snprintf(buf, size, "signal %d", WTERMSIG(status));
    } else {
        snprintf(buf, size, "wait status %d", status);
    }
}

/* ---- the status document -------------------------------------------------- */

static json_t *worker_json(pjs_node *n, worker *w)
{
    json_t *models = json_array();
    char **names = NULL;
    size_t n_names = 0;
    if (n->o.models != NULL) {
        names = n->o.models(n->o.ctx, w->id, &n_names);
        for (size_t i = 0; i < n_names; i++) {
            json_array_append_new(models, json_string(names[i]));
            free(names[i]);
        }
        free(names);
    } else {
        for (size_t i = 0; i < w->n_models; i++)
            json_array_append_new(models, json_string(w->models[i]));
    }
    return json_pack("{s:I, s:s, s:o, s:s, s:I, s:o, s:s, s:s, s:o}", "id", (json_int_t)w->id,
                     "device", w->device, "pid", w->pid > 0 ? json_integer(w->pid) : json_null(),
                     "state", pjs_node_worker_state_name(w->state), "restarts",
                     (json_int_t)w->restarts, "models", models, "grpc", w->grpc, "http",
                     w->http, "last_exit",
                     w->last_exit[0] ? json_string(w->last_exit) : json_null());
}

char *pjs_node_status_json(pjs_node *n)
{
    json_t *workers = json_array();
    pthread_mutex_lock(&n->lock);
    for (size_t i = 0; i < n->n_workers; i++)
        json_array_append_new(workers, worker_json(n, &n->workers[i]));
    pthread_mutex_unlock(&n->lock);
    json_t *doc = json_pack("{s:s, s:o}", "routing", n->routing, "workers", workers);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return text;
}

/* Rewrites the status file, if any: a reader sees the old document or the
 * new one, never a part. The temporary is made new (O_EXCL, never through a
 * symbolic link) in the run directory and renamed over the file there. */
static void status_changed(pjs_node *n)
{
    if (n->status_name == NULL)
        return;
    char *text = pjs_node_status_json(n);
    if (text == NULL)
        return;
    pthread_mutex_lock(&n->file_lock);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", n->status_name);
    (void)unlinkat(n->o.status_dir_fd, tmp, 0); /* left by a write that failed */
    int fd = openat(n->o.status_dir_fd, tmp,
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    bool ok = fd >= 0;
    size_t len = strlen(text);
    if (ok) {
        ok = write(fd, text, len) == (ssize_t)len && write(fd, "\n", 1) == 1;
        ok = close(fd) == 0 && ok;
    }
    if (ok)
        ok = renameat(n->o.status_dir_fd, tmp, n->o.status_dir_fd, n->status_name) == 0;
    if (!ok)
        pjs_warn("node status file %s (run directory): cannot write it: %s", n->status_name,
                 strerror(errno));
    pthread_mutex_unlock(&n->file_lock);
    free(text);
}

static void set_state(worker *w, pjs_node_worker_state s)
{
    pjs_node *n = w->node;
    pthread_mutex_lock(&n->lock);
    bool changed = w->state != s;
    w->state = s;
    pthread_mutex_unlock(&n->lock);
    if (changed)
        status_changed(n);
}

/* ---- worker stderr ----------------------------------------------------------- */

static void flush_line(worker *w)
{
    char out[LINE_MAX_BYTES + 32];
    int prefix = snprintf(out, sizeof out, "[worker %zu] ", w->id);
    memcpy(out + prefix, w->line, w->line_len);
    out[prefix + w->line_len] = '\n';
    ssize_t r = write(STDERR_FILENO, out, (size_t)prefix + w->line_len + 1);
    (void)r;
    w->line_len = 0;
}

/* Reads what the worker wrote to stderr and passes on complete lines;
 * closes err_fd at end of file. */
static void pump_stderr(worker *w)
{
    char buf[4096];
    for (;;) {
        ssize_t r = read(w->err_fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                if (w->line_len > 0)
                    flush_line(w);
                close(w->err_fd);
                w->err_fd = -1;
            }
            return;
        }
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] == '\n') {
                flush_line(w);
                continue;
            }
            if (w->line_len == LINE_MAX_BYTES)
                flush_line(w);
            w->line[w->line_len++] = buf[i];
        }
    }
}

/* ---- starting and stopping one process ------------------------------------ */

/* Builds the environment of a worker: the node's, with spec entries
 * replacing variables of the same name. */
static char **make_env(char *const *extra)
{
    size_t n_env = 0, n_extra = 0;
    while (environ[n_env] != NULL)
        n_env++;
    while (extra != NULL && extra[n_extra] != NULL)
        n_extra++;
    char **env = calloc(n_env + n_extra + 1, sizeof *env);
    if (env == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        bool replaced = false;
        for (size_t j = 0; j < n_extra && !replaced; j++) {
            const char *eq = strchr(extra[j], '=');
            size_t name_len = eq ? (size_t)(eq - extra[j]) : strlen(extra[j]);
            replaced = strncmp(environ[i], extra[j], name_len) == 0 &&
                       environ[i][name_len] == '=';
        }
        if (!replaced && (env[k] = strdup(environ[i])) == NULL)
            goto fail;
        if (!replaced)
            k++;
    }
    for (size_t j = 0; j < n_extra; j++)
        if ((env[k++] = strdup(extra[j])) == NULL)
            goto fail;
    return env;
fail:
    for (size_t i = 0; i < k; i++)
        free(env[i]);
    free(env);
    return NULL;
}

/* Starts the worker's process: stdin /dev/null, stderr into a pipe, signals
 * unblocked, SIGTERM when this thread dies. Between fork and exec only
 * async-signal-safe calls: the node has other threads. */
static int spawn(worker *w, pjs_error *err)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0)
        return pjs_error_set(err, PJS_ERR_IO, "pipe: %s", strerror(errno));
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigaction(SIGPIPE, &dfl, NULL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (devnull >= 0)
            dup2(devnull, STDIN_FILENO);
        dup2(pipefd[1], STDERR_FILENO);
        execve(w->argv[0], w->argv, w->envp);
        static const char msg[] = "pjserve node: cannot run the worker binary\n";
        ssize_t r = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)r;
        _exit(127);
    }
    int fork_errno = errno;
    if (devnull >= 0)
        close(devnull);
    close(pipefd[1]);
    /* Room for what it logs while this thread waits on the gateway sending
     * it earlier changes (pjs_node_options.ready); best effort. */
    if (pid > 0)
        (void)fcntl(pipefd[0], F_SETPIPE_SZ, 1 << 20);
    if (pid < 0) {
        close(pipefd[0]);
        return pjs_error_set(err, PJS_ERR_IO, "fork: %s", strerror(fork_errno));
    }
    fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
    w->err_fd = pipefd[0];
    w->pidfd = pidfd_open(pid, 0);
    if (w->pidfd < 0) {
        int e = errno;
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(w->err_fd);
        w->err_fd = -1;
        return pjs_error_set(err, PJS_ERR_IO, "pidfd_open: %s", strerror(e));
    }
    pthread_mutex_lock(&w->node->lock);
    w->pid = pid;
    w->state = PJS_NODE_STARTING;
    pthread_mutex_unlock(&w->node->lock);
    return 0;
}

/* Waits up to timeout_ms for the process to exit, passing its stderr on;
 * true with its wait status once it exited. */
static bool wait_exit(worker *w, int64_t timeout_ms, int *status)
{
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        struct pollfd p[2] = {{.fd = w->pidfd, .events = POLLIN},
                              {.fd = w->err_fd, .events = POLLIN}};
        int64_t left = deadline - now_ms();
        int r = poll(p, w->err_fd >= 0 ? 2 : 1, left > 0 ? (int)left : 0);
        if (r > 0 && w->err_fd >= 0 && (p[1].revents & (POLLIN | POLLHUP)))
            pump_stderr(w);
        if (r > 0 && (p[0].revents & POLLIN)) {
            pid_t pid = w->pid;
            while (waitpid(pid, status, 0) < 0 && errno == EINTR)
                ;
            return true;
        }
        if (left <= 0)
            return false;
    }
}

/* Records that the process is gone and releases its descriptors. */
static void reap(worker *w, int status)
{
    if (w->err_fd >= 0) {
        pump_stderr(w); /* what is left in the pipe */
        if (w->err_fd >= 0) {
            close(w->err_fd);
            w->err_fd = -1;
        }
    }
    if (w->line_len > 0)
        flush_line(w);
    close(w->pidfd);
    w->pidfd = -1;
    pthread_mutex_lock(&w->node->lock);
    describe_exit(status, w->last_exit, sizeof w->last_exit);
    w->pid = 0;
    for (size_t i = 0; i < w->n_models; i++)
        free(w->models[i]);
    free(w->models);
    w->models = NULL;
    w->n_models = 0;
    pthread_mutex_unlock(&w->node->lock);
}

/* SIGTERM (and SIGCONT, for a stopped process), then SIGKILL once
 * grace_ms passed; returns the wait status. */
static int terminate(worker *w, int64_t grace_ms)
{
    int status = 0;
    pidfd_send_signal(w->pidfd, SIGTERM, NULL, 0);
    pidfd_send_signal(w->pidfd, SIGCONT, NULL, 0);
    if (wait_exit(w, grace_ms, &status))
        return status;
    pjs_warn("worker %zu (%s) pid %d did not exit within %lld ms of SIGTERM: sending SIGKILL",
             w->id, w->device, (int)w->pid, (long long)grace_ms);
    pidfd_send_signal(w->pidfd, SIGKILL, NULL, 0);
    wait_exit(w, INT32_MAX, &status);
    return status;
}

/* ---- probes ---------------------------------------------------------------------- */

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads the ready models from the worker's repository index; keeps them
 * and reports a change. Failures leave the list as it was. The probe
 * carries no credential: the one worker listens on the public ports, which
 * another local user could hold while the worker starts, so with an
 * inference token the index is not read and the status lists no models. */
static void probe_models(worker *w)
{
    pjs_node *n = w->node;
    static const char body[] = "{\"ready\": true}";
    pjs_probe_request req = {.host = w->probe_host, .port = w->probe_port, .method = "POST",
                             .path = "/v2/repository/index", .body = body,
                             .body_len = sizeof body - 1,
                             .timeout_ms = n->o.probe_timeout_ms};
    pjs_probe_reply reply;
    pjs_error err;
    if (pjs_probe_http(&req, &reply, &err) != 0)
        return;
    json_t *doc = reply.status == 200 ? json_loadb(reply.body, reply.body_len, 0, NULL) : NULL;
    pjs_probe_reply_free(&reply);
    if (!json_is_array(doc)) {
        json_decref(doc);
        return;
    }
    size_t cap = json_array_size(doc), count = 0;
    char **names = calloc(cap ? cap : 1, sizeof *names);
    json_t *entry;
    size_t i;
    json_array_foreach(doc, i, entry) {
        const char *name = json_string_value(json_object_get(entry, "name"));
        const char *state = json_string_value(json_object_get(entry, "state"));
        if (names != NULL && name != NULL && (state == NULL || strcmp(state, "READY") == 0))
            names[count++] = strdup(name);
    }
    json_decref(doc);
    if (names == NULL)
        return;
    qsort(names, count, sizeof *names, cmp_names);
    pthread_mutex_lock(&n->lock);
    bool same = count == w->n_models;
    for (size_t k = 0; same && k < count; k++)
        same = names[k] != NULL && strcmp(names[k], w->models[k]) == 0;
    char **old = same ? names : w->models;
    size_t n_old = same ? count : w->n_models;
    if (!same) {
        w->models = names;
        w->n_models = count;
    }
    pthread_mutex_unlock(&n->lock);
    for (size_t k = 0; k < n_old; k++)
        free(old[k]);
    free(old);
    if (!same)
        status_changed(n);
}

/* One health probe: true when GET /v2/health/live answered 200. */
static bool probe_live(worker *w, pjs_error *err)
{
    pjs_probe_request req = {.host = w->probe_host, .port = w->probe_port, .method = "GET",
                             .path = "/v2/health/live", .timeout_ms = w->node->o.probe_timeout_ms};
    pjs_probe_reply reply;
    if (pjs_probe_http(&req, &reply, err) != 0)
        return false;
    int status = reply.status;
    pjs_probe_reply_free(&reply);
    if (status != 200)
        pjs_error_set(err, PJS_ERR_UNAVAILABLE, "GET /v2/health/live answered %d", status);
    return status == 200;
}

/* Acts on one probe; false when the worker must go (unhealthy). */
static bool probe_once(worker *w, unsigned *misses)
{
    pjs_node *n = w->node;
    pjs_error err;
    if (probe_live(w, &err)) {
        if (*misses > 0 && w->ever_ready)
            pjs_info("worker %zu (%s) pid %d answers its health probes again", w->id, w->device,
                     (int)w->pid);
        *misses = 0;
        if (w->ready_since < 0) {
            /* With a gateway: ready once the gateway routes to it, so that
             * "node ready" never precedes it. */
            if (n->o.ready != NULL && !n->o.ready(n->o.ctx, w->id)) {
                pjs_debug("worker %zu (%s) pid %d answers; waiting for the gateway to take it",
                          w->id, w->device, (int)w->pid);
                return true;
            }
            w->ready_since = now_ms();
            w->ever_ready = true;
            pjs_info("worker %zu (%s) ready: pid %d, REST %s, gRPC %s", w->id, w->device,
                     (int)w->pid, w->http, w->grpc);
        }
        if (n->o.models == NULL)
            probe_models(w);
        set_state(w, PJS_NODE_READY);
        return true;
    }
    /* Still starting: its ports open once its repository is loaded, so a
     * refused connection is expected; one accepted and not answered is
     * not (a hung or stopped worker). */
    if (w->ready_since < 0 && err.code == PJS_ERR_UNAVAILABLE)
        return true;
    (*misses)++;
    pjs_warn("worker %zu (%s) pid %d: health probe %u of %u failed: %s", w->id, w->device,
             (int)w->pid, *misses, n->o.unhealthy_after, err.msg);
    if (w->ready_since >= 0)
        set_state(w, PJS_NODE_UNHEALTHY);
    return *misses < n->o.unhealthy_after;
}

/* ---- one worker's life ---------------------------------------------------------- */

/* Watches the running process until it exits, turns unhealthy, or the
 * node stops. */
static instance_end watch(worker *w, int *status)
{
    pjs_node *n = w->node;
    unsigned misses = 0;
    int64_t next_probe = now_ms() + n->o.probe_interval_ms;
    for (;;) {
        struct pollfd p[3] = {{.fd = w->wake_fd, .events = POLLIN},
                              {.fd = w->pidfd, .events = POLLIN},
                              {.fd = w->err_fd, .events = POLLIN}};
        int64_t left = next_probe - now_ms();
        int r = poll(p, w->err_fd >= 0 ? 3 : 2, left > 0 ? (int)left : 0);
        if (r < 0 && errno != EINTR)
            pjs_warn("worker %zu: poll: %s", w->id, strerror(errno));
        if (r > 0 && w->err_fd >= 0 && (p[2].revents & (POLLIN | POLLHUP)))
            pump_stderr(w);
        if (atomic_load(&n->stopping))
            return END_STOP;
        if (r > 0 && (p[1].revents & POLLIN)) {
            while (waitpid(w->pid, status, 0) < 0 && errno == EINTR)
                ;
            return END_EXITED;
        }
        if (now_ms() >= next_probe) {
            if (!probe_once(w, &misses))
                return END_UNHEALTHY;
            next_probe = now_ms() + n->o.probe_interval_ms;
        }
    }
}

/* Sleeps ms, or less if the node stops; false when it stops. */
static bool backoff_sleep(worker *w, int64_t ms)
{
    int64_t deadline = now_ms() + ms;
    while (!atomic_load(&w->node->stopping)) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return true;
        struct pollfd p = {.fd = w->wake_fd, .events = POLLIN};
        poll(&p, 1, (int)left);
    }
    return false;
}

/* Decides what follows an ended process: false when it stays down. The
 * ended instance's ready time is taken here, where the restart decision
 * reads it (how long it stayed ready resets the backoff), and cleared: the
 * next instance starts not ready. */
static bool after_exit(worker *w, const char *why)
{
    pjs_node *n = w->node;
    int64_t ready_since = w->ready_since;
    w->ready_since = -1;
    char last[64];
    pthread_mutex_lock(&n->lock);
    snprintf(last, sizeof last, "%s", w->last_exit);
    pthread_mutex_unlock(&n->lock);
    int64_t delay = pjs_node_restart_next(&w->restart, now_ms(), ready_since);
    if (delay < 0) {
        pjs_error("worker %zu (%s) %s (%s); restart budget spent (%u restarts within %u s): "
                  "worker failed, not restarted; the node serves with the others",
                  w->id, w->device, why, last, w->restart.policy.max_restarts,
                  w->restart.policy.window_ms / 1000);
        set_state(w, PJS_NODE_FAILED);
        return false;
    }
    pthread_mutex_lock(&n->lock);
    w->restarts++;
    unsigned count = w->restarts;
    pthread_mutex_unlock(&n->lock);
    pjs_warn("worker %zu (%s) %s (%s); restart %u in %lld ms", w->id, w->device, why, last, count,
             (long long)delay);
    set_state(w, PJS_NODE_RESTARTING);
    return backoff_sleep(w, delay);
}

/* True when every worker failed (the node then has nothing to serve). */
static bool all_failed(pjs_node *n)
{
    bool all = true;
    pthread_mutex_lock(&n->lock);
    for (size_t i = 0; i < n->n_workers; i++)
        all = all && n->workers[i].state == PJS_NODE_FAILED;
    pthread_mutex_unlock(&n->lock);
    return all;
}

static void *supervise(void *arg)
{
    worker *w = arg;
    pjs_node *n = w->node;
    while (!atomic_load(&n->stopping)) {
        pjs_error err;
        if (spawn(w, &err) != 0) {
            pjs_error("worker %zu (%s): cannot start it: %s", w->id, w->device, err.msg);
            pthread_mutex_lock(&n->lock);
            snprintf(w->last_exit, sizeof w->last_exit, "not started");
            pthread_mutex_unlock(&n->lock);
            if (!after_exit(w, "was not started"))
                break;
            continue;
        }
        pjs_info("worker %zu (%s) started: pid %d", w->id, w->device, (int)w->pid);
        status_changed(n);
        if (w->restarts > 0 && n->o.restarted != NULL)
            n->o.restarted(n->o.ctx, w->id);
        int status = 0;
        instance_end end = watch(w, &status);
        if (end == END_STOP) {
            set_state(w, PJS_NODE_STOPPING);
            status = terminate(w, n->o.stop_timeout_ms);
            pid_t pid = w->pid;
            reap(w, status);
            char last[64];
            describe_exit(status, last, sizeof last);
            pjs_info("worker %zu (%s) pid %d stopped: %s", w->id, w->device, (int)pid, last);
            status_changed(n);
            break;
        }
        pid_t pid = w->pid;
        if (n->o.restarted != NULL) /* out of the routing before it is stopped or replaced */
            n->o.restarted(n->o.ctx, w->id);
        if (end == END_UNHEALTHY) {
            pjs_warn("worker %zu (%s) pid %d failed %u health probes in a row: killing it", w->id,
                     w->device, (int)pid, n->o.unhealthy_after);
            status = terminate(w, n->o.kill_grace_ms);
        }
        reap(w, status);
        if (end == END_EXITED && !w->ever_ready && WIFEXITED(status) && WEXITSTATUS(status) == 2) {
            pjs_error("worker %zu (%s) pid %d exited with status 2 before it served: its command "
                      "line was refused (its message is above); the node stops",
                      w->id, w->device, (int)pid);
            set_state(w, PJS_NODE_FAILED);
            atomic_store(&n->outcome, 2);
            break;
        }
        char why[64];
        snprintf(why, sizeof why, "pid %d %s", (int)pid,
                 end == END_UNHEALTHY ? "was killed as unhealthy" : "exited");
        if (!after_exit(w, why)) {
            if (w->state == PJS_NODE_FAILED && all_failed(n)) {
                pjs_error("every worker failed: the node stops");
                atomic_store(&n->outcome, 1);
            }
            break;
        }
    }
    return NULL;
}

/* ---- the node -------------------------------------------------------------------- */

static void free_strv(char **v)
{
    for (size_t i = 0; v != NULL && v[i] != NULL; i++)
        free(v[i]);
    free(v);
}

static char **copy_strv(char *const *v)
{
    size_t n = 0;
    while (v != NULL && v[n] != NULL)
        n++;
    char **out = calloc(n + 1, sizeof *out);
    for (size_t i = 0; out != NULL && i < n; i++)
        if ((out[i] = strdup(v[i])) == NULL) {
            free_strv(out);
            return NULL;
        }
    return out;
}

static void set_defaults(pjs_node_options *o)
{
    if (o->probe_interval_ms == 0)
        o->probe_interval_ms = 500;
    if (o->probe_timeout_ms == 0)
        o->probe_timeout_ms = 1000;
    if (o->unhealthy_after == 0)
        o->unhealthy_after = 3;
    if (o->kill_grace_ms == 0)
        o->kill_grace_ms = 2000;
    if (o->stop_timeout_ms == 0)
        o->stop_timeout_ms = 30000;
}

static int init_worker(pjs_node *n, size_t i, const pjs_node_worker_spec *s, pjs_error *err)
{
    worker *w = &n->workers[i];
    w->node = n;
    w->id = i;
    w->wake_fd = w->pidfd = w->err_fd = -1;
    w->ready_since = -1;
    snprintf(w->device, sizeof w->device, "%s", s->device);
    snprintf(w->probe_host, sizeof w->probe_host, "%s", s->probe_host);
    w->probe_port = s->probe_port;
    snprintf(w->grpc, sizeof w->grpc, "%s", s->grpc ? s->grpc : "");
    snprintf(w->http, sizeof w->http, "%s", s->http ? s->http : "");
    w->argv = copy_strv(s->argv);
    w->envp = make_env(s->env);
    w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pjs_node_restart_init(&w->restart, &n->o.restart);
    if (w->argv == NULL || w->envp == NULL || w->wake_fd < 0)
        return pjs_error_set(err, PJS_ERR_NOMEM, "worker %zu: out of memory or descriptors", i);
    return 0;
}

int pjs_node_start(const pjs_node_options *o, pjs_node **out, pjs_error *err)
{
    pjs_node *n = calloc(1, sizeof *n);
    if (n == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    n->o = *o;
    set_defaults(&n->o);
    snprintf(n->routing, sizeof n->routing, "%s", o->routing ? o->routing : "round_robin");
    n->status_name = o->status_name ? strdup(o->status_name) : NULL;
    n->o.workers = NULL;
    pthread_mutex_init(&n->lock, NULL);
    pthread_mutex_init(&n->file_lock, NULL);
    n->workers = calloc(o->n_workers, sizeof *n->workers);
    n->n_workers = o->n_workers;
    int rc = n->workers == NULL ? pjs_error_set(err, PJS_ERR_NOMEM, "out of memory") : 0;
    for (size_t i = 0; rc == 0 && i < o->n_workers; i++)
        rc = init_worker(n, i, &o->workers[i], err);
    if (rc == 0)
        status_changed(n);
    for (size_t i = 0; rc == 0 && i < o->n_workers; i++) {
        worker *w = &n->workers[i];
        if (pthread_create(&w->thread, NULL, supervise, w) != 0)
            rc = pjs_error_set(err, PJS_ERR_IO, "worker %zu: cannot start its thread", i);
        else {
            pjs_thread_name(w->thread, "pjs-supervise");
            w->thread_started = true;
        }
    }
    if (rc != 0) {
        pjs_node_destroy(n);
        return rc;
    }
    *out = n;
    return 0;
}

int pjs_node_run(pjs_node *n, const sigset_t *stop_signals, int *sig)
{
    const struct timespec tick = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
    for (;;) {
        int outcome = atomic_load(&n->outcome);
        if (outcome != 0)
            return outcome;
        int s = sigtimedwait(stop_signals, NULL, &tick);
        if (s > 0) {
            *sig = s;
            return 0;
        }
    }
}

void pjs_node_stop(pjs_node *n)
{
    if (n == NULL || n->stopped)
        return;
    n->stopped = true;
    atomic_store(&n->stopping, true);
    for (size_t i = 0; i < n->n_workers; i++) {
        uint64_t one = 1;
        if (n->workers[i].wake_fd >= 0 && write(n->workers[i].wake_fd, &one, sizeof one) < 0)
            pjs_warn("worker %zu: cannot wake its thread: %s", i, strerror(errno));
    }
    for (size_t i = 0; i < n->n_workers; i++)
        if (n->workers[i].thread_started) {
            pthread_join(n->workers[i].thread, NULL);
            n->workers[i].thread_started = false;
        }
}

void pjs_node_destroy(pjs_node *n)
{
    if (n == NULL)
        return;
    pjs_node_stop(n);
    for (size_t i = 0; n->workers != NULL && i < n->n_workers; i++) {
        worker *w = &n->workers[i];
        free_strv(w->argv);
        free_strv(w->envp);
        if (w->wake_fd >= 0)
            close(w->wake_fd);
        for (size_t k = 0; k < w->n_models; k++)
            free(w->models[k]);
        free(w->models);
    }
    free(n->workers);
    free(n->status_name);
    pthread_mutex_destroy(&n->lock);
    pthread_mutex_destroy(&n->file_lock);
    free(n);
}
