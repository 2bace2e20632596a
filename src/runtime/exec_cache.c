/*
 * exec_cache.c - executable cache entries on disk (see exec_cache.h).
 *
 * Entry layout (little-endian):
 *   "PJSXC001"        8 bytes magic (format version in the last digits)
 *   key               32 bytes
 *   payload size      8 bytes
 *   payload SHA-256   32 bytes
 *   payload           payload size bytes
 */
#include "runtime/exec_cache.h"

#include <errno.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/mapped_file.h"

#define ENTRY_MAGIC "PJSXC001"
#define ENTRY_HEADER_SIZE (8 + PJS_EXEC_CACHE_KEY_SIZE + 8 + 32)
/* Serialized executables are large but bounded; refuse absurd entries. */
#define ENTRY_MAX_SIZE (4ull << 30)

struct pjs_exec_cache {
    char dir[PATH_MAX];
};

struct pjs_exec_cache_key_builder {
    EVP_MD_CTX *ctx;
};

int pjs_exec_cache_default_dir(char *out, size_t outsize, pjs_error *err)
{
    const char *env = getenv("PJSERVE_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (env != NULL && env[0] != '\0')
        n = snprintf(out, outsize, "%s", env);
    else if (xdg != NULL && xdg[0] != '\0')
        n = snprintf(out, outsize, "%s/pjserve", xdg);
    else if (home != NULL && home[0] != '\0')
        n = snprintf(out, outsize, "%s/.cache/pjserve", home);
    else
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "no cache directory: set PJSERVE_CACHE_DIR or pass --cache-dir");
    if (n < 0 || (size_t)n >= outsize)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "cache directory path too long");
    return 0;
}

/* mkdir -p */
static int make_dirs(const char *path, pjs_error *err)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; ; p++) {
        char c = *p;
        if (c != '/' && c != '\0')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return pjs_error_set(err, PJS_ERR_IO, "cannot create cache directory %s: %s", buf,
                                 strerror(errno));
        *p = c;
        if (c == '\0')
            break;
    }
    return 0;
}

pjs_exec_cache *pjs_exec_cache_open_or_warn(const char *dir, bool no_cache)
{
    if (no_cache)
        return NULL;
    char default_dir[4096];
    pjs_error err;
    pjs_exec_cache *cache = NULL;
    if (dir == NULL) {
        if (pjs_exec_cache_default_dir(default_dir, sizeof default_dir, &err) != 0) {
            pjs_warn("executable cache disabled: %s", err.msg);
            return NULL;
        }
        dir = default_dir;
    }
    if (pjs_exec_cache_open(dir, &cache, &err) != 0)
        pjs_warn("executable cache disabled: %s", err.msg);
    return cache;
}

int pjs_exec_cache_open(const char *dir, pjs_exec_cache **out, pjs_error *err)
{
    if (strlen(dir) >= PATH_MAX - 80)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "cache directory path too long: %s", dir);
    int rc = make_dirs(dir, err);
    if (rc != 0)
        return rc;
    pjs_exec_cache *cache = calloc(1, sizeof *cache);
    if (cache == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    snprintf(cache->dir, sizeof cache->dir, "%s", dir);
    *out = cache;
    return 0;
}

void pjs_exec_cache_close(pjs_exec_cache *cache) { free(cache); }

const char *pjs_exec_cache_dir(const pjs_exec_cache *cache) { return cache->dir; }

pjs_exec_cache_key_builder *pjs_exec_cache_key_begin(void)
{
    pjs_exec_cache_key_builder *b = calloc(1, sizeof *b);
    if (b == NULL)
        return NULL;
    b->ctx = EVP_MD_CTX_new();
    if (b->ctx == NULL || EVP_DigestInit_ex(b->ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(b->ctx);
        free(b);
        return NULL;
    }
    return b;
}

void pjs_exec_cache_key_add(pjs_exec_cache_key_builder *b, const void *data, size_t size)
{
    uint64_t len = size;
    EVP_DigestUpdate(b->ctx, &len, sizeof len);
    if (size > 0)
        EVP_DigestUpdate(b->ctx, data, size);
}

void pjs_exec_cache_key_finish(pjs_exec_cache_key_builder *b,
                               unsigned char key[PJS_EXEC_CACHE_KEY_SIZE])
{
    unsigned int n = 0;
    EVP_DigestFinal_ex(b->ctx, key, &n);
    EVP_MD_CTX_free(b->ctx);
    free(b);
}

static void sha256(const void *data, size_t size, unsigned char out[32])
{
    unsigned int n = 0;
    EVP_Digest(data, size, out, &n, EVP_sha256(), NULL);
}

static void entry_path(const pjs_exec_cache *cache, const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE],
                       char *out, size_t outsize)
{
    char hex[2 * PJS_EXEC_CACHE_KEY_SIZE + 1];
    for (int i = 0; i < PJS_EXEC_CACHE_KEY_SIZE; i++)
        snprintf(hex + 2 * i, 3, "%02x", key[i]);
    snprintf(out, outsize, "%s/%s.pjx", cache->dir, hex);
}

