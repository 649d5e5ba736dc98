/*
 * topology.h: which group (switch, room) each rank's host is on, and the ring order that keeps
 * every group's ranks together (layer "core"; issue 18).
 *
 * A ring visits the ranks in ring order; each link of the ring carries the whole ring's traffic.
 * In launcher order (Ray's SPREAD placement knows nothing of switches) a ring can cross the
 * uplinks between switches many times; in ring order each group's ranks are contiguous, so the
 * ring crosses from group to group once per group boundary: every uplink is used once per
 * direction. Results do not depend on the order (every rank ends with the same bytes); only the
 * links used do.
 *
 * A rank's group, the first rule that gives one:
 *   1. MCCL_TOPOLOGY_GROUP=<name>: this process's own group (a launcher or an agent that knows the
 *      room sets it per host);
 *   2. MCCL_TOPOLOGY=<map>: a file, or the map itself when the value contains '=': entries
 *      "<key>=<group>" separated by commas, semicolons or newlines (in a file also "<key> <group>";
 *      '#' starts a comment). <key> is an IPv4 network in CIDR notation (198.18.1.0/24), an
 *      address (198.18.1.7, fd00::7), or a host name (gethostname, compared without case); the
 *      first entry that matches this rank's address or host name wins. No match: rule 3, with a
 *      warning;
 *   3. the rank's subnet: IPv4 /24 ("198.18.1.0/24"), IPv6 /64; loopback addresses are group
 *      "loopback".
 * Group names are at most MCCL_GROUP_STRLEN - 1 bytes; longer ones are cut.
 */
#ifndef MCCL_CORE_TOPOLOGY_H_
#define MCCL_CORE_TOPOLOGY_H_

#include <stddef.h>

#define MCCL_GROUP_STRLEN 64

/* This rank's group, for its published address `addr` ("ip:port", "[ip6]:port") and host name
 * `hostname` (NULL: gethostname), into out[MCCL_GROUP_STRLEN]. `map` is MCCL_TOPOLOGY's value (or
 * NULL), `own` MCCL_TOPOLOGY_GROUP's. Returns the rule that decided (1, 2 or 3); why[cap] says,
 * for the log, where the group came from (or why a map did not apply). */
int mcclTopologyGroup(const char* addr, const char* hostname, const char* own, const char* map, char* out,
                      char* why, size_t cap);

/* The ring order of n ranks whose groups are groups[r] (n strings): groups in the order of their
 * lowest rank, ranks ascending inside each. order[pos] is the rank at ring position pos, pos_of[r]
 * the position of rank r. Returns the number of groups. */
int mcclTopologyRingOrder(int n, const char* const* groups, int* order, int* pos_of);

#endif
