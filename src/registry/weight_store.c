/*
 * weight_store.c - the shared host weight store (see weight_store.h for the
 * format, the locking protocol and the guarantees).
 *
 * Every file operation goes through the directory's descriptor (openat,
 * renameat2, unlinkat) with O_NOFOLLOW, so a path swapped under us cannot send
 * a segment elsewhere. The directory lock is taken through a descriptor
 * opened for that one step: flock locks belong to an open file description,
 * so two threads of one worker exclude each other as two workers do.
 */
#include "registry/weight_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/log.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

/* The header's fixed part; one entry per weight follows it. */
#define HEADER_FIXED 64u
#define ENTRY_BYTES 24u
/* The header is rounded to this, and so is the file. */
#define SEGMENT_PAGE 4096u
/* Most weights a segment describes (keeps the header's size arithmetic in range). */
#define MAX_TENSORS ((size_t)1 << 24)
/* Attach or create attempts before the store gives up on a model. */
#define MAX_ATTEMPTS 16

#define LOCK_NAME ".lock"
#define SEGMENT_SUFFIX ".weights"
#define CREATING_SUFFIX ".creating"

struct pjs_wstore {
    int dirfd;           /* O_DIRECTORY, close-on-exec */
    char dir[PATH_MAX];
    mode_t mode;         /* of segments and the lock file */
    gid_t gid;           /* (gid_t)-1: no group configured */
};

struct pjs_wstore_segment {
    pjs_wstore_layout layout;
    pjs_wstore_tensor *tensors; /* owned copy; names and shapes borrowed */
    int fd;                     /* holds the shared lock while mapped */
    unsigned char *base;        /* read-only mapping of layout.total_bytes */
    char path[PATH_MAX + 32];
};

/* ---- the format ---------------------------------------------------------- */

static uint64_t round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

static void sum_u64(pjs_checksum *c, uint64_t v)
{
    pjs_checksum_update(c, &v, sizeof v);
}

/* The content key: layout and checksums of every weight. The checksum is
 * taken in the machine's byte order, which every worker of a node shares. */
static uint64_t content_key(const pjs_wstore_tensor *t, size_t n)
{
    static const char tag[] = "pjserve shared weights";
    pjs_checksum c;
    pjs_checksum_init(&c);
    pjs_checksum_update(&c, tag, sizeof tag);
    sum_u64(&c, PJS_WSTORE_VERSION);
    sum_u64(&c, n);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(t[i].name);
        sum_u64(&c, len);
        pjs_checksum_update(&c, t[i].name, len);
        sum_u64(&c, (uint64_t)t[i].dtype);
        sum_u64(&c, (uint64_t)t[i].shape->rank);
        for (int d = 0; d < t[i].shape->rank; d++)
            sum_u64(&c, (uint64_t)t[i].shape->dims[d]);
        sum_u64(&c, t[i].nbytes);
        sum_u64(&c, t[i].sum);
    }
    return pjs_checksum_final(&c);
}

int pjs_wstore_layout_init(pjs_wstore_layout *l, const pjs_wstore_tensor *t, size_t n,
                           pjs_error *err)
{
    memset(l, 0, sizeof *l);
    if (n > MAX_TENSORS)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "%zu weights: the shared weight store takes at most %zu", n,
                             MAX_TENSORS);
    l->offsets = calloc(n + 1, sizeof *l->offsets);
    if (l->offsets == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    l->n = n;
    l->tensors = t;
    l->key = content_key(t, n);
    l->header_bytes = round_up(HEADER_FIXED + (uint64_t)ENTRY_BYTES * n, SEGMENT_PAGE);
    uint64_t at = l->header_bytes;
    for (size_t i = 0; i < n; i++) {
        if (t[i].nbytes > UINT64_MAX / 2 - at) {
            pjs_wstore_layout_free(l);
            return pjs_error_set(err, PJS_ERR_UNSUPPORTED, "weight \"%s\": too large", t[i].name);
        }
        l->offsets[i] = at;
        at = round_up(at + t[i].nbytes, PJS_WSTORE_ALIGN);
    }
    l->total_bytes = round_up(at, SEGMENT_PAGE);
    if (l->total_bytes > (uint64_t)SIZE_MAX / 2) {
        pjs_wstore_layout_free(l);
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED, "weights too large to map");
    }
    return 0;
}

