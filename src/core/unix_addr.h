/*
 * unix_addr.h - addresses of Unix-domain sockets, written "unix:/path".
 *
 * Wherever pjserve takes a host to listen on or to reach (serve's
 * --grpc-host, --http-host, --metrics-host; a gateway's worker addresses;
 * the node's probes), "unix:PATH" names a Unix-domain socket at PATH
 * instead of a TCP address, and any port given with it is ignored. The
 * node puts its workers on such sockets inside its private run directory,
 * so filesystem permissions decide who can reach them.
 */
#ifndef PJS_CORE_UNIX_ADDR_H
#define PJS_CORE_UNIX_ADDR_H

#include <string.h>
#include <sys/un.h>

#define PJS_UNIX_PREFIX "unix:"

/* Longest socket path the kernel takes (sun_path, with its NUL). */
#define PJS_UNIX_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

/* The socket path of a "unix:PATH" address, or NULL for any other. */
static inline const char *pjs_unix_path(const char *addr)
{
    size_t n = sizeof PJS_UNIX_PREFIX - 1;
    return addr != NULL && strncmp(addr, PJS_UNIX_PREFIX, n) == 0 ? addr + n : NULL;
}

#endif
