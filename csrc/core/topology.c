/* topology.c: rank groups and the ring order (topology.h). */
#include "core/topology.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "transport/socket.h"

static void copyGroup(char* out, const char* s, size_t len) {
  if (len >= MCCL_GROUP_STRLEN) len = MCCL_GROUP_STRLEN - 1;
  memcpy(out, s, len);
  out[len] = '\0';
}

static char* trim(char* s) {
  while (*s && isspace((unsigned char)*s)) s++;
  char* e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

/* 1 when `key` (CIDR, address or host name) matches the address `a` or `hostname`. */
static int keyMatches(const char* key, const mcclSockaddr* a, int have_addr, const char* hostname) {
  char text[128];
  snprintf(text, sizeof(text), "%s", key);
  char* slash = strchr(text, '/');
  int bits = -1;
  if (slash != NULL) {
    *slash = '\0';
    char* end;
    long b = strtol(slash + 1, &end, 10);
    if (*end != '\0' || b < 0 || b > 128) return 0;
    bits = (int)b;
  }
  struct in_addr v4;
  struct in6_addr v6;
  if (inet_pton(AF_INET, text, &v4) == 1) {
    if (!have_addr || a->sa.sa_family != AF_INET) return 0;
    if (bits < 0) bits = 32;
    if (bits > 32) return 0;
    uint32_t mask = bits == 0 ? 0 : 0xffffffffu << (32 - bits);
    return (ntohl(a->sin.sin_addr.s_addr) & mask) == (ntohl(v4.s_addr) & mask);
  }
  if (inet_pton(AF_INET6, text, &v6) == 1) {
    if (!have_addr || a->sa.sa_family != AF_INET6) return 0;
    if (bits < 0) bits = 128;
    const uint8_t* x = a->sin6.sin6_addr.s6_addr;
    for (int i = 0; i < 16 && bits > 0; i++, bits -= 8) {
      uint8_t m = bits >= 8 ? 0xff : (uint8_t)(0xff << (8 - bits));
      if ((x[i] & m) != (v6.s6_addr[i] & m)) return 0;
    }
    return 1;
  }
  return bits < 0 && hostname != NULL && strcasecmp(text, hostname) == 0;
}

/* Look `a`/`hostname` up in the map text (modified in place). 1 and out set on a match. */
static int mapLookup(char* text, int is_file, const mcclSockaddr* a, int have_addr, const char* hostname,
                     char* out) {
  char* save = NULL;
  const char* delims = is_file ? "\n" : ",;\n";
  for (char* entry = strtok_r(text, delims, &save); entry; entry = strtok_r(NULL, delims, &save)) {
    char* hash = strchr(entry, '#');
    if (hash) *hash = '\0';
    char* e = trim(entry);
    if (*e == '\0') continue;
    char* sep = strchr(e, '=');
    if (sep == NULL && is_file) sep = strpbrk(e, " \t");
    if (sep == NULL) continue;
    *sep = '\0';
    char *key = trim(e), *group = trim(sep + 1);
    if (*key == '\0' || *group == '\0') continue;
    if (keyMatches(key, a, have_addr, hostname)) {
      copyGroup(out, group, strlen(group));
      return 1;
    }
  }
  return 0;
}

static void subnetGroup(const mcclSockaddr* a, int have_addr, char* out) {
  char buf[INET6_ADDRSTRLEN];
  if (!have_addr) {
    copyGroup(out, "unknown", 7);
  } else if (a->sa.sa_family == AF_INET) {
    uint32_t ip = ntohl(a->sin.sin_addr.s_addr);
    if ((ip >> 24) == 127) {
      copyGroup(out, "loopback", 8);
      return;
    }
    struct in_addr net = {htonl(ip & 0xffffff00u)};
    inet_ntop(AF_INET, &net, buf, sizeof(buf));
    snprintf(out, MCCL_GROUP_STRLEN, "%s/24", buf);
  } else {
    struct in6_addr net = a->sin6.sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&net)) {
      copyGroup(out, "loopback", 8);
      return;
    }
    memset(net.s6_addr + 8, 0, 8);
    inet_ntop(AF_INET6, &net, buf, sizeof(buf));
    snprintf(out, MCCL_GROUP_STRLEN, "%s/64", buf);
  }
}

int mcclTopologyGroup(const char* addr, const char* hostname, const char* own, const char* map, char* out,
                      char* why, size_t cap) {
  if (own != NULL && own[0] != '\0') {
    copyGroup(out, own, strlen(own));
    snprintf(why, cap, "MCCL_TOPOLOGY_GROUP");
    return 1;
  }
  mcclSockaddr a;
  int have_addr = addr != NULL && mcclSockaddrParse(addr, &a) == 0;
  char host[256] = "";
  if (hostname == NULL) {
    if (gethostname(host, sizeof(host) - 1) == 0) hostname = host;
  }
  if (map != NULL && map[0] != '\0') {
    int is_file = strchr(map, '=') == NULL;
    char* text = NULL;
    if (is_file) {
      FILE* f = fopen(map, "r");
      if (f != NULL) {
        size_t capb = 1 << 16, len = 0;
        text = malloc(capb + 1);
        if (text) {
          len = fread(text, 1, capb, f);
          text[len] = '\0';
        }
        fclose(f);
      }
      if (text == NULL) {
        snprintf(why, cap, "MCCL_TOPOLOGY=%s cannot be read, so the subnet", map);
        subnetGroup(&a, have_addr, out);
        return 3;
      }
    } else {
      text = strdup(map);
    }
    int found = text != NULL && mapLookup(text, is_file, &a, have_addr, hostname, out);
    free(text);
    if (found) {
      snprintf(why, cap, "MCCL_TOPOLOGY");
      return 2;
    }
    snprintf(why, cap, "no entry of MCCL_TOPOLOGY matches %s or host '%s', so the subnet", addr ? addr : "?",
             hostname ? hostname : "?");
    subnetGroup(&a, have_addr, out);
    return 3;
  }
  snprintf(why, cap, "the subnet");
  subnetGroup(&a, have_addr, out);
  return 3;
}

int mcclTopologyRingOrder(int n, const char* const* groups, int* order, int* pos_of) {
  int pos = 0, ngroups = 0;
  for (int r = 0; r < n; r++) pos_of[r] = -1;
  for (int r = 0; r < n; r++) {
    if (pos_of[r] >= 0) continue; /* r's group was placed with a lower rank */
    ngroups++;
    for (int q = r; q < n; q++)
      if (pos_of[q] < 0 && strcmp(groups[q], groups[r]) == 0) {
        pos_of[q] = pos;
        order[pos++] = q;
      }
  }
  return ngroups;
}
