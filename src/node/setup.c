/*
 * setup.c - devices, ports, run directory and worker token of a node
 * (setup.h).
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

int pjs_node_run_dir_create(const char *given, char *out, size_t size, int *created,
                            pjs_error *err)
{
    const char *base = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (base == NULL || base[0] == '\0' || stat(base, &st) != 0 || !S_ISDIR(st.st_mode))
        base = "/tmp";
    int n = given ? snprintf(out, size, "%s", given)
                  : snprintf(out, size, "%s/pjserve-node-%d", base, (int)getpid());
    if (n < 0 || (size_t)n >= size)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "run directory path too long");
    *created = 0;
    if (mkdir(out, 0700) == 0) {
        *created = 1;
        return 0;
    }
    if (errno == EEXIST && stat(out, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (st.st_uid != getuid() || (st.st_mode & 0077) != 0)
            return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                                 "run directory %s: must belong to this user and be closed to "
                                 "group and others (chmod 700)",
                                 out);
        return 0;
    }
    return pjs_error_set(err, PJS_ERR_IO, "run directory %s: %s", out,
                         errno == EEXIST ? "exists and is not a directory" : strerror(errno));
}

int pjs_node_write_token(const char *path, char token[65], pjs_error *err)
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
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return pjs_error_set(err, PJS_ERR_IO, "%s: %s", path, strerror(errno));
    char line[66];
    snprintf(line, sizeof line, "%s\n", token);
    bool ok = write(fd, line, 65) == 65;
    ok = close(fd) == 0 && ok;
    if (!ok)
        return pjs_error_set(err, PJS_ERR_IO, "%s: cannot write the worker token", path);
    return 0;
}

char *pjs_node_read_token(const char *path)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return NULL;
    char line[4097];
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    if (got == NULL)
        return NULL;
    line[strcspn(line, "\r\n")] = '\0';
    return line[0] ? strdup(line) : NULL;
}
