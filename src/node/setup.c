/*
 * setup.c - devices, ports, run directory and worker token of a node
 * (setup.h).
 *
 * The run directory is checked on its open descriptor (fstat), never by a
 * path looked up again after the check, and kept open: the node makes its
 * files there relative to that descriptor.
 */
#include "node/setup.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Longest `pjserve info` report read. */
#define INFO_MAX (64 * 1024)

/* Reads fd to its end into buf (size bytes, NUL-terminated). */
static size_t read_all(int fd, char *buf, size_t size)
{
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t r = read(fd, buf + n, size - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    return n;
}

/* The value after "key: " at the start of a line of text, copied into out. */
static int report_field(const char *text, const char *key, char *out, size_t size)
{
    size_t kl = strlen(key);
    for (const char *line = text; line != NULL && *line; line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        if (strncmp(line, key, kl) == 0 && line[kl] == ':' && line[kl + 1] == ' ') {
            const char *v = line + kl + 2;
            size_t len = strcspn(v, "\n");
            snprintf(out, size, "%.*s", (int)len, v);
            return 0;
        }
    }
    return -1;
}

int pjs_node_platform_probe(const char *exe, char *const *args, size_t n_args,
                            pjs_node_platform *out, pjs_error *err)
{
    char **argv = calloc(n_args + 3, sizeof *argv);
    if (argv == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    argv[0] = (char *)exe;
    argv[1] = "info";
    for (size_t i = 0; i < n_args; i++)
        argv[2 + i] = args[i];
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0) {
        free(argv);
        return pjs_error_set(err, PJS_ERR_IO, "pipe: %s", strerror(errno));
    }
    if (pipe2(err_pipe, O_CLOEXEC) != 0) {
        close(out_pipe[0]);
        close(out_pipe[1]);
        free(argv);
        return pjs_error_set(err, PJS_ERR_IO, "pipe: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out_pipe[1], STDOUT_FILENO);
        dup2(err_pipe[1], STDERR_FILENO);
        execv(exe, argv);
        _exit(127);
    }
    free(argv);
    close(out_pipe[1]);
    close(err_pipe[1]);
    static char report[INFO_MAX], errors[INFO_MAX];
    /* The report is small: the child never blocks on a full stdout pipe
     * while this reads its stderr after. */
    read_all(out_pipe[0], report, sizeof report);
    read_all(err_pipe[0], errors, sizeof errors);
    close(out_pipe[0]);
    close(err_pipe[0]);
    int status = 0;
    if (pid < 0)
        return pjs_error_set(err, PJS_ERR_IO, "fork: %s", strerror(errno));
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    char devices[32] = "";
    memset(out, 0, sizeof *out);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        report_field(report, "platform", out->name, sizeof out->name) != 0 ||
        report_field(report, "devices", devices, sizeof devices) != 0) {
        const char *why = strstr(errors, "pjserve: error: ");
        why = why ? why + strlen("pjserve: error: ") : errors;
        size_t len = strcspn(why, "\n");
        return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                             "cannot open the PJRT plugin to count its devices: %.*s",
                             (int)len, len ? why : "`pjserve info` failed");
    }
    out->devices = (size_t)strtoul(devices, NULL, 10);
    return 0;
}

const char *pjs_node_visible_devices_variable(const char *platform)
{
    if (strcmp(platform, "cuda") == 0 || strcmp(platform, "gpu") == 0)
        return "CUDA_VISIBLE_DEVICES";
    if (strcmp(platform, "rocm") == 0)
        return "HIP_VISIBLE_DEVICES";
    return NULL;
}

int pjs_node_parse_device_list(const char *list, char (*out)[32], size_t max, pjs_error *err)
{
    size_t n = 0;
    const char *p = list;
    for (;;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len > 31)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "'%s': expected device ids separated by commas, e.g. 0,1,3",
                                 list);
        for (size_t i = 0; i < len; i++) {
            char c = p[i];
            bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                      (c >= 'A' && c <= 'Z') || c == '-' || c == ':' || c == '.';
            if (!ok)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "'%s': a device id holds letters, digits, '-', ':' or "
                                     "'.' only",
                                     list);
        }
        if (n == max)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "'%s': at most %zu devices", list, max);
        for (size_t k = 0; k < n; k++)
            if (strlen(out[k]) == len && strncmp(out[k], p, len) == 0)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "'%s': device %.*s is listed twice", list, (int)len, p);
        snprintf(out[n++], 32, "%.*s", (int)len, p);
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    return (int)n;
}

/* Sockets held at most while picking: the ports wanted, and as many again
 * turned down for being in the avoid list (held, so they are not offered
 * again). */
#define FREE_PORT_SOCKETS (6 * PJS_NODE_MAX_WORKERS)