static uint64_t read_u64le(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void write_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Checks a mapped entry; returns NULL when valid, else what is wrong. */
static const char *entry_problem(const pjs_mapped_file *mf,
                                 const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE])
{
    if (mf->size < ENTRY_HEADER_SIZE)
        return "truncated header";
    if (memcmp(mf->data, ENTRY_MAGIC, 8) != 0)
        return "bad magic (not a pjserve cache entry, or another format version)";
    if (memcmp(mf->data + 8, key, PJS_EXEC_CACHE_KEY_SIZE) != 0)
        return "key mismatch";
    uint64_t size = read_u64le(mf->data + 8 + PJS_EXEC_CACHE_KEY_SIZE);
    if (size != mf->size - ENTRY_HEADER_SIZE)
        return "payload size does not match the file size";
    unsigned char digest[32];
    sha256(mf->data + ENTRY_HEADER_SIZE, (size_t)size, digest);
    if (memcmp(digest, mf->data + 8 + PJS_EXEC_CACHE_KEY_SIZE + 8, 32) != 0)
        return "payload checksum mismatch";
    return NULL;
}

int pjs_exec_cache_lookup(pjs_exec_cache *cache, const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE],
                          void **out_payload, size_t *out_size)
{
    char path[PATH_MAX + 80];
    entry_path(cache, key, path, sizeof path);
    if (access(path, F_OK) != 0)
        return 0;
    pjs_mapped_file mf;
    pjs_error err;
    if (pjs_mapped_file_open(&mf, path, &err) != 0) {
        pjs_warn("executable cache: ignoring unreadable entry: %s", err.msg);
        return 0;
    }
    int hit = 0;
    const char *problem = mf.size > ENTRY_MAX_SIZE ? "entry too large" : entry_problem(&mf, key);
    if (problem != NULL) {
        pjs_warn("executable cache: ignoring corrupt entry %s (%s); it will be rebuilt", path,
                 problem);
        unlink(path);
        goto out;
    }
    size_t size = mf.size - ENTRY_HEADER_SIZE;
    void *payload = malloc(size > 0 ? size : 1);
    if (payload == NULL) {
        pjs_warn("executable cache: out of memory reading %s", path);
        goto out;
    }
    memcpy(payload, mf.data + ENTRY_HEADER_SIZE, size);
    *out_payload = payload;
    *out_size = size;
    hit = 1;
out:
    pjs_mapped_file_close(&mf);
    return hit;
}

int pjs_exec_cache_store(pjs_exec_cache *cache, const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE],
                         const void *payload, size_t size, pjs_error *err)
{
    char path[PATH_MAX + 80];
    entry_path(cache, key, path, sizeof path);
    unsigned char header[ENTRY_HEADER_SIZE];
    memcpy(header, ENTRY_MAGIC, 8);
    memcpy(header + 8, key, PJS_EXEC_CACHE_KEY_SIZE);
    write_u64le(header + 8 + PJS_EXEC_CACHE_KEY_SIZE, size);
    sha256(payload, size, header + 8 + PJS_EXEC_CACHE_KEY_SIZE + 8);
    pjs_file_part parts[2] = {{header, sizeof header}, {payload, size}};
    return pjs_write_file_atomic_parts(path, parts, 2, err);
}

void pjs_exec_cache_evict(pjs_exec_cache *cache, const unsigned char key[PJS_EXEC_CACHE_KEY_SIZE])
{
    char path[PATH_MAX + 80];
    entry_path(cache, key, path, sizeof path);
    unlink(path);
}
