/*
 * client_id.h - which client sent a request, for the bounds kept per client
 * (a stateful model's live sequences, sched/sequence_table.h).
 *
 * A client is the address its connection comes from, without the port:
 * "192.0.2.7", "2001:db8::1" (inet_ntop's form; an IPv4-mapped IPv6
 * address is written as the IPv4 one, so a dual-stack listener sees one
 * client as one), or "unix" for a Unix-domain socket.
 *
 * Behind a gateway every connection comes from the gateway, so the gateway
 * names the client in the `pjserve-client` header (gRPC: metadata of that
 * name) of each request it relays, set from the connection it came on and
 * replacing whatever the client sent there. A server believes that header
 * only from a peer trusted to have set it: one on a Unix-domain socket (a
 * node's workers listen in a directory only the node's user may enter) or
 * one presenting the server's admin token (what a gateway sends its workers
 * with --worker-token-file); from anyone else it is ignored, so a client
 * cannot choose its identity. A value that is not an address as written
 * above is ignored as well.
 *
 * Pure functions over addresses and strings: no gRPC or libmicrohttpd type.
 */
#ifndef PJS_FRONTEND_CLIENT_ID_H
#define PJS_FRONTEND_CLIENT_ID_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

/* The header (gRPC metadata key) a gateway names the client in. */
#define PJS_CLIENT_HEADER "pjserve-client"
/* Room for a client id with its NUL (an IPv6 address is at most 45). */
#define PJS_CLIENT_ID_MAX 48

/* The client id of an HTTP client's address, into out (PJS_CLIENT_ID_MAX
 * bytes); "" when the family is none of IPv4, IPv6 or Unix. */
void pjs_client_id_of_sockaddr(const struct sockaddr *sa, char *out);

/* The client id of a gRPC peer string ("ipv4:192.0.2.7:5000",
 * "ipv6:[2001:db8::1]:5000" or with the brackets percent-encoded,
 * "unix:/path"); "" when it is none of these. */
void pjs_client_id_of_grpc_peer(const char *peer, char *out);

/* Whether a gRPC peer string is a Unix-domain socket. */
bool pjs_client_grpc_peer_is_unix(const char *peer);

/* The id a trusted `pjserve-client` value names (len bytes, not
 * NUL-terminated), into out: an IPv4 or IPv6 address (written as above) or
 * "unix". Returns false, out untouched, for anything else. */
bool pjs_client_id_parse(const char *value, size_t len, char *out);

#endif