void pjs_wstore_layout_free(pjs_wstore_layout *l)
{
    free(l->offsets);
    l->offsets = NULL;
}

void pjs_wstore_segment_name(uint64_t key, char out[32])
{
    snprintf(out, 32, "%016llx" SEGMENT_SUFFIX, (unsigned long long)key);
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, sizeof v);
}

/* The checksum of a header of `bytes` bytes, its own sum field (at 40)
 * counted as zero. */
static uint64_t header_sum(const unsigned char *h, uint64_t bytes)
{
    static const unsigned char zero[8] = {0};
    pjs_checksum c;
    pjs_checksum_init(&c);
    pjs_checksum_update(&c, h, 40);
    pjs_checksum_update(&c, zero, sizeof zero);
    pjs_checksum_update(&c, h + 48, (size_t)(bytes - 48));
    return pjs_checksum_final(&c);
}

void pjs_wstore_header_write(const pjs_wstore_layout *l, void *hdr)
{
    unsigned char *h = hdr;
    memset(h, 0, (size_t)l->header_bytes);
    memcpy(h, PJS_WSTORE_MAGIC, 8);
    uint32_t version = PJS_WSTORE_VERSION;
    memcpy(h + 8, &version, sizeof version);
    put_u64(h + 16, l->header_bytes);
    put_u64(h + 24, l->total_bytes);
    put_u64(h + 32, l->key);
    put_u64(h + 48, l->n);
    for (size_t i = 0; i < l->n; i++) {
        unsigned char *e = h + HEADER_FIXED + ENTRY_BYTES * i;
        put_u64(e, l->offsets[i]);
        put_u64(e + 8, l->tensors[i].nbytes);
        put_u64(e + 16, l->tensors[i].sum);
    }
    put_u64(h + 40, header_sum(h, l->header_bytes));
}

int pjs_wstore_header_check(const pjs_wstore_layout *l, const void *seg, size_t size,
                            pjs_error *err)
{
    const unsigned char *h = seg;
    if (size != l->total_bytes)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "its size is %zu bytes, not %llu",
                             size, (unsigned long long)l->total_bytes);
    if (size < HEADER_FIXED || memcmp(h, PJS_WSTORE_MAGIC, 8) != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "it does not start with the magic " PJS_WSTORE_MAGIC);
    uint32_t version;
    memcpy(&version, h + 8, sizeof version);
    if (version != PJS_WSTORE_VERSION)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "format version %u, not %u", version,
                             PJS_WSTORE_VERSION);
    if (get_u64(h + 16) != l->header_bytes || get_u64(h + 24) != l->total_bytes ||
        get_u64(h + 48) != l->n)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "its header describes %llu weights in %llu bytes (header %llu), "
                             "not %zu in %llu (header %llu)",
                             (unsigned long long)get_u64(h + 48),
                             (unsigned long long)get_u64(h + 24),
                             (unsigned long long)get_u64(h + 16), l->n,
                             (unsigned long long)l->total_bytes,
                             (unsigned long long)l->header_bytes);
    if (get_u64(h + 32) != l->key)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "its header names the content key %016llx, not %016llx",
                             (unsigned long long)get_u64(h + 32), (unsigned long long)l->key);
    if (get_u64(h + 40) != header_sum(h, l->header_bytes))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "its header checksum does not match");
    for (size_t i = 0; i < l->n; i++) {
        const unsigned char *e = h + HEADER_FIXED + ENTRY_BYTES * i;
        if (get_u64(e) != l->offsets[i] || get_u64(e + 8) != l->tensors[i].nbytes ||
            get_u64(e + 16) != l->tensors[i].sum)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "its header entry for weight \"%s\" differs", l->tensors[i].name);
    }
    return 0;
}

int pjs_wstore_data_check(const pjs_wstore_layout *l, const void *seg, pjs_error *err)
{
    const unsigned char *base = seg;
    for (size_t i = 0; i < l->n; i++) {
        const pjs_wstore_tensor *t = &l->tensors[i];
        if (pjs_checksum_of(base + l->offsets[i], (size_t)t->nbytes) != t->sum)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "weight \"%s\" holds other bytes than the weights file", t->name);
    }
    return 0;
}

/* ---- the directory --------------------------------------------------------- */

static bool has_suffix(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcmp(name + n - k, suffix) == 0;
}

