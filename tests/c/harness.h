/*
 * harness.h: the small test kit shared by the C tests.
 *
 * Every test binary is one process run under a deadline by run_tests.sh. Checks count failures
 * instead of stopping, so one run reports every wrong case; main() returns harnessExit().
 * Multi-rank tests fork one child per rank (harnessRunRanks); the parent serves the bootstrap
 * store, collects each child's exit status and the digests the children report, and kills every
 * child when the deadline passes.
 */
#ifndef MCCL_TEST_HARNESS_H_
#define MCCL_TEST_HARNESS_H_

#include <stdint.h>
#include <stdio.h>
#include <stddef.h>

#include "mccl.h"

extern int harness_failures;
extern int harness_checks;

/* Record one check; on failure print the location and a printf-style message. */
#define EXPECT(cond, ...)                                                         \
  do {                                                                            \
    harness_checks++;                                                             \
    if (!(cond)) {                                                                \
      harness_failures++;                                                         \
      if (harness_failures <= 50) {                                               \
        fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);  \
        fprintf(stderr, __VA_ARGS__);                                             \
        fputc('\n', stderr);                                                      \
      }                                                                           \
    }                                                                             \
  } while (0)

/* Check an mccl call returned mcclSuccess; on failure print the library's last error. */
#define EXPECT_OK(comm, call)                                                     \
  do {                                                                            \
    mcclResult_t res_ = (call);                                                   \
    EXPECT(res_ == mcclSuccess, "%s -> %s: %s", #call, mcclGetErrorString(res_),  \
           mcclGetLastError(comm));                                               \
  } while (0)

/* Print "<name>: N checks, N failed" and return the process exit status (0 when all passed). */
int harnessExit(const char* name);

/* 64-bit FNV-1a digest of a byte range, to compare ranks' results bitwise. */
uint64_t harnessDigest(const void* data, size_t bytes);

/* A deterministic pseudo-random generator (splitmix64) so each rank can build its inputs. */
uint64_t harnessRandom(uint64_t* state);

/* Sleep for `us` microseconds (nanosleep: usleep is not in POSIX.1-2008, which `make
 * posix-check` builds against). A signal may cut the sleep short. */
void harnessSleepUs(uint64_t us);

/* Fork `nranks` children; child r calls fn(rank, nranks, &store, arg) with a connected client of
 * the parent's TCP store and exits with fn's return value (0 = pass). The child may report a
 * digest with harnessReport(); the parent checks that every child reported the same digests in
 * the same order. Returns 0 when every child exited 0 within `deadline_s` seconds and digests
 * agree; otherwise kills the children and returns 1. */
typedef int (*harnessRankFn)(int rank, int nranks, mcclStore_t* store, void* arg);
int harnessRunRanks(int nranks, int deadline_s, harnessRankFn fn, void* arg);

/* Inside a child: the TCP port of the parent's store, for a process that needs a connection of
 * its own (a child of the rank, which must not share the rank's). */
extern int harness_store_port;

/* Inside a child, before its first communicator: set an MCCL_* parameter for this rank alone.
 * A plain setenv there changes nothing: the parent's store already read every parameter, and the
 * child inherits what it read (core/param.h); this sets the variable and reads them all again. */
void harnessSetenv(const char* name, const char* value);

/* In the parent, for a block of cases: set an MCCL_* parameter as harnessSetenv does and return
 * its previous value (a copy, NULL when unset) for harnessRestoreEnv, which puts it back (or
 * unsets it), reads the parameters again and frees `was`. A make ctest pass may set the variable
 * for the whole binary: the cases after the block must see it as that pass set it. */
char* harnessSetenvSaved(const char* name, const char* value);
void harnessRestoreEnv(const char* name, char* was);

/* Seconds on the monotonic clock (for deadlines and "failed within" checks). */
double harnessSeconds(void);

/* Inside a child: report a digest for cross-rank comparison. */
void harnessReport(uint64_t digest);

/* Inside a child: create a communicator over the given store (fails the test on error). */
mcclComm_t harnessCommInit(int rank, int nranks, mcclStore_t* store);

#endif
