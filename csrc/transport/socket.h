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

/* O_NONBLOCK, close-on-exec, SO_NOSIGPIPE where it exists (core/platform.h), TCP_NODELAY,
 * MCCL_SOCKET_BUFSIZE when set, and the congestion control (below). Returns 0 or -1. A socket
 * that is not TCP (a socketpair) fails at TCP_NODELAY with the options before it set.
 *
 * Congestion control: MCCL_TCP_CONGESTION when set ("system": the system's default); unset, cubic
 * where the system lets a socket choose it (Linux; else the system's, logged at INFO). Why cubic:
 * on the 8-host testbed whose system default is BBR, mccl's 16-256 MiB all-reduce reached
 * 99.6-99.8% of goodput with cubic sockets and 95.3-96.7% without, in one device call whose
 * stages each alternated with gloo (bench/NOTES.md, 2026-12-06); macOS, the fleet's system, runs
 * cubic already. */
int mcclSocketTune(int fd);

/* A new TCP socket of `family` (AF_INET or AF_INET6), blocking, close-on-exec from the start
 * where the system allows it (SOCK_CLOEXEC), with SO_NOSIGPIPE where it exists. Every stream
 * socket the library creates comes from here or from mcclSocketAccept. Returns the descriptor,
 * or -1 with errno set. */
int mcclSocketOpen(int family);

/* accept() on `listen_fd` (from/fromlen as for accept, may be NULL): the new socket is blocking
 * (as on Linux, also where it would inherit the listening socket's O_NONBLOCK, as on macOS),
 * close-on-exec (accept4 where available) and has SO_NOSIGPIPE where it exists. Returns the
 * descriptor, or -1 with errno set (EAGAIN: none waiting on a non-blocking listener). */
int mcclSocketAccept(int listen_fd, struct sockaddr* from, socklen_t* fromlen);

/* strerror(err), and for a descriptor limit what the limit is: EMFILE names this process's soft
 * RLIMIT_NOFILE (the number `ulimit -n` shows) and its hard limit, ENFILE the system's table of
 * open files (fs.file-max on Linux) and the process's limit too. Writes at most `cap` bytes. */
void mcclSocketErrorText(int err, char* out, size_t cap);

/* 1 when `err`, from socket() or accept(), says a resource of this process or system ran out
 * (EMFILE, ENFILE, ENOBUFS, ENOMEM): waiting will not cure it while the job holds what it has. */
int mcclSocketResourceError(int err);

/* A listening socket bound to `addr` (port 0 picks one); writes the bound address back. Errors
 * name the address and the cause (mcclSocketErrorText). It carries the congestion control (above;
 * accepted connections inherit it); mcclInvalidArgument, naming the value, when the system refuses
 * a MCCL_TCP_CONGESTION that was set (not loaded, not allowed to this process, or no such
 * option: not Linux). */
mcclResult_t mcclSocketListen(mcclSockaddr* addr, int* fd);

#endif
