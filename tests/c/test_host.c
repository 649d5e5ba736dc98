/*
 * test_host.c: host descriptions (csrc/core/host.c): this process's own, parsing others', which
 * ranks share a loopback, and which share this rank's CPUs (the sender thread's default rests on
 * that count: csrc/core/comm.c).
 */
#include <string.h>
#include <unistd.h>

#include "core/host.h"
#include "core/platform.h"
#include "harness.h"

#if MCCL_HAVE_AFFINITY
#include <sched.h>
#endif

static int cpusOf(const char* self) {
  mcclCpuShare s;
  mcclCpuShareInit(&s, self);
  return mcclCpuShareCpus(&s);
}

static void testOwnDescription(void) {
  char me[MCCL_HOST_STRLEN];
  mcclHostDescribe(me, sizeof(me));
  EXPECT(mcclHostSameLoopback(me, me), "own description '%s' does not parse", me);
  int want = (int)sysconf(_SC_NPROCESSORS_ONLN);
#if MCCL_HAVE_AFFINITY
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) want = CPU_COUNT(&set);
#endif
  EXPECT(cpusOf(me) == want, "'%s' holds %d CPUs, the affinity mask %d", me, cpusOf(me), want);
#if !MCCL_HAVE_PROCFS
  /* The portable build (macOS, make posix-check) names no network namespace. */
  const char* ns = strchr(me, ' ');
  EXPECT(ns != NULL && strncmp(ns, " - ", 3) == 0, "portable build: netns of '%s' is not '-'", me);
#endif
  /* A child in another network namespace would differ in the second field only: emulate it. */
  char other_ns[MCCL_HOST_STRLEN];
  const char* sp = strchr(me, ' ');
  EXPECT(sp != NULL && strchr(sp + 1, ' ') != NULL, "no two field separators in '%s'", me);
  if (sp != NULL && strchr(sp + 1, ' ') != NULL) {
    snprintf(other_ns, sizeof(other_ns), "%.*s 1%s", (int)(sp - me), me, strchr(sp + 1, ' '));
    EXPECT(!mcclHostSameLoopback(me, other_ns), "'%s' and '%s' share a loopback", me, other_ns);
  }
}

static void testLoopback(void) {
  EXPECT(mcclHostSameLoopback("m1 100 ff", "m1 100 f"), "same machine and namespace, other CPUs");
  EXPECT(!mcclHostSameLoopback("m1 100 ff", "m1 101 ff"), "other namespace");
  EXPECT(!mcclHostSameLoopback("m1 100 ff", "m2 100 ff"), "other machine");
  const char* bad[] = {"", "m1", "m1 100", "m1 100 ", " 100 ff", "m1  ff", "m1 100 fg", "m1 100 ff x"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) { /* equal strings still match */
    EXPECT(mcclHostSameLoopback(bad[i], bad[i]), "'%s' does not match itself", bad[i]);
    EXPECT(!mcclHostSameLoopback(bad[i], "m1 100 ff"), "'%s' matched a valid description", bad[i]);
  }
  EXPECT(!mcclHostSameLoopback("m1 100 fg", "m1 100 fh"), "two different malformed descriptions matched");
}

static void testCpuShare(void) {
  mcclCpuShare s;
  /* Unpinned ranks on one machine, some in other namespaces: all share its 8 CPUs. */
  mcclCpuShareInit(&s, "m1 100 ff");
  mcclCpuShareAdd(&s, "m1 200 ff");
  mcclCpuShareAdd(&s, "m1 300 ff");
  mcclCpuShareAdd(&s, "m2 100 ff");  /* another machine */
  mcclCpuShareAdd(&s, "m1 100 f00"); /* CPUs 8-11: disjoint */
  mcclCpuShareAdd(&s, "garbage");
  mcclCpuShareAdd(&s, "m1 100 xyz");
  EXPECT(s.ranks == 3 && mcclCpuShareCpus(&s) == 8, "ranks %d cpus %d, expected 3 and 8", s.ranks, mcclCpuShareCpus(&s));
  /* An overlapping set widens the union. */
  mcclCpuShareAdd(&s, "m1 400 180");
  EXPECT(s.ranks == 4 && mcclCpuShareCpus(&s) == 9, "ranks %d cpus %d, expected 4 and 9", s.ranks, mcclCpuShareCpus(&s));
  /* Ranks pinned to two CPUs each share nothing: each has its two. */
  mcclCpuShareInit(&s, "m1 1 3");
  mcclCpuShareAdd(&s, "m1 2 c");
  mcclCpuShareAdd(&s, "m1 3 30");
  EXPECT(s.ranks == 1 && mcclCpuShareCpus(&s) == 2, "pinned: ranks %d cpus %d", s.ranks, mcclCpuShareCpus(&s));
  EXPECT(mcclCpuShareSelfCpus(&s) == 2, "own CPUs %d, expected 2", mcclCpuShareSelfCpus(&s));
  /* A rank pinned to one CPU beside an unpinned one: many CPUs together, but only one of its own. */
  mcclCpuShareInit(&s, "m1 1 1");
  mcclCpuShareAdd(&s, "m1 2 ffffffffffffffff");
  EXPECT(s.ranks == 2 && mcclCpuShareCpus(&s) == 64 && mcclCpuShareSelfCpus(&s) == 1,
         "ranks %d cpus %d own %d, expected 2, 64, 1", s.ranks, mcclCpuShareCpus(&s), mcclCpuShareSelfCpus(&s));
  /* The widest mask (1024 CPUs) parses; one digit more does not. */
  char wide[MCCL_HOST_STRLEN] = "m1 1 ";
  memset(wide + 5, 'f', MCCL_HOST_MAX_CPUS / 4);
  wide[5 + MCCL_HOST_MAX_CPUS / 4] = '\0';
  EXPECT(cpusOf(wide) == MCCL_HOST_MAX_CPUS, "1024-CPU mask counted %d", cpusOf(wide));
  strcat(wide, "f");
  mcclCpuShareInit(&s, wide);
  EXPECT(s.ranks == 1 && mcclCpuShareCpus(&s) == 1, "an overlong mask counts as 1 rank on 1 CPU, got %d",
         mcclCpuShareCpus(&s));
  mcclCpuShareAdd(&s, "m1 1 ff");
  EXPECT(s.ranks == 1, "a rank whose own description did not parse counted another");
}

int main(void) {
  testOwnDescription();
  testLoopback();
  testCpuShare();
  return harnessExit("test_host");
}
