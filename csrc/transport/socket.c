/* socket.c: addresses, interface selection (NCCL's MCCL_SOCKET_IFNAME grammar) and options. */
#include "transport/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/debug.h"
#include "core/param.h"
#include "core/platform.h"

socklen_t mcclSockaddrLen(const mcclSockaddr* addr) {
  return addr->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

void mcclSockaddrFormat(const mcclSockaddr* addr, char* out, size_t cap) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &addr->sin6.sin6_addr, host, sizeof(host));
    snprintf(out, cap, "[%s]:%u", host, ntohs(addr->sin6.sin6_port));
  } else {
    inet_ntop(AF_INET, &addr->sin.sin_addr, host, sizeof(host));
    snprintf(out, cap, "%s:%u", host, ntohs(addr->sin.sin_port));
  }
}

int mcclSockaddrParse(const char* text, mcclSockaddr* addr) {
  memset(addr, 0, sizeof(*addr));
  char host[INET6_ADDRSTRLEN + 2];
  const char* colon = strrchr(text, ':');
  if (colon == NULL) return -1;
  size_t hostlen = (size_t)(colon - text);
  if (hostlen == 0 || hostlen >= sizeof(host)) return -1;
  memcpy(host, text, hostlen);
  host[hostlen] = '\0';
  char* end = NULL;
  long port = strtol(colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) return -1;
  if (host[0] == '[') {
    if (host[hostlen - 1] != ']') return -1;
    host[hostlen - 1] = '\0';
    addr->sin6.sin6_family = AF_INET6;
    addr->sin6.sin6_port = htons((uint16_t)port);
    char* pct = strchr(host + 1, '%'); /* scope id, e.g. fe80::1%eth0 */
    if (pct != NULL) {
      *pct = '\0';
      addr->sin6.sin6_scope_id = if_nametoindex(pct + 1);
    }
    return inet_pton(AF_INET6, host + 1, &addr->sin6.sin6_addr) == 1 ? 0 : -1;
  }
  addr->sin.sin_family = AF_INET;
  addr->sin.sin_port = htons((uint16_t)port);
  return inet_pton(AF_INET, host, &addr->sin.sin_addr) == 1 ? 0 : -1;
}

/* NCCL's interface grammar: does `name` match the user's list? */
static int ifnameMatches(const char* list, const char* name) {
  int exclude = 0, exact = 0;
  if (*list == '^') { exclude = 1; list++; }
  if (*list == '=') { exact = 1; list++; }
  char copy[512];
  snprintf(copy, sizeof(copy), "%s", list);
  int hit = 0;
  char* save = NULL;
  for (char* tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (exact ? strcmp(name, tok) == 0 : strncmp(name, tok, strlen(tok)) == 0) { hit = 1; break; }
  }
  return exclude ? !hit : hit;
}

/* MCCL_SOCKET_FAMILY: AF_INET (or 4), AF_INET6 (or 6), or unset for either. */
static int familyWanted(int family) {
  const char* fam = mcclParamString("MCCL_SOCKET_FAMILY");
  if (fam == NULL || fam[0] == '\0') return family == AF_INET || family == AF_INET6;
  if (strcmp(fam, "AF_INET6") == 0 || strcmp(fam, "6") == 0) return family == AF_INET6;
  if (strcmp(fam, "AF_INET") == 0 || strcmp(fam, "4") == 0) return family == AF_INET;
  static int warned = 0;
  if (!warned++) WARN("MCCL_SOCKET_FAMILY=%s is not AF_INET or AF_INET6; using either", fam);
  return family == AF_INET || family == AF_INET6;
}

/* Pick from getifaddrs: interfaces that are up, match `list` (NULL: any non-loopback), and have
 * an address of a wanted family. IPv4 wins over IPv6 link-local, and any other interface over a
 * loopback one that `list` also matches (an exclusion list like '^eth' need not name 'lo'). */
static int pickInterface(const char* list, mcclSockaddr* addr, char* ifname, size_t cap,
                         char* seen, size_t seen_cap) {
  struct ifaddrs* ifs = NULL;
  if (getifaddrs(&ifs) != 0) return -1;
  int found = 0, found_score = -100;
  for (struct ifaddrs* it = ifs; it != NULL; it = it->ifa_next) {
    if (it->ifa_addr == NULL || !(it->ifa_flags & IFF_UP)) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (seen != NULL && strstr(seen, it->ifa_name) == NULL && strlen(seen) + strlen(it->ifa_name) + 3 < seen_cap) {
      if (seen[0] != '\0') strcat(seen, ", ");
      strcat(seen, it->ifa_name);
    }
    if (!familyWanted(family)) continue;
    if (list != NULL ? !ifnameMatches(list, it->ifa_name) : (it->ifa_flags & IFF_LOOPBACK) != 0) continue;
    int score = family == AF_INET ? 2 : 1;
    if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6*)it->ifa_addr)->sin6_addr)) score = 0;
    if (it->ifa_flags & IFF_LOOPBACK) score -= 10;
    if (score > found_score) {
      memset(addr, 0, sizeof(*addr));
      memcpy(addr, it->ifa_addr, family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
      snprintf(ifname, cap, "%s", it->ifa_name);
      found = 1;
      found_score = score;
    }
  }
  freeifaddrs(ifs);
  return found ? 0 : -1;
}

