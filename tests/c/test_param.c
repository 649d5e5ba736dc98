/*
 * test_param.c: MCCL_* integer parameters (csrc/core/param.c). The table is read once per
 * process, so every case runs in a child of its own that sets one variable, reads it back and
 * reports the value through a pipe: decimal with K/M/G suffixes, no octal, no wrap-around, and
 * the default (with a warning) for anything out of range or unparsable; a warning for a variable
 * within two edits of a parameter's name.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/param.h"
#include "harness.h"

/* The value `name` reads as when the environment holds `raw`; LLONG_MIN if the child failed. */
static long long readAs(const char* name, const char* raw) {
  int fds[2];
  if (pipe(fds) != 0) return LLONG_MIN;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    setenv(name, raw, 1);
    long long v = (long long)mcclParamInt(name);
    _exit(write(fds[1], &v, sizeof(v)) == (ssize_t)sizeof(v) ? 0 : 1);
  }
  close(fds[1]);
  long long v = LLONG_MIN;
  if (pid < 0 || read(fds[0], &v, sizeof(v)) != (ssize_t)sizeof(v)) v = LLONG_MIN;
  close(fds[0]);
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  return v;
}

static void expectValue(const char* name, const char* raw, long long want) {
  long long got = readAs(name, raw);
  EXPECT(got == want, "%s=%s reads as %lld, expected %lld", name, raw, got, want);
}

/* What this process's first parameter read writes to stderr when the environment holds `name`. */
static void warningFor(const char* name, char* out, size_t cap) {
  int fds[2];
  out[0] = '\0';
  if (pipe(fds) != 0) return;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    setenv(name, "1", 1);
    (void)mcclParamInt("MCCL_PIPELINE_DEPTH");
    _exit(0);
  }
  close(fds[1]);
  size_t got = 0;
  ssize_t n;
  while (got + 1 < cap && (n = read(fds[0], out + got, cap - 1 - got)) > 0) got += (size_t)n;
  out[got] = '\0';
  close(fds[0]);
  if (pid > 0) waitpid(pid, NULL, 0);
}

static void expectNearMiss(const char* name, const char* nearest) {
  char err[1024], want[200];
  warningFor(name, err, sizeof(err));
  if (nearest == NULL) {
    EXPECT(strstr(err, "is no MCCL parameter") == NULL, "%s: unexpected warning: %s", name, err);
    return;
  }
  snprintf(want, sizeof(want), "%s is set but is no MCCL parameter, so it changes nothing; did you mean %s?", name,
           nearest);
  EXPECT(strstr(err, want) != NULL, "%s: expected \"%s\", stderr: %s", name, want, err);
}