/* KEY.weights or .KEY.creating: the files the store makes (and sweeps). */
static bool is_store_file(const char *name)
{
    size_t n = strlen(name);
    if (n == 16 + strlen(SEGMENT_SUFFIX) && has_suffix(name, SEGMENT_SUFFIX))
        return strspn(name, "0123456789abcdef") == 16;
    if (n == 17 + strlen(CREATING_SUFFIX) && name[0] == '.' && has_suffix(name, CREATING_SUFFIX))
        return strspn(name + 1, "0123456789abcdef") == 16;
    return false;
}

static int lock_fd(int fd, int how)
{
    int rc;
    while ((rc = flock(fd, how)) != 0 && errno == EINTR)
        ;
    return rc;
}

/* Gives a file the store's mode and group (when this process owns it). */
static void set_mode(const pjs_wstore *s, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid())
        return;
    if (s->gid != (gid_t)-1 && st.st_gid != s->gid && fchown(fd, (uid_t)-1, s->gid) != 0)
        pjs_warn("shared weights: cannot give a file in %s to group %u: %s", s->dir,
                 (unsigned)s->gid, strerror(errno));
    if ((st.st_mode & 07777) != s->mode)
        (void)fchmod(fd, s->mode);
}

/* Takes the directory lock (LOCK_SH or LOCK_EX): returns its descriptor, to
 * close when done, or -1 with err set. */
static int dir_lock(const pjs_wstore *s, int how, pjs_error *err)
{
    /* Read-only is enough to flock, so a group may share a lock file its
     * members cannot write. */
    int fd = openat(s->dirfd, LOCK_NAME, O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, s->mode);
    if (fd < 0) {
        pjs_error_set(err, PJS_ERR_UNAVAILABLE, "shared weights: cannot open %s/" LOCK_NAME ": %s",
                      s->dir, strerror(errno));
        return -1;
    }
    set_mode(s, fd);
    if (lock_fd(fd, how) != 0) {
        pjs_error_set(err, PJS_ERR_UNAVAILABLE, "shared weights: cannot lock %s/" LOCK_NAME ": %s",
                      s->dir, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Removes what nobody holds; the directory lock is held exclusively. */
static int sweep_locked(int dirfd, const char *dir)
{
    /* A descriptor of its own: a dup() would share dirfd's read position. */
    int list_fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = list_fd >= 0 ? fdopendir(list_fd) : NULL;
    if (d == NULL) {
        if (list_fd >= 0)
            close(list_fd);
        return -1;
    }
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_store_file(e->d_name))
            continue;
        int fd = openat(dirfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && lock_fd(fd, LOCK_EX | LOCK_NB) == 0 &&
            unlinkat(dirfd, e->d_name, 0) == 0) {
            removed++;
            pjs_info("shared weights: removed %s/%s (%.1f MiB): no worker maps it", dir,
                     e->d_name, (double)st.st_size / (1 << 20));
        }
        close(fd);
    }
    closedir(d);
    return removed;
}

static int sweep(const pjs_wstore *s, pjs_error *err)
{
    int lk = dir_lock(s, LOCK_EX, err);
    if (lk < 0)
        return err->code;
    int removed = sweep_locked(s->dirfd, s->dir);
    close(lk);
    if (removed < 0)
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "shared weights: cannot list %s: %s",
                             s->dir, strerror(errno));
    return removed;
}

