/*
 * client_id.c - client ids from peer addresses and from the header a
 * gateway sets (client_id.h). Every form goes through inet_pton and
 * inet_ntop, so an address written two ways is one id.
 */
#include "frontend/client_id.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The id of an IPv6 address: the IPv4 one when it is IPv4-mapped. */
static void v6_id(const struct in6_addr *a, char *out)
{
    if (IN6_IS_ADDR_V4MAPPED(a)) {
        struct in_addr a4;
        memcpy(&a4, &a->s6_addr[12], sizeof a4);
        inet_ntop(AF_INET, &a4, out, PJS_CLIENT_ID_MAX);
        return;
    }
    inet_ntop(AF_INET6, a, out, PJS_CLIENT_ID_MAX);
}

void pjs_client_id_of_sockaddr(const struct sockaddr *sa, char *out)
{
    out[0] = '\0';
    if (sa == NULL)
        return;
    switch (sa->sa_family) {
    case AF_UNIX: snprintf(out, PJS_CLIENT_ID_MAX, "unix"); break;
    case AF_INET:
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, PJS_CLIENT_ID_MAX);
        break;
    case AF_INET6: v6_id(&((const struct sockaddr_in6 *)sa)->sin6_addr, out); break;
    default: break;
    }
}

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

bool pjs_client_grpc_peer_is_unix(const char *peer)
{
    return peer != NULL && (starts(peer, "unix:") || starts(peer, "unix-abstract:"));
}

/* The host of "host:port", "[host]:port" or "%5Bhost%5D:port" into buf. */
static bool peer_host(const char *s, bool v6, char *buf, size_t size)
{
    const char *begin = s, *end;
    if (!v6) {
        end = strrchr(s, ':');
        if (end == NULL)
            end = s + strlen(s);
    } else if (s[0] == '[') {
        begin = s + 1;
        end = strchr(begin, ']');
    } else if (strncasecmp(s, "%5B", 3) == 0) {
        begin = s + 3;
        end = strcasestr(begin, "%5D");
    } else {
        return false;
    }
    if (end == NULL || (size_t)(end - begin) >= size)
        return false;
    memcpy(buf, begin, (size_t)(end - begin));
    buf[end - begin] = '\0';
    return true;
}

void pjs_client_id_of_grpc_peer(const char *peer, char *out)
{
    char host[INET6_ADDRSTRLEN + 1];
    struct in_addr a4;
    struct in6_addr a6;
    out[0] = '\0';
    if (peer == NULL)
        return;
    if (pjs_client_grpc_peer_is_unix(peer))
        snprintf(out, PJS_CLIENT_ID_MAX, "unix");
    else if (starts(peer, "ipv4:") && peer_host(peer + 5, false, host, sizeof host) &&
             inet_pton(AF_INET, host, &a4) == 1)
        inet_ntop(AF_INET, &a4, out, PJS_CLIENT_ID_MAX);
    else if (starts(peer, "ipv6:") && peer_host(peer + 5, true, host, sizeof host) &&
             inet_pton(AF_INET6, host, &a6) == 1)
        v6_id(&a6, out);
}

bool pjs_client_id_parse(const char *value, size_t len, char *out)
{
    char text[INET6_ADDRSTRLEN + 1];
    struct in_addr a4;
    struct in6_addr a6;
    if (value == NULL || len == 0 || len >= sizeof text)
        return false;
    memcpy(text, value, len);
    text[len] = '\0';
    if (strcmp(text, "unix") == 0) {
        snprintf(out, PJS_CLIENT_ID_MAX, "unix");
        return true;
    }
    if (inet_pton(AF_INET, text, &a4) == 1) {
        inet_ntop(AF_INET, &a4, out, PJS_CLIENT_ID_MAX);
        return true;
    }
    if (inet_pton(AF_INET6, text, &a6) == 1) {
        v6_id(&a6, out);
        return true;
    }
    return false;
}