int main(void) {
  /* Misspelled parameters are named with the one they are nearest to; others are left alone. */
  expectNearMiss("MCCL_RING_THRESHHOLD", "MCCL_RING_THRESHOLD"); /* an insertion */
  expectNearMiss("MCCL_SEGMNET_BYTES", "MCCL_SEGMENT_BYTES");    /* a transposition */
  expectNearMiss("mccl_algo", "MCCL_ALGO");                      /* case */
  expectNearMiss("MCCL_PIPELINE_DEPT", "MCCL_PIPELINE_DEPTH");   /* a deletion */
  expectNearMiss("MCCL_SEGMENT_BYTES", NULL);                    /* the parameter itself */
  expectNearMiss("MCCL_CLUSTER_ID", NULL);                       /* a Python tool's variable */
  expectNearMiss("MCCL_TEST_QUICK", NULL);
  const long long seg_default = 256 * 1024, depth_default = 4;
  const long long copy_default = 1; /* MCCL_SEND_THREAD_COPY */
  expectValue("MCCL_SEGMENT_BYTES", "65536", 65536);
  expectValue("MCCL_SEGMENT_BYTES", "64K", 65536);
  expectValue("MCCL_SEGMENT_BYTES", "1m", 1 << 20);
  expectValue("MCCL_SEGMENT_BYTES", "1G", 1 << 30);
  expectValue("MCCL_PIPELINE_DEPTH", "010", 10);       /* decimal, not octal 8 */
  expectValue("MCCL_PIPELINE_DEPTH", "0x10", depth_default); /* not hexadecimal either */
  expectValue("MCCL_PIPELINE_DEPTH", "8 ", depth_default);   /* trailing junk */
  expectValue("MCCL_PIPELINE_DEPTH", "", depth_default);
  expectValue("MCCL_PIPELINE_DEPTH", "65", depth_default);   /* above 64 */
  expectValue("MCCL_SEGMENT_BYTES", "2G", seg_default);      /* above 1 GiB */
  /* 17179869185 x 2^30 wraps to 2^30 in 64 bits: refused, not wrapped into range. */
  expectValue("MCCL_SEGMENT_BYTES", "17179869185G", seg_default);
  expectValue("MCCL_SEGMENT_BYTES", "99999999999999999999", seg_default); /* beyond int64 */
  /* The same where the range itself ends at INT64_MAX: only the overflow checks refuse them. */
  const long long ring_default = 256 * 1024;
  expectValue("MCCL_RING_THRESHOLD", "9223372036854775807", 9223372036854775807LL);
  expectValue("MCCL_RING_THRESHOLD", "99999999999999999999", ring_default);
  expectValue("MCCL_RING_THRESHOLD", "9007199254740992K", ring_default); /* 2^63 */
  expectValue("MCCL_RING_THRESHOLD", "8589934592G", ring_default);
  expectValue("MCCL_RING_THRESHOLD", " 5", ring_default); /* no whitespace either side */
  expectValue("MCCL_SEND_THREAD", "0", 0);
  expectValue("MCCL_SEND_THREAD", "1", 1);
  expectValue("MCCL_SEND_THREAD", "2", -1);
  expectValue("MCCL_SEND_THREAD", "yes", -1);
  expectValue("MCCL_SEND_INLINE_BYTES", "128K", 131072);
  expectValue("MCCL_SEND_INLINE_BYTES", "2G", 65536); /* above 1 GiB: the default */
  expectValue("MCCL_SEND_THREAD_COPY", "0", 0);
  expectValue("MCCL_SEND_THREAD_COPY", "2", copy_default);
  expectValue("MCCL_SEND_THREAD_LOAD", "-1", -1);
  expectValue("MCCL_SEND_THREAD_LOAD", "0", 0);
  expectValue("MCCL_SEND_THREAD_LOAD", "1000", 1000);
  expectValue("MCCL_SEND_THREAD_LOAD", "1001", 85); /* above ten cores: the default */
  expectValue("MCCL_SEND_THREAD_LOAD", "-2", 85);
  expectValue("MCCL_RING_THRESHOLD", "0", 0);
  expectValue("MCCL_ALPHA_BETA", "378828", 378828); /* the paper's 306 us x 1.238 GB/s */
  expectValue("MCCL_ALPHA_BETA", "64K", 65536);
  expectValue("MCCL_ALPHA_BETA", "0", 32 * 1024);     /* below 1: the default, 32 KiB */
  expectValue("MCCL_UNIFIED_COLLECTIVE", "0", 0);
  expectValue("MCCL_UNIFIED_COLLECTIVE", "2", 1);
  /* The public accessor the torch shim uses reads the same table, and refuses other names. */
  int64_t v = -5;
  EXPECT(mcclGetEnvInt("MCCL_PIPELINE_DEPTH", &v) == mcclSuccess && v == depth_default, "mcclGetEnvInt: %lld", (long long)v);
  EXPECT(mcclGetEnvInt("MCCL_SOCKET_IFNAME", &v) == mcclInvalidArgument, "a string parameter is not an integer");
  EXPECT(mcclGetEnvInt("MCCL_NO_SUCH", &v) == mcclInvalidArgument, "an unknown name is refused");
  EXPECT(mcclGetEnvInt(NULL, &v) == mcclInvalidArgument && mcclGetEnvInt("MCCL_PIPELINE_DEPTH", NULL) == mcclInvalidArgument,
         "NULL arguments are refused");
  return harnessExit("test_param");
}