static int resolve_group(const char *group, gid_t *out, pjs_error *err)
{
    char *end;
    unsigned long v = strtoul(group, &end, 10);
    if (*group != '\0' && *end == '\0' && v < (unsigned long)(gid_t)-1) {
        *out = (gid_t)v;
        return 0;
    }
    char buf[16384];
    struct group gr, *found = NULL;
    if (getgrnam_r(group, &gr, buf, sizeof buf, &found) != 0 || found == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--shared-weights-group %s: no such group (name one from "
                             "/etc/group, or a number)",
                             group);
    *out = gr.gr_gid;
    return 0;
}

/* Opens dir, creating it when missing, and checks who may write it. */
static int open_dir(pjs_wstore *s, pjs_error *err)
{
    bool group = s->gid != (gid_t)-1;
    s->dirfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (s->dirfd < 0 && errno == ENOENT) {
        if (mkdir(s->dir, 0700) != 0 && errno != EEXIST)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "--shared-weights %s: cannot create it: %s", s->dir,
                                 strerror(errno));
        s->dirfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (s->dirfd >= 0 && fstat(s->dirfd, &st) == 0 && st.st_uid == geteuid() && group &&
            (fchown(s->dirfd, (uid_t)-1, s->gid) != 0 || fchmod(s->dirfd, 02770) != 0))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "--shared-weights %s: cannot give it to group %u: %s", s->dir,
                                 (unsigned)s->gid, strerror(errno));
    }
    if (s->dirfd < 0) {
        int open_errno = errno;
        struct stat link;
        /* With O_DIRECTORY a symbolic link fails as ENOTDIR: look at the entry. */
        if (lstat(s->dir, &link) == 0 && S_ISLNK(link.st_mode))
            return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                                 "--shared-weights %s: a symbolic link, which is not followed "
                                 "(whoever made it chose where segments go); name the "
                                 "directory itself",
                                 s->dir);
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--shared-weights %s: cannot open it as a directory: %s", s->dir,
                             strerror(open_errno));
    }
    struct stat st;
    struct statfs fs;
    if (fstat(s->dirfd, &st) != 0 || fstatfs(s->dirfd, &fs) != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "--shared-weights %s: %s", s->dir,
                             strerror(errno));
    if (fs.f_type != TMPFS_MAGIC)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--shared-weights %s: not on a tmpfs (a segment there would be "
                             "written to disk); name a directory under /dev/shm or another "
                             "tmpfs mount",
                             s->dir);
    if (st.st_mode & S_IWOTH)
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "--shared-weights %s: writable by others, who could plant weights; "
                             "chmod o-w it",
                             s->dir);
    if (!group && st.st_uid != geteuid())
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "--shared-weights %s: owned by uid %u, not by this user (%u), "
                             "who may have made it first where anyone can (such as /dev/shm); "
                             "name a directory of this user's, share it through "
                             "--shared-weights-group, or let `pjserve node --shared-weights "
                             "auto` make a private one",
                             s->dir, (unsigned)st.st_uid, (unsigned)geteuid());
    if (!group && (st.st_mode & S_IWGRP))
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "--shared-weights %s: writable by its group; chmod g-w it, or name "
                             "the group with --shared-weights-group",
                             s->dir);
    if (group && st.st_gid != s->gid)
        return pjs_error_set(err, PJS_ERR_PERMISSION_DENIED,
                             "--shared-weights %s: belongs to group %u, not the configured group "
                             "%u; chgrp it",
                             s->dir, (unsigned)st.st_gid, (unsigned)s->gid);
    return 0;
}

int pjs_wstore_open(const pjs_wstore_options *o, pjs_wstore **out, pjs_error *err)
{
    if (o->dir == NULL || o->dir[0] == '\0' || strlen(o->dir) >= PATH_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--shared-weights: expected a directory on a tmpfs");
    pjs_wstore *s = calloc(1, sizeof *s);
    if (s == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    snprintf(s->dir, sizeof s->dir, "%s", o->dir);
    s->dirfd = -1;
    s->gid = (gid_t)-1;
    s->mode = 0600;
    int rc = 0;
    if (o->group != NULL) {
        rc = resolve_group(o->group, &s->gid, err);
        s->mode = 0660;
    }
    if (rc == 0)
        rc = open_dir(s, err);
    if (rc == 0) {
        int removed = sweep(s, err);
        rc = removed < 0 ? removed : 0;
    }
    if (rc != 0) {
        pjs_wstore_close(s);
        return rc;
    }
    pjs_info("shared weights: host weights shared through %s (mode %04o%s%s)", s->dir,
             (unsigned)s->mode, o->group != NULL ? ", group " : "",
             o->group != NULL ? o->group : "");
    *out = s;
    return 0;
}

void pjs_wstore_close(pjs_wstore *s)
{
    if (s == NULL)
        return;
    if (s->dirfd >= 0)
        close(s->dirfd);
    free(s);
}

const char *pjs_wstore_dir(const pjs_wstore *s)
{
    return s->dir;
}

int pjs_wstore_dir_make_private(const char *base, char *out, size_t size, pjs_error *err)
{
    int n = snprintf(out, size, "%s/pjserve-weights-XXXXXX", base);
    if (n < 0 || (size_t)n >= size)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "--shared-weights: path too long");
    if (mkdtemp(out) == NULL)
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                             "--shared-weights auto: cannot make a directory under %s: %s; "
                             "name a DIR on a tmpfs instead",
                             base, strerror(errno));
    return 0;
}

