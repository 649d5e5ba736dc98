/*
 * test_topology.c: a rank's topology group by each rule of core/topology.h (own name, a map
 * inline or in a file with CIDR, address and host-name keys, the subnet), and the ring order that
 * keeps each group's ranks together.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "core/topology.h"

static void expectGroup(const char* addr, const char* host, const char* own, const char* map, const char* want,
                        int want_rule) {
  char out[MCCL_GROUP_STRLEN], why[400];
  int rule = mcclTopologyGroup(addr, host, own, map, out, why, sizeof(why));
  EXPECT(rule == want_rule && strcmp(out, want) == 0, "%s host %s own %s map %s: got '%s' by rule %d (%s), want '%s' by %d",
         addr, host, own ? own : "-", map ? map : "-", out, rule, why, want, want_rule);
}

static void testGroups(void) {
  /* Rule 1 wins over everything. */
  expectGroup("198.18.1.7:5000", "mac07", "room-b", "198.18.1.0/24=room-a", "room-b", 1);
  /* Rule 2: CIDR, exact address, host name (any case), first match wins; IPv6. */
  const char* map = "198.18.1.0/24=room-a, 198.18.2.9=odd ; Mac-12=room-c,198.18.0.0/16=campus";
  expectGroup("198.18.1.7:5000", "x", NULL, map, "room-a", 2);
  expectGroup("198.18.2.9:1", "x", NULL, map, "odd", 2);
  expectGroup("198.18.2.10:1", "mac-12", NULL, map, "room-c", 2);
  expectGroup("198.18.3.1:1", "x", NULL, map, "campus", 2);
  expectGroup("[fd00::7]:9", "x", NULL, "fd00::/64=v6room", "v6room", 2);
  expectGroup("[fd00:0:0:1::7]:9", "x", NULL, "fd00::/64=v6room", "fd00:0:0:1::/64", 3);
  /* No entry matches: the subnet. */
  expectGroup("10.1.2.3:1", "x", NULL, map, "10.1.2.0/24", 3);
  /* Rule 3 alone; loopback is one group. */
  expectGroup("10.1.2.3:1", "x", NULL, NULL, "10.1.2.0/24", 3);
  expectGroup("127.0.0.1:40000", "x", NULL, NULL, "loopback", 3);
  expectGroup("[::1]:40000", "x", NULL, NULL, "loopback", 3);
  /* A map file: "key group" or "key=group" lines, comments. */
  char path[] = "/tmp/mccl-topology-XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0, "mkstemp");
  const char* text = "# studio rooms\n198.18.1.0/24 room-a\n\n  198.18.2.0/24=room-b  # second floor\nmac-99\troom-z\n";
  EXPECT(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write");
  close(fd);
  expectGroup("198.18.2.44:1", "x", NULL, path, "room-b", 2);
  expectGroup("192.168.0.5:1", "MAC-99", NULL, path, "room-z", 2);
  unlink(path);
  expectGroup("198.18.2.44:1", "x", NULL, path, "198.18.2.0/24", 3); /* gone: the subnet */
  /* A name longer than a group holds is cut, not overflowed. */
  char longname[200];
  memset(longname, 'g', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = '\0';
  char out[MCCL_GROUP_STRLEN], why[64];
  mcclTopologyGroup("1.2.3.4:5", "x", longname, NULL, out, why, sizeof(why));
  EXPECT(strlen(out) == MCCL_GROUP_STRLEN - 1, "cut to %zu", strlen(out));
}

static void expectOrder(int n, const char* const* groups, const int* want, int want_groups) {
  int order[16], pos[16];
  int k = mcclTopologyRingOrder(n, groups, order, pos);
  int same = k == want_groups;
  for (int p = 0; p < n; p++) same &= order[p] == want[p] && pos[order[p]] == p;
  EXPECT(same, "ring order of %d ranks: %d groups, first %d %d %d", n, k, order[0], order[1], order[n - 1]);
}

static void testOrder(void) {
  const char* alt[] = {"A", "B", "A", "B"};
  expectOrder(4, alt, (const int[]){0, 2, 1, 3}, 2);
  /* Uneven groups, groups in the order of their lowest rank. */
  const char* uneven[] = {"A", "B", "B", "A", "C", "B", "C"};
  expectOrder(7, uneven, (const int[]){0, 3, 1, 2, 5, 4, 6}, 3);
  const char* one[] = {"x", "x", "x"};
  expectOrder(3, one, (const int[]){0, 1, 2}, 1);
  const char* each[] = {"c", "b", "a"};
  expectOrder(3, each, (const int[]){0, 1, 2}, 3);
}

/* Each rank takes its group from `arg` ("ABAB": rank r's letter) before the library first reads
 * the environment (this process's parameters are read once, at its first communicator), then
 * runs two-level all-reduces: exact sums, every rank's bytes equal (harnessReport). */
static int twoLevelRank(int rank, int nranks, mcclStore_t* store, void* arg) {
  char group[2] = {((const char*)arg)[rank], 0};
  harnessSetenv("MCCL_TOPOLOGY_GROUP", group);
  harnessSetenv("MCCL_ALGO", "twolevel");
  mcclComm_t comm = harnessCommInit(rank, nranks, store);
  if (comm == NULL) return 1;
  int bad = 0;
  const size_t counts[] = {(size_t)nranks, 100003, 1 << 18};
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
    size_t count = counts[c];
    int32_t* x = malloc(count * sizeof(*x));
    for (size_t i = 0; i < count; i++) x[i] = (int32_t)(i % 1009) + rank;
    if (mcclAllReduce(x, x, count, mcclInt32, mcclSum, comm, NULL, NULL) != mcclSuccess) bad++;
    for (size_t i = 0; i < count && !bad; i++)
      if (x[i] != (int32_t)(i % 1009) * nranks + nranks * (nranks - 1) / 2) bad++;
    harnessReport(harnessDigest(x, count * sizeof(*x)));
    free(x);
  }
  mcclCommDestroy(comm);
  return bad != 0;
}

static void testTwoLevel(void) {
  EXPECT(harnessRunRanks(4, 60, twoLevelRank, "ABAB") == 0, "two-level, 2 groups of 2, interleaved");
  EXPECT(harnessRunRanks(6, 60, twoLevelRank, "AABBCC") == 0, "two-level, 3 groups of 2");
  EXPECT(harnessRunRanks(3, 60, twoLevelRank, "AAB") == 0, "uneven groups: the flat ring");
}

int main(void) {
  testGroups();
  testOrder();
  testTwoLevel();
  return harnessExit("test_topology");
}