/* The source address the kernel would use to reach `host` (a UDP connect sends nothing). */
static int routeToward(const char* host, mcclSockaddr* addr) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_DGRAM;
  const char* fam = mcclParamString("MCCL_SOCKET_FAMILY");
  if (fam != NULL && (strcmp(fam, "AF_INET6") == 0 || strcmp(fam, "6") == 0)) hints.ai_family = AF_INET6;
  else if (fam != NULL && (strcmp(fam, "AF_INET") == 0 || strcmp(fam, "4") == 0)) hints.ai_family = AF_INET;
  char bare[256];
  snprintf(bare, sizeof(bare), "%s", host);
  size_t n = strlen(bare);
  if (n >= 2 && bare[0] == '[' && bare[n - 1] == ']') { /* "[::1]" as torchrun may pass it */
    memmove(bare, bare + 1, n - 2);
    bare[n - 2] = '\0';
  }
  if (getaddrinfo(bare, "9", &hints, &res) != 0 || res == NULL) return -1;
  int rc = -1;
  for (struct addrinfo* ai = res; ai != NULL && rc != 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    socklen_t len = sizeof(addr->ss);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && getsockname(fd, &addr->sa, &len) == 0) rc = 0;
    close(fd);
  }
  freeaddrinfo(res);
  if (rc == 0) {
    if (addr->sa.sa_family == AF_INET) addr->sin.sin_port = 0;
    else addr->sin6.sin6_port = 0;
  }
  return rc;
}

mcclResult_t mcclFindLocalAddress(const char* peer_hint, mcclSockaddr* addr, char* ifname,
                                  size_t ifname_cap) {
  const char* list = mcclParamString("MCCL_SOCKET_IFNAME");
  if (list != NULL && list[0] != '\0') {
    char seen[256] = "";
    if (pickInterface(list, addr, ifname, ifname_cap, seen, sizeof(seen)) == 0) return mcclSuccess;
    mcclSetThreadError("MCCL_SOCKET_IFNAME=%s matches no interface that is up with a usable address "
                       "(interfaces here: %s); use a prefix list like 'eth,en', '^docker' to "
                       "exclude, or '=eth0' for an exact name",
                       list, seen[0] ? seen : "none");
    return mcclInvalidArgument;
  }
  if (peer_hint != NULL && peer_hint[0] != '\0' && routeToward(peer_hint, addr) == 0) {
    snprintf(ifname, ifname_cap, "route to %s", peer_hint);
    return mcclSuccess;
  }
  if (pickInterface(NULL, addr, ifname, ifname_cap, NULL, 0) == 0) return mcclSuccess;
  memset(addr, 0, sizeof(*addr));
  addr->sin.sin_family = AF_INET;
  addr->sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  snprintf(ifname, ifname_cap, "loopback");
  return mcclSuccess;
}

/* SO_NOSIGPIPE where it exists (macOS: writes to a closed peer then fail with EPIPE instead of
 * raising SIGPIPE, which MCCL_MSG_NOSIGNAL cannot do there). 0, or -1 with errno. */
static int noSigpipe(int fd) {
#ifdef SO_NOSIGPIPE
  int one = 1;
  return setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#else
  (void)fd;
  return 0;
#endif
}

/* The congestion control of this rank's sockets (socket.h): MCCL_TCP_CONGESTION; unset, cubic
 * where the system lets a socket choose (MCCL_DEFAULT_CONGESTION); "system", the system's. */
#define MCCL_DEFAULT_CONGESTION "cubic"

/* It on `fd`: 0 when taken, or when nothing is asked, or when the default is refused (the socket
 * keeps the system's, *default_refused says so); -1 with errno when a value the user set is
 * refused (elsewhere than Linux there is no such option: a set value is refused at listen). */
static int setCongestion(int fd, int* default_refused) {
  const char* cc = mcclParamString("MCCL_TCP_CONGESTION");
  const int given = cc != NULL && cc[0] != '\0';
  if (default_refused != NULL) *default_refused = 0;
  if (given && strcmp(cc, "system") == 0) return 0;
#ifdef TCP_CONGESTION
  if (!given) cc = MCCL_DEFAULT_CONGESTION;
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) == 0) return 0;
  if (given) return -1;
  if (default_refused != NULL) *default_refused = 1;
  return 0;
