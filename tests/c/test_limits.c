/*
 * test_limits.c: a rank that runs out of file descriptors during init (issue 16). One rank lowers
 * its soft RLIMIT_NOFILE before init, so that accept() (rank 0, which every rank dials), socket()
 * for a dial (the highest rank, which dials every other) or socket() for its listener fails with
 * EMFILE (rank 0's listener too: the others read every address from the table rank 0 writes).
 * Every rank must fail init at once (well within the timeout), with an error that names
 * the cause and the limit, and no rank may spin while it waits: CPU time well below wall time.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

typedef struct {
  int victim; /* the rank whose limit is lowered */
  int spare;  /* descriptor numbers left free below its new limit */
  const char* where; /* what the victim's error must say failed ("accept()", "socket()", ...) */
} limitArg;

static double cpuSeconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Lower the soft RLIMIT_NOFILE so that exactly `spare` descriptor numbers below it are free (the
 * limit bounds descriptor numbers, and new descriptors take the lowest free one). Returns it. */
static int leaveFree(int spare) {
  int seen = 0, limit = -1;
  for (int fd = 0; fd < 65536 && limit < 0; fd++) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    if (seen++ == spare) limit = fd;
  }
  struct rlimit rl;
  if (limit < 0 || getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
  rl.rlim_cur = (rlim_t)limit;
  return setrlimit(RLIMIT_NOFILE, &rl) == 0 ? limit : -1;
}

static int rankMain(int r, int n, mcclStore_t* store, void* arg) {
  const limitArg* a = arg;
  char limit_text[64] = "";
  if (r == a->victim) {
    int limit = leaveFree(a->spare);
    EXPECT(limit > 0, "rank %d: cannot lower RLIMIT_NOFILE: %s", r, strerror(errno));
    snprintf(limit_text, sizeof(limit_text), "limit of %d open descriptors", limit);
  }
  mcclCommConfig_t cfg;
  mcclCommConfigInit(&cfg);
  cfg.rank = r;
  cfg.nranks = n;
  cfg.store = *store;
  cfg.name = "limits";
  cfg.timeout_ms = 20000;
  cfg.peer_hint = "127.0.0.1";
  mcclComm_t comm = NULL;
  double wall0 = harnessSeconds(), cpu0 = cpuSeconds();
  mcclResult_t res = mcclCommInitConfig(&comm, &cfg);
  double wall = harnessSeconds() - wall0, cpu = cpuSeconds() - cpu0;
  const char* msg = mcclGetLastError(NULL);
  EXPECT(res != mcclSuccess, "rank %d of %d: init succeeded with rank %d out of descriptors", r, n, a->victim);
  if (comm != NULL) mcclCommDestroy(comm);
  EXPECT(wall < 5.0, "rank %d: init took %.1f s to fail (timeout 20 s): %s", r, wall, msg);
  EXPECT(cpu < 0.2 + wall / 4, "rank %d: %.2f s of CPU in %.2f s of init: a busy loop", r, cpu, wall);
  EXPECT(strstr(msg, "EMFILE") != NULL && strstr(msg, "RLIMIT_NOFILE") != NULL && strstr(msg, "ulimit -n") != NULL,
         "rank %d: the error does not name the descriptor limit: %s", r, msg);
  char victim[32];
  snprintf(victim, sizeof(victim), "rank %d", a->victim);
  if (r != a->victim) EXPECT(strstr(msg, victim) != NULL, "rank %d: the error does not name %s: %s", r, victim, msg);
  if (r == a->victim) {
    EXPECT(strstr(msg, limit_text) != NULL && strstr(msg, a->where) != NULL,
           "rank %d: expected '%s' and '%s' in: %s", r, a->where, limit_text, msg);
    EXPECT(res == mcclSystemError, "rank %d: %s", r, mcclGetErrorString(res));
  } else {
    EXPECT(res == mcclRemoteError && strstr(msg, "another rank's init failed") != NULL,
           "rank %d: %s: %s", r, mcclGetErrorString(res), msg);
  }
  return 0;
}

int main(void) {
  /* Rank 0 of 8: its listener, its wake pipe and 3 connections fit; the 4th accept fails. */
  const struct {
    int n;
    limitArg a;
    const char* what;
  } cases[] = {
      {8, {0, 6, "accept()"}, "accept on rank 0 of 8"},
      {4, {3, 4, "cannot dial rank"}, "dial on rank 3 of 4"},
      {3, {1, 0, "cannot open a socket to listen"}, "listen on rank 1 of 3"},
      /* Rank 0 writes the table of addresses the others wait on: its own failure must reach them
       * through it (comm.c, gatherRecords and initPublishFailure). */
      {3, {0, 0, "cannot open a socket to listen"}, "listen on rank 0 of 3"},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    int before = harness_failures;
    harnessRunRanks(cases[k].n, 60, rankMain, (void*)&cases[k].a);
    printf("EMFILE in %s: %s\n", cases[k].what, harness_failures == before ? "ok" : "FAILED");
    fflush(stdout);
  }
  return harnessExit("test_limits");
}