static bool is_avoided(int port, const int *avoid, size_t n_avoid)
{
    for (size_t i = 0; i < n_avoid; i++)
        if (avoid[i] == port)
            return true;
    return false;
}

int pjs_node_free_ports(int *ports, size_t n, const int *avoid, size_t n_avoid, pjs_error *err)
{
    int fds[FREE_PORT_SOCKETS];
    if (n > FREE_PORT_SOCKETS / 2)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "too many ports asked for");
    size_t opened = 0, picked = 0;
    int rc = 0;
    while (picked < n) {
        if (opened == FREE_PORT_SOCKETS) {
            rc = pjs_error_set(err, PJS_ERR_IO, "cannot pick %zu free ports on 127.0.0.1", n);
            break;
        }
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
            rc = pjs_error_set(err, PJS_ERR_IO, "cannot pick a free port on 127.0.0.1: %s",
                               strerror(errno));
            if (fd >= 0)
                close(fd);
            break;
        }
        fds[opened++] = fd;
        int port = ntohs(a.sin_port);
        if (!is_avoided(port, avoid, n_avoid))
            ports[picked++] = port;
    }
    for (size_t i = 0; i < opened; i++)
        close(fds[i]);
    return rc;
}

/* ---- the run directory ------------------------------------------------------ */

/* Checks the directory open on fd: a directory of this user's, closed to
 * group and others. */
static int check_private(int fd, const char *path, pjs_error *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return pjs_error_set(err, PJS_ERR_IO, "run directory %s: %s", path, strerror(errno));
    if (st.st_uid != geteuid())
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "run directory %s: belongs to uid %u, not to this user (uid %u), "
                             "who could read or replace the node's files there; name a "
                             "directory of this user's",
                             path, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & 0077) != 0)
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "run directory %s: mode %04o lets its group or others in; chmod "
                             "700 it",
                             path, (unsigned)(st.st_mode & 07777));
    return 0;
}

/* Checks the directory holding a given run directory: nobody but this user
 * (or root) may replace an entry in it, or a worker, which opens its files
 * by path, could be sent elsewhere. A world-writable directory with the
 * sticky bit (/tmp) is fine: others cannot rename or remove what is ours. */
static int check_parent(int fd, const char *path, pjs_error *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return pjs_error_set(err, PJS_ERR_IO, "run directory %s: %s", path, strerror(errno));
    bool others_may_replace = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 &&
                              (st.st_mode & S_ISVTX) == 0;
    if ((st.st_uid != geteuid() && st.st_uid != 0) || others_may_replace)
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "run directory %s: the directory holding it (uid %u, mode %04o) "
                             "lets others replace it; name one inside a directory only this "
                             "user can change",
                             path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    return 0;
}

/* Splits path into the directory holding it and its last component
 * (trailing slashes dropped); -1 when the last component is not a name. */
static int split_path(const char *path, char *parent, size_t parent_size, char *name,
                      size_t name_size)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t slash = len;
    while (slash > 0 && path[slash - 1] != '/')
        slash--;
    size_t name_len = len - slash;
    if (name_len == 0 || name_len >= name_size || slash >= parent_size)
        return -1;
    snprintf(name, name_size, "%.*s", (int)name_len, path + slash);
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return -1;
    if (slash == 0)
        snprintf(parent, parent_size, ".");
    else
        snprintf(parent, parent_size, "%.*s", slash == 1 ? 1 : (int)(slash - 1), path);
    return 0;
}

/* Opens the directory `name` in d->parent_fd without following a symbolic
 * link, and checks it is private. */
static int open_private(pjs_node_run_dir *d, pjs_error *err)
{
    d->fd = openat(d->parent_fd, d->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int open_errno = errno;
    struct stat link;
    /* With O_DIRECTORY a symbolic link fails as ENOTDIR: look at the entry. */
    if (d->fd < 0 && (open_errno == ELOOP || open_errno == ENOTDIR) &&
        fstatat(d->parent_fd, d->name, &link, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(link.st_mode))
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "run directory %s: a symbolic link, which the node does not "
                             "follow; name the directory itself",
                             d->path);
    if (d->fd < 0)
        return pjs_error_set(err, PJS_ERR_IO, "run directory %s: %s", d->path,
                             open_errno == ENOTDIR ? "exists and is not a directory"
                                                   : strerror(open_errno));
    if (d->created && fchmod(d->fd, 0700) != 0)
        return pjs_error_set(err, PJS_ERR_IO, "run directory %s: chmod: %s", d->path,
                             strerror(errno));
    return check_private(d->fd, d->path, err);
}

/* Where a default run directory is made: $XDG_RUNTIME_DIR when it is this
 * user's with mode 0700, else /tmp. Returns its descriptor. */
static int default_base(const char **base)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg != NULL && xdg[0] == '/') {
        int fd = open(xdg, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == geteuid() &&
            (st.st_mode & 0777) == 0700) {
            *base = xdg;
            return fd;
        }
        if (fd >= 0)
            close(fd);
    }
    *base = "/tmp";
    return open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* A fresh directory with a name nobody can plant first (mkdtemp: mode
 * 0700, made new or not at all). */