void pjs_wstore_dir_remove(const char *dir)
{
    pjs_error err;
    if (pjs_wstore_sweep_dir(dir, &err) < 0)
        pjs_warn("%s", err.msg);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        (void)unlinkat(fd, LOCK_NAME, 0);
        close(fd);
    }
    if (rmdir(dir) != 0 && errno != ENOENT)
        pjs_warn("shared weights: cannot remove %s: %s", dir, strerror(errno));
}

int pjs_wstore_sweep_dir(const char *dir, pjs_error *err)
{
    pjs_wstore s = {.gid = (gid_t)-1, .mode = 0600};
    snprintf(s.dir, sizeof s.dir, "%s", dir);
    s.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (s.dirfd < 0 || fstat(s.dirfd, &st) != 0) {
        int rc = pjs_error_set(err, PJS_ERR_NOT_FOUND, "shared weights: cannot open %s: %s",
                               dir, strerror(errno));
        if (s.dirfd >= 0)
            close(s.dirfd);
        return rc;
    }
    if (st.st_mode & S_IWGRP) { /* a group's directory: keep the lock file the group's */
        s.mode = 0660;
        s.gid = st.st_gid;
    }
    int rc = sweep(&s, err);
    close(s.dirfd);
    return rc;
}

/* ---- attach, create, release ------------------------------------------------ */

/* What one attach or create attempt came to. */
enum attempt {
    ATTACHED,   /* *seg maps a checked segment */
    ABSENT,     /* no segment of that name */
    REFUSED,    /* there was one, it failed its checks and is gone */
    BUSY,       /* another worker is creating it */
    LOST_RACE,  /* another worker published it first */
};

static void segment_free(pjs_wstore_segment *seg)
{
    if (seg == NULL)
        return;
    if (seg->base != NULL)
        munmap(seg->base, (size_t)seg->layout.total_bytes);
    if (seg->fd >= 0)
        close(seg->fd);
    pjs_wstore_layout_free(&seg->layout);
    free(seg->tensors);
    free(seg);
}

