/*
 * host.c: a rank's host description (core/host.h) and the conclusions drawn from the others'.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/host.h"
#include "core/platform.h"

#if MCCL_HAVE_AFFINITY
#include <sched.h>
#endif
#if MCCL_HAVE_PROCFS
#include <sys/stat.h>
#endif

typedef struct {
  char machine[80];
  char netns[24];
  uint8_t cpus[MCCL_HOST_MAX_CPUS / 8];
} hostFields;

static int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* 0 on success; -1 when `s` is not "<machine> <netns> <hex cpus>" within the field sizes. */
static int parse(const char* s, hostFields* f) {
  memset(f, 0, sizeof(*f));
  const char* sp1 = strchr(s, ' ');
  const char* sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
  if (sp1 == NULL || sp2 == NULL || sp1 == s || sp2 == sp1 + 1) return -1;
  size_t mlen = (size_t)(sp1 - s), nlen = (size_t)(sp2 - sp1 - 1);
  const char* hex = sp2 + 1;
  size_t hlen = strlen(hex);
  if (mlen >= sizeof(f->machine) || nlen >= sizeof(f->netns) || hlen == 0 || hlen > MCCL_HOST_MAX_CPUS / 4) return -1;
  memcpy(f->machine, s, mlen);
  memcpy(f->netns, sp1 + 1, nlen);
  for (size_t i = 0; i < hlen; i++) { /* the last digit holds CPUs 0-3 */
    int d = hexDigit(hex[hlen - 1 - i]);
    if (d < 0) return -1;
    f->cpus[i / 2] |= (uint8_t)(d << (4 * (i % 2)));
  }
  return 0;
}

void mcclHostDescribe(char* out, size_t cap) {
  char machine[80] = "", netns[24] = "-";
#if MCCL_HAVE_PROCFS
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f != NULL) {
    if (fgets(machine, sizeof(machine), f) == NULL) machine[0] = '\0';
    fclose(f);
    machine[strcspn(machine, "\n")] = '\0';
  }
  struct stat st;
  if (stat("/proc/self/ns/net", &st) == 0) snprintf(netns, sizeof(netns), "%llu", (unsigned long long)st.st_ino);
#endif
  if (machine[0] == '\0' && gethostname(machine, sizeof(machine)) != 0) machine[0] = '\0';
  machine[sizeof(machine) - 1] = '\0';
  if (machine[0] == '\0') snprintf(machine, sizeof(machine), "unknown");
  for (char* c = machine; *c; c++)
    if (*c == ' ') *c = '_'; /* fields are space-separated */

  uint8_t cpus[MCCL_HOST_MAX_CPUS / 8] = {0};
  int known = 0;
#if MCCL_HAVE_AFFINITY
  /* A mask as wide as the kernel's (a cpu_set_t holds 1024 CPUs; the call fails on machines
   * configured for more), of which the first MCCL_HOST_MAX_CPUS are kept. */
  const int widest = 16384;
  cpu_set_t* set = CPU_ALLOC(widest);
  size_t size = CPU_ALLOC_SIZE(widest);
  if (set != NULL && sched_getaffinity(0, size, set) == 0 && CPU_COUNT_S(size, set) > 0) {
    for (int c = 0; c < MCCL_HOST_MAX_CPUS; c++)
      if (CPU_ISSET_S(c, size, set)) cpus[c / 8] |= (uint8_t)(1u << (c % 8));
    known = 1;
  }
  if (set != NULL) CPU_FREE(set);
#endif
  if (!known) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > MCCL_HOST_MAX_CPUS) n = MCCL_HOST_MAX_CPUS;
    for (long c = 0; c < n; c++) cpus[c / 8] |= (uint8_t)(1u << (c % 8));
  }
  int top = MCCL_HOST_MAX_CPUS / 8 - 1; /* the highest non-zero byte leads, without padding */
  while (top > 0 && cpus[top] == 0) top--;
  char hex[MCCL_HOST_MAX_CPUS / 4 + 1];
  size_t len = 0;
  len += (size_t)snprintf(hex, sizeof(hex), "%x", cpus[top]);
  for (int b = top - 1; b >= 0; b--) len += (size_t)snprintf(hex + len, sizeof(hex) - len, "%02x", cpus[b]);
  snprintf(out, cap, "%s %s %s", machine, netns, hex);
}

int mcclHostSameLoopback(const char* a, const char* b) {
  hostFields fa, fb;
  if (parse(a, &fa) != 0 || parse(b, &fb) != 0) return strcmp(a, b) == 0;
  return strcmp(fa.machine, fb.machine) == 0 && strcmp(fa.netns, fb.netns) == 0;
}

void mcclCpuShareInit(mcclCpuShare* s, const char* self) {
  memset(s, 0, sizeof(*s));
  s->ranks = 1;
  hostFields f;
  if (parse(self, &f) != 0) return;
  memcpy(s->machine, f.machine, sizeof(s->machine));
  memcpy(s->self, f.cpus, sizeof(s->self));
  memcpy(s->mask, f.cpus, sizeof(s->mask));
}

void mcclCpuShareAdd(mcclCpuShare* s, const char* other) {
  hostFields f;
  if (s->machine[0] == '\0' || parse(other, &f) != 0 || strcmp(f.machine, s->machine) != 0) return;
  int overlap = 0;
  for (size_t b = 0; b < sizeof(s->self) && !overlap; b++) overlap = (s->self[b] & f.cpus[b]) != 0;
  if (!overlap) return;
  s->ranks++;
  for (size_t b = 0; b < sizeof(s->mask); b++) s->mask[b] |= f.cpus[b];
}

static int countCpus(const uint8_t* set, size_t bytes) {
  int n = 0;
  for (size_t b = 0; b < bytes; b++) n += __builtin_popcount(set[b]);
  return n > 0 ? n : 1;
}

int mcclCpuShareCpus(const mcclCpuShare* s) { return countCpus(s->mask, sizeof(s->mask)); }

int mcclCpuShareSelfCpus(const mcclCpuShare* s) { return countCpus(s->self, sizeof(s->self)); }
