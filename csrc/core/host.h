/*
 * host.h: what a rank publishes about where it runs, and what the others conclude from it.
 *
 * A host description is one line of three fields separated by single spaces:
 *   <machine> <netns> <cpus>
 *   machine  the kernel's boot id on Linux (/proc/sys/kernel/random/boot_id: network namespaces
 *            and containers on one machine share it), else (or when it cannot be read) the host
 *            name, "unknown" without one; host names need not be unique, boot ids are. "On
 *            Linux" means the Linux build here (core/platform.h: MCCL_HAVE_PROCFS,
 *            MCCL_HAVE_AFFINITY); the portable build (macOS, `make posix-check`) takes "elsewhere"
 *   netns    the inode of /proc/self/ns/net on Linux ("-" elsewhere): ranks with the same
 *            machine and netns reach each other's loopback addresses
 *   cpus     the CPUs this process may run on (its affinity mask on Linux, every online CPU
 *            elsewhere) as hexadecimal, least significant digit = CPUs 0-3, e.g. "ff" = CPUs 0-7;
 *            CPUs from 1024 up are left out
 * Ranks on one machine whose CPU sets overlap compete for those CPUs, whatever their network
 * namespace: that decides whether a rank can afford a second thread (core/comm.c).
 */
#ifndef MCCL_CORE_HOST_H_
#define MCCL_CORE_HOST_H_

#include <stddef.h>
#include <stdint.h>

#define MCCL_HOST_STRLEN 384   /* a description: 79 + 1 + 20 + 1 + 256 hex digits (1024 CPUs) + NUL */
#define MCCL_HOST_MAX_CPUS 1024

/* This process's description into `out` (of `cap` bytes, at least MCCL_HOST_STRLEN). */
void mcclHostDescribe(char* out, size_t cap);

/* 1 when `a` and `b` name the same machine and network namespace (each can dial the other's
 * loopback address); 0 otherwise. Descriptions that do not parse match only when equal. */
int mcclHostSameLoopback(const char* a, const char* b);

/* The ranks that compete with this one for CPUs, accumulated one description at a time:
 * `ranks` counts this rank and every other whose description names the same machine and a CPU
 * set overlapping this rank's; `mask` is the union of their CPU sets. */
typedef struct {
  char machine[80];
  uint8_t self[MCCL_HOST_MAX_CPUS / 8];
  uint8_t mask[MCCL_HOST_MAX_CPUS / 8];
  int ranks;
} mcclCpuShare;

/* Starts from this rank's own description (a description that does not parse counts as one
 * rank on one CPU). */
void mcclCpuShareInit(mcclCpuShare* s, const char* self);
/* Adds another rank's description; those of other machines, disjoint CPU sets, or that do not
 * parse change nothing. */
void mcclCpuShareAdd(mcclCpuShare* s, const char* other);
/* CPUs in the union of the sharing ranks' sets (at least 1). */
int mcclCpuShareCpus(const mcclCpuShare* s);
/* CPUs in this rank's own set (at least 1). */
int mcclCpuShareSelfCpus(const mcclCpuShare* s);

#endif /* MCCL_CORE_HOST_H_ */