static pjs_wstore_segment *segment_new(const pjs_wstore *s, const pjs_wstore_tensor *t, size_t n,
                                       pjs_error *err)
{
    pjs_wstore_segment *seg = calloc(1, sizeof *seg);
    if (seg == NULL || (seg->tensors = calloc(n + 1, sizeof *t)) == NULL) {
        free(seg);
        pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    seg->fd = -1;
    memcpy(seg->tensors, t, n * sizeof *t);
    if (pjs_wstore_layout_init(&seg->layout, seg->tensors, n, err) != 0) {
        segment_free(seg);
        return NULL;
    }
    char name[32];
    pjs_wstore_segment_name(seg->layout.key, name);
    snprintf(seg->path, sizeof seg->path, "%s/%s", s->dir, name);
    return seg;
}

/* Unlinks `name` if it is still the file open as fd (directory lock held
 * exclusively, so nobody publishes meanwhile). */
static void unlink_if_same(const pjs_wstore *s, const char *name, int fd)
{
    struct stat mine, now;
    if (fstat(fd, &mine) == 0 && fstatat(s->dirfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
        mine.st_dev == now.st_dev && mine.st_ino == now.st_ino)
        (void)unlinkat(s->dirfd, name, 0);
}

/* Maps and checks the published segment; refuses (and removes) a bad one. */
static int try_attach(const pjs_wstore *s, const char *model, const char *name,
                      pjs_wstore_segment *seg, enum attempt *out, pjs_error *err)
{
    int lk = dir_lock(s, LOCK_SH, err);
    if (lk < 0)
        return err->code;
    int fd = openat(s->dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    int open_errno = errno;
    int locked = fd >= 0 ? lock_fd(fd, LOCK_SH) : -1;
    close(lk);
    if (fd < 0) {
        if (open_errno == ENOENT) {
            *out = ABSENT;
            return 0;
        }
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "shared weights: cannot open %s: %s",
                             seg->path, strerror(open_errno));
    }
    if (locked != 0) {
        close(fd);
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "shared weights: cannot lock %s: %s",
                             seg->path, strerror(errno));
    }
    pjs_error why = {0};
    struct stat st;
    void *base = MAP_FAILED;
    int bad = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        bad = pjs_error_set(&why, PJS_ERR_INVALID_ARGUMENT, "it is not a regular file");
    else if ((uint64_t)st.st_size != seg->layout.total_bytes)
        bad = pjs_error_set(&why, PJS_ERR_INVALID_ARGUMENT, "its size is %lld bytes, not %llu",
                            (long long)st.st_size, (unsigned long long)seg->layout.total_bytes);
    else if ((base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
        bad = pjs_error_set(&why, PJS_ERR_INVALID_ARGUMENT, "it cannot be mapped: %s",
                            strerror(errno));
    else if ((bad = pjs_wstore_header_check(&seg->layout, base, (size_t)st.st_size, &why)) == 0)
        bad = pjs_wstore_data_check(&seg->layout, base, &why);
    if (bad == 0) {
        seg->fd = fd;
        seg->base = base;
        *out = ATTACHED;
        return 0;
    }
    pjs_warn("model %s: shared weights segment %s refused: %s; it is removed and a fresh copy "
             "made from the weights file",
             model, seg->path, why.msg);
    if (base != MAP_FAILED)
        munmap(base, (size_t)st.st_size);
    int ex = dir_lock(s, LOCK_EX, err);
    if (ex >= 0) {
        unlink_if_same(s, name, fd);
        close(ex);
    }
    close(fd);
    *out = REFUSED;
    return ex < 0 ? err->code : 0;
}

/* Fills the exclusively locked temporary fd and writes its header. */
static int fill_segment(const pjs_wstore *s, pjs_wstore_segment *seg, int fd,
                        pjs_wstore_fill_fn fill, void *ctx, pjs_error *err)
{
    const pjs_wstore_layout *l = &seg->layout;
    int e = posix_fallocate(fd, 0, (off_t)l->total_bytes);
    if (e != 0)
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                             "shared weights: no room for %.1f MiB in %s: %s (see df %s; a "
                             "tmpfs grows to its size= mount option)",
                             (double)l->total_bytes / (1 << 20), s->dir, strerror(e), s->dir);
    unsigned char *base =
        mmap(NULL, (size_t)l->total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "shared weights: cannot map %s: %s",
                             seg->path, strerror(errno));
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < l->n; i++)
        rc = fill(ctx, i, base + l->offsets[i], err);
    if (rc == 0) {
        pjs_wstore_header_write(l, base);
        if (mprotect(base, (size_t)l->total_bytes, PROT_READ) != 0)
            rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE, "shared weights: mprotect: %s",
                               strerror(errno));
    }
    if (rc != 0) {
        munmap(base, (size_t)l->total_bytes);
        return rc;
    }
    seg->base = base;
    return 0;
}

/* Creates, fills and publishes the segment under `name`. */
static int try_create(const pjs_wstore *s, const char *name, pjs_wstore_segment *seg,
                      pjs_wstore_fill_fn fill, void *ctx, enum attempt *out, pjs_error *err)
{
    char tmp[40];
    snprintf(tmp, sizeof tmp, ".%.16s" CREATING_SUFFIX, name);
    int lk = dir_lock(s, LOCK_SH, err);
    if (lk < 0)
        return err->code;
    int fd = openat(s->dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, s->mode);
    int open_errno = errno;
    if (fd >= 0 && lock_fd(fd, LOCK_EX) != 0) {
        open_errno = errno;
        (void)unlinkat(s->dirfd, tmp, 0);
        close(fd);
        fd = -1;
    }
    /* The temporary's name is free again once its creator has published, so
     * a late racer gets here after the segment exists: attach, do not fill. */
    if (fd >= 0 && faccessat(s->dirfd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
        (void)unlinkat(s->dirfd, tmp, 0);
        close(fd);
        close(lk);
        *out = LOST_RACE;
        return 0;
    }
    close(lk);
    if (fd < 0 && open_errno == EEXIST) {
        *out = BUSY;
        return 0;
    }
    if (fd < 0)
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "shared weights: cannot create %s/%s: %s",
                             s->dir, tmp, strerror(open_errno));
    set_mode(s, fd);
    int rc = fill_segment(s, seg, fd, fill, ctx, err);
    if (rc == 0 && (lk = dir_lock(s, LOCK_SH, err)) < 0)
        rc = err->code;
    if (rc == 0) {
        /* A rename, not a link: the creator's own mapping then carries the
         * final name too (/proc/PID/maps). */
        if (renameat2(s->dirfd, tmp, s->dirfd, name, RENAME_NOREPLACE) == 0) {
            lock_fd(fd, LOCK_SH); /* from exclusive; the directory lock covers the gap */
            seg->fd = fd;
            *out = ATTACHED;
        } else {
            int rename_errno = errno;
            (void)unlinkat(s->dirfd, tmp, 0);
            if (rename_errno == EEXIST)
                *out = LOST_RACE;
            else
                rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                                   "shared weights: cannot publish %s: %s", seg->path,
                                   strerror(rename_errno));
        }
        close(lk);
    } else {
        (void)unlinkat(s->dirfd, tmp, 0); /* still ours: we hold it exclusively */
    }
    if (seg->fd != fd) {
        if (seg->base != NULL)
            munmap(seg->base, (size_t)seg->layout.total_bytes);
        seg->base = NULL;
        close(fd);
    }
    return rc;
}