static int create_default(pjs_node_run_dir *d, pjs_error *err)
{
    const char *base;
    d->parent_fd = default_base(&base);
    if (d->parent_fd < 0)
        return pjs_error_set(err, PJS_ERR_IO, "run directory: cannot open %s: %s", base,
                             strerror(errno));
    int n = snprintf(d->path, sizeof d->path, "%s/pjserve-node-XXXXXX", base);
    if (n < 0 || (size_t)n >= sizeof d->path)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "run directory path too long");
    if (mkdtemp(d->path) == NULL)
        return pjs_error_set(err, PJS_ERR_IO, "run directory: cannot make one under %s: %s",
                             base, strerror(errno));
    d->created = true;
    snprintf(d->name, sizeof d->name, "%s", strrchr(d->path, '/') + 1);
    return open_private(d, err);
}

static int open_given(const char *given, pjs_node_run_dir *d, pjs_error *err)
{
    char parent[sizeof d->path];
    int n = snprintf(d->path, sizeof d->path, "%s", given);
    if (n < 0 || (size_t)n >= sizeof d->path)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "run directory path too long");
    if (split_path(given, parent, sizeof parent, d->name, sizeof d->name) != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "run directory %s: expected a path ending in a directory name",
                             given);
    d->parent_fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->parent_fd < 0)
        return pjs_error_set(err, PJS_ERR_IO, "run directory %s: cannot open %s: %s", given,
                             parent, strerror(errno));
    int rc = check_parent(d->parent_fd, given, err);
    if (rc != 0)
        return rc;
    if (mkdirat(d->parent_fd, d->name, 0700) == 0)
        d->created = true;
    else if (errno != EEXIST)
        return pjs_error_set(err, PJS_ERR_IO, "run directory %s: cannot create it: %s", given,
                             strerror(errno));
    return open_private(d, err);
}

int pjs_node_run_dir_create(const char *given, pjs_node_run_dir *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    out->fd = out->parent_fd = -1;
    int rc = given != NULL ? open_given(given, out, err) : create_default(out, err);
    if (rc != 0)
        pjs_node_run_dir_close(out);
    return rc;
}

void pjs_node_worker_socket_name(char *buf, size_t size, size_t worker, const char *kind)
{
    snprintf(buf, size, "worker-%zu.%s", worker, kind);
}

void pjs_node_run_dir_close(pjs_node_run_dir *d)
{
    static const char *const files[] = {PJS_NODE_STATUS_NAME, PJS_NODE_STATUS_TMP_NAME,
                                        PJS_NODE_TOKEN_NAME};
    static const char *const socket_kinds[] = {"grpc", "http", "metrics"};
    if (d->fd >= 0) {
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
            (void)unlinkat(d->fd, files[i], 0);
        for (size_t w = 0; w < PJS_NODE_MAX_WORKERS; w++)
            for (size_t k = 0; k < sizeof socket_kinds / sizeof socket_kinds[0]; k++) {
                char name[64];
                pjs_node_worker_socket_name(name, sizeof name, w, socket_kinds[k]);
                (void)unlinkat(d->fd, name, 0);
            }
        close(d->fd);
    }
    if (d->created && d->parent_fd >= 0)
        (void)unlinkat(d->parent_fd, d->name, AT_REMOVEDIR);
    if (d->parent_fd >= 0)
        close(d->parent_fd);
    d->fd = d->parent_fd = -1;
    d->created = false;
}

int pjs_node_write_token(int dir_fd, const char *name, char token[65], pjs_error *err)
{
    unsigned char raw[32];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return pjs_error_set(err, PJS_ERR_IO, "getrandom: %s", strerror(errno));
        got += (size_t)r;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(token + 2 * i, 3, "%02x", raw[i]);
    (void)unlinkat(dir_fd, name, 0);
    int fd = openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return pjs_error_set(err, PJS_ERR_IO, "%s: %s", name, strerror(errno));
    char line[66];
    snprintf(line, sizeof line, "%s\n", token);
    bool ok = write(fd, line, 65) == 65;
    ok = close(fd) == 0 && ok;
    if (!ok)
        return pjs_error_set(err, PJS_ERR_IO, "%s: cannot write the worker token", name);
    return 0;
}
