/* harness.c: checks, digests, and forking ranks under a deadline (see harness.h). */
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/param.h"

/* LeakSanitizer normally checks at exit(), which forked ranks skip (_exit keeps them from running
 * the parent's atexit handlers and flushing its stdio twice). ASan builds check them here. */
#if defined(__SANITIZE_ADDRESS__)
#define HARNESS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HARNESS_LSAN 1
#endif
#endif
#ifdef HARNESS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

int harness_failures = 0;
int harness_checks = 0;
int harness_store_port = 0;
static int report_fd = -1;

int harnessExit(const char* name) {
  printf("%s: %d checks, %d failed\n", name, harness_checks, harness_failures);
  fflush(stdout);
  return harness_failures == 0 ? 0 : 1;
}

uint64_t harnessDigest(const void* data, size_t bytes) {
  const unsigned char* p = data;
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

uint64_t harnessRandom(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void harnessSleepUs(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

void harnessReport(uint64_t digest) {
  if (report_fd < 0) return;
  ssize_t n = write(report_fd, &digest, sizeof(digest));
  (void)n;
}

mcclComm_t harnessCommInit(int rank, int nranks, mcclStore_t* store) {
  mcclCommConfig_t cfg;
  mcclCommConfigInit(&cfg);
  cfg.rank = rank;
  cfg.nranks = nranks;
  cfg.store = *store;
  cfg.name = "test";
  cfg.timeout_ms = 60000;
  cfg.peer_hint = "127.0.0.1";
  mcclComm_t comm = NULL;
  mcclResult_t res = mcclCommInitConfig(&comm, &cfg);
  if (res != mcclSuccess) {
    fprintf(stderr, "rank %d: mcclCommInitConfig: %s: %s\n", rank, mcclGetErrorString(res),
            mcclGetLastError(NULL));
    return NULL;
  }
  return comm;
}

static void* serveThread(void* arg) {
  mcclTcpStoreServe(arg, 0);
  return NULL;
}

static double nowSeconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int harnessRunRanks(int nranks, int deadline_s, harnessRankFn fn, void* arg) {
  mcclTcpStoreServer_t* server = NULL;
  int port = 0;
  if (mcclTcpStoreListen("127.0.0.1", 0, &port, &server) != mcclSuccess) {
    fprintf(stderr, "harness: cannot start the store: %s\n", mcclGetLastError(NULL));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t* pids = calloc((size_t)nranks, sizeof(pid_t));
  int (*pipes)[2] = calloc((size_t)nranks, sizeof(*pipes));
  for (int r = 0; r < nranks; r++) {
    if (pipe(pipes[r]) != 0) return 1;
    pids[r] = fork();
    if (pids[r] == 0) {
      /* Child: the parent's server is not ours to use; only its port is. Failures counted so far
       * belong to the parent's earlier runs. */
      harness_failures = 0;
      harness_checks = 0;
      for (int q = 0; q <= r; q++) close(pipes[q][0]);
      report_fd = pipes[r][1];
      harness_store_port = port;
      mcclStore_t store;
      if (mcclTcpStoreConnect("127.0.0.1", port, 10000, &store) != mcclSuccess) {
        fprintf(stderr, "rank %d: cannot reach the store: %s\n", r, mcclGetLastError(NULL));
        _exit(3);
      }
      int rc = fn(r, nranks, &store, arg);
      mcclTcpStoreClose(&store);
      fflush(stdout);
      fflush(stderr);
#ifdef HARNESS_LSAN
      if (__lsan_do_recoverable_leak_check() != 0) {
        fprintf(stderr, "rank %d: LeakSanitizer found leaks (above)\n", r);
        _exit(4);
      }
#endif
      _exit(rc != 0 || harness_failures != 0 ? 1 : 0);
    }
    close(pipes[r][1]);
  }
  pthread_t server_thread;
  pthread_create(&server_thread, NULL, serveThread, server);

  int failed = 0, alive = nranks;
  int* status = calloc((size_t)nranks, sizeof(int));
  double until = nowSeconds() + deadline_s;
  while (alive > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < nranks; r++)
        if (pids[r] == pid) {
          status[r] = st;
          pids[r] = -pids[r];
          alive--;
          if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "harness: rank %d of %d %s %d\n", r, nranks,
                    WIFEXITED(st) ? "exited with status" : "was killed by signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failed = 1;
          }
        }
      continue;
    }
    if (nowSeconds() > until) {
      fprintf(stderr, "harness: deadline of %d s passed with %d of %d ranks still running; killing them\n",
              deadline_s, alive, nranks);
      for (int r = 0; r < nranks; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL);
      while (waitpid(-1, NULL, 0) > 0) {}
      failed = 1;
      break;
    }
    harnessSleepUs(2000);
  }
  mcclTcpStoreStop(server);
  pthread_join(server_thread, NULL);
  mcclTcpStoreFree(server);

  /* Every rank must report the same digests in the same order. */
  uint64_t first[4096];
  ssize_t first_len = -1;
  for (int r = 0; r < nranks && !failed; r++) {
    uint64_t got[4096];
    ssize_t len = 0, n;
    while ((n = read(pipes[r][0], (char*)got + len, sizeof(got) - (size_t)len)) > 0) len += n;
    if (first_len < 0) {
      memcpy(first, got, (size_t)len);
      first_len = len;
    } else if (len != first_len || memcmp(first, got, (size_t)len) != 0) {
      fprintf(stderr, "harness: rank %d's results differ bitwise from rank 0's\n", r);
      failed = 1;
    }
  }
  for (int r = 0; r < nranks; r++) close(pipes[r][0]);
  free(pids);
  free(pipes);
  free(status);
  harness_checks++;
  if (failed) harness_failures++;
  return failed;
}

void harnessSetenv(const char* name, const char* value) {
  setenv(name, value, 1);
  mcclParamReload();
}

char* harnessSetenvSaved(const char* name, const char* value) {
  const char* now = getenv(name);
  char* was = now != NULL ? strdup(now) : NULL;
  harnessSetenv(name, value);
  return was;
}

void harnessRestoreEnv(const char* name, char* was) {
  if (was != NULL) setenv(name, was, 1);
  else unsetenv(name);
  mcclParamReload();
  free(was);
}

double harnessSeconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