#else
  if (!given) return 0;
  errno = ENOPROTOOPT;
  return -1;
#endif
}

int mcclSocketTune(int fd) {
  int one = 1;
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return -1;
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -1;
  if (noSigpipe(fd) != 0) return -1; /* before TCP_NODELAY: a socketpair gets it too */
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) return -1;
  int bufsize = (int)mcclParamInt("MCCL_SOCKET_BUFSIZE");
  if (bufsize > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof(bufsize));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof(bufsize));
  }
  setCongestion(fd, NULL); /* as the listener's did (mcclSocketListen) */
  return 0;
}

int mcclSocketOpen(int family) {
#if MCCL_HAVE_SOCK_CLOEXEC
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
#else
  int fd = socket(family, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
#endif
  if (noSigpipe(fd) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

int mcclSocketAccept(int listen_fd, struct sockaddr* from, socklen_t* fromlen) {
#if MCCL_HAVE_ACCEPT4
  int fd = accept4(listen_fd, from, fromlen, SOCK_CLOEXEC);
  if (fd < 0) return -1;
#else
  int fd = accept(listen_fd, from, fromlen);
  if (fd < 0) return -1;
  int flags = fcntl(fd, F_GETFL, 0);
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 || flags < 0 ||
      ((flags & O_NONBLOCK) && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
#endif
  if (noSigpipe(fd) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

static void limitText(rlim_t v, char* out, size_t cap) {
  if (v == RLIM_INFINITY) snprintf(out, cap, "unlimited");
  else snprintf(out, cap, "%llu", (unsigned long long)v);
}

void mcclSocketErrorText(int err, char* out, size_t cap) {
  struct rlimit rl;
  char soft[32] = "unknown", hard[32] = "unknown";
  if ((err == EMFILE || err == ENFILE) && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    limitText(rl.rlim_cur, soft, sizeof(soft));
    limitText(rl.rlim_max, hard, sizeof(hard));
  }
  if (err == EMFILE)
    snprintf(out, cap, "%s (EMFILE): this process has reached its limit of %s open descriptors (the soft "
             "RLIMIT_NOFILE, which `ulimit -n` shows; the hard limit is %s)", strerror(err), soft, hard);
  else if (err == ENFILE)
    snprintf(out, cap, "%s (ENFILE): the system's table of open files is full (its size is fs.file-max "
             "on Linux); this process's own limit is %s descriptors (the soft RLIMIT_NOFILE, which "
             "`ulimit -n` shows)", strerror(err), soft);
  else
    snprintf(out, cap, "%s", strerror(err));
}

int mcclSocketResourceError(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

mcclResult_t mcclSocketListen(mcclSockaddr* addr, int* out) {
  char text[MCCL_ADDR_STRLEN], why[320];
  int fd = mcclSocketOpen(addr->sa.sa_family);
  if (fd < 0) {
    mcclSocketErrorText(errno, why, sizeof(why));
    mcclSockaddrFormat(addr, text, sizeof(text));
    mcclSetThreadError("cannot open a socket to listen on %s: %s", text, why);
    return mcclSystemError;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int default_refused = 0;
  if (setCongestion(fd, &default_refused) != 0) { /* checked here, once, so that every connection can take it */
    mcclSocketErrorText(errno, why, sizeof(why));
    mcclSetThreadError("MCCL_TCP_CONGESTION=%s: this system refuses it for a socket (%s); "
                       "/proc/sys/net/ipv4/tcp_available_congestion_control lists what is loaded, "
                       "tcp_allowed_congestion_control what a process without CAP_NET_ADMIN may choose",
                       mcclParamString("MCCL_TCP_CONGESTION"), why);
    close(fd);
    return mcclInvalidArgument;
  }
  if (default_refused)
    INFO(MCCL_SUB_NET, "this system refuses TCP congestion control %s for a socket (%s): the connections keep the "
         "system's default", MCCL_DEFAULT_CONGESTION, strerror(errno));
  if (bind(fd, &addr->sa, mcclSockaddrLen(addr)) != 0 || listen(fd, 1024) != 0) {
    int err = errno;
    mcclSockaddrFormat(addr, text, sizeof(text));
    mcclSocketErrorText(err, why, sizeof(why));
    mcclSetThreadError("cannot listen on %s: %s", text, why);
    close(fd);
    return mcclSystemError;
  }
  socklen_t len = sizeof(addr->ss);
  getsockname(fd, &addr->sa, &len);
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  *out = fd;
  return mcclSuccess;
}