/* Waits until the worker creating `name` has published it or died. */
static void wait_for_creator(const pjs_wstore *s, const char *model, const char *name)
{
    char tmp[40];
    snprintf(tmp, sizeof tmp, ".%.16s" CREATING_SUFFIX, name);
    int fd = openat(s->dirfd, tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    if (lock_fd(fd, LOCK_SH | LOCK_NB) != 0) {
        pjs_info("model %s: waiting for another worker to finish writing %s/%s", model, s->dir,
                 name);
        lock_fd(fd, LOCK_SH);
    }
    close(fd);
}

int pjs_wstore_acquire(pjs_wstore *s, const char *model, const pjs_wstore_tensor *t, size_t n,
                       pjs_wstore_fill_fn fill, void *ctx, pjs_wstore_segment **out,
                       pjs_error *err)
{
    pjs_wstore_segment *seg = segment_new(s, t, n, err);
    if (seg == NULL)
        return err->code;
    char name[32];
    pjs_wstore_segment_name(seg->layout.key, name);
    enum attempt at = ABSENT;
    int rc = 0;
    bool created = false;
    for (int tries = 0; rc == 0 && tries < MAX_ATTEMPTS; tries++) {
        if ((rc = try_attach(s, model, name, seg, &at, err)) != 0 || at == ATTACHED)
            break;
        if ((rc = try_create(s, name, seg, fill, ctx, &at, err)) != 0 || at == ATTACHED) {
            created = at == ATTACHED;
            break;
        }
        if (at == BUSY) {
            wait_for_creator(s, model, name);
            /* A creator that died left its temporary: the sweep removes it. */
            int removed = sweep(s, err);
            rc = removed < 0 ? removed : 0;
        }
    }
    if (rc == 0 && at != ATTACHED)
        rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                           "shared weights: %s neither attached nor created after %d attempts",
                           seg->path, MAX_ATTEMPTS);
    if (rc != 0) {
        segment_free(seg);
        return rc;
    }
    pjs_info("model %s: host weights %s %s (%.1f MiB, %zu weights)", model,
             created ? "written to" : "shared from", seg->path,
             (double)seg->layout.total_bytes / (1 << 20), n);
    *out = seg;
    return 0;
}

void pjs_wstore_release(pjs_wstore *s, pjs_wstore_segment *seg)
{
    if (seg == NULL)
        return;
    segment_free(seg);
    pjs_error err = {0};
    if (sweep(s, &err) < 0)
        pjs_warn("%s", err.msg);
}

const void *pjs_wstore_segment_weight(const pjs_wstore_segment *seg, size_t i)
{
    return seg->base + seg->layout.offsets[i];
}

const char *pjs_wstore_segment_path(const pjs_wstore_segment *seg)
{
    return seg->path;
}

int pjs_wstore_segment_verify(const pjs_wstore_segment *seg, pjs_error *err)
{
    struct stat st;
    pjs_error why = {0};
    int rc = 0;
    /* The size first: reading past a truncated file's end would raise SIGBUS. */
    if (fstat(seg->fd, &st) != 0 || (uint64_t)st.st_size != seg->layout.total_bytes)
        rc = pjs_error_set(&why, PJS_ERR_INVALID_ARGUMENT, "its size changed");
    else
        rc = pjs_wstore_data_check(&seg->layout, seg->base, &why);
    if (rc != 0)
        return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                             "shared weights segment %s changed after it was checked: %s",
                             seg->path, why.msg);
    return 0;
}
