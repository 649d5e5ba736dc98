/*
 * socket.h: addresses, interface choice and socket options (layer "transport").
 */
#ifndef MCCL_SOCKET_H_
#define MCCL_SOCKET_H_

#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>

#include "mccl.h"

typedef union {
  struct sockaddr sa;
  struct sockaddr_in sin;
  struct sockaddr_in6 sin6;
  struct sockaddr_storage ss;
} mcclSockaddr;

#define MCCL_ADDR_STRLEN 80

/* "1.2.3.4:5678" or "[fe80::1]:5678". */
void mcclSockaddrFormat(const mcclSockaddr* addr, char* out, size_t cap);

/* Parse the format above (numeric hosts only). Returns 0 on success, -1 otherwise. */
int mcclSockaddrParse(const char* text, mcclSockaddr* addr);

socklen_t mcclSockaddrLen(const mcclSockaddr* addr);

/* Choose the local address to listen on and publish (port left 0):
 *  1. MCCL_SOCKET_IFNAME (NCCL grammar: "eth,en" prefixes; "^docker,lo" excludes prefixes;
 *     a leading "=" makes names exact), MCCL_SOCKET_FAMILY=AF_INET|AF_INET6 restricts the family;
 *  2. else the source address the kernel routes toward `peer_hint` (a host name or address all
 *     ranks can reach, e.g. MASTER_ADDR);
 *  3. else the first interface that is up and not loopback; else loopback.
 * Writes the interface name (or "route" / "loopback") to ifname. mcclInvalidArgument with a
 * message naming the setting when MCCL_SOCKET_IFNAME matches nothing usable. */
mcclResult_t mcclFindLocalAddress(const char* peer_hint, mcclSockaddr* addr, char* ifname,
                                  size_t ifname_cap);

/* O_NONBLOCK, TCP_NODELAY, close-on-exec, and MCCL_SOCKET_BUFSIZE when set. Returns 0 or -1. */
int mcclSocketTune(int fd);

/* A listening socket bound to `addr` (port 0 picks one); writes the bound address back. */
mcclResult_t mcclSocketListen(mcclSockaddr* addr, int* fd);

#endif
