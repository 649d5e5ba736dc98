/*
 * platform.h: every decision the C core makes about what the operating system offers, in one
 * place (layer "core"). Code outside this header tests only the MCCL_HAVE_* macros below, never
 * __linux__ or __APPLE__ directly.
 *
 * The Linux build (the Makefile's default CFLAGS define _GNU_SOURCE) uses the Linux calls listed
 * here. Every other build takes the portable branch, which is the one macOS compiles: a Linux
 * build WITHOUT _GNU_SOURCE (`make posix-check`: -std=c11 -D_POSIX_C_SOURCE=200809L) compiles and
 * runs exactly that branch, so the macOS code is built and tested on Linux too. The only code that
 * neither build compiles is the two lines that exist on macOS alone (MCCL_HAVE_SETNAME_SELF and
 * SO_NOSIGPIPE, below).
 *
 * Each macro is 0 or 1, so test it with #if (a misspelt name then reads as 0; posix-check builds
 * with -Wundef, which reports it).
 *
 *   MCCL_HAVE_SOCK_CLOEXEC  socket(..., SOCK_STREAM | SOCK_CLOEXEC, 0): the descriptor is
 *                           close-on-exec from the start. Else socket() + fcntl(FD_CLOEXEC)
 *                           (transport/socket.c: mcclSocketOpen).
 *   MCCL_HAVE_ACCEPT4       accept4(..., SOCK_CLOEXEC). Else accept() + fcntl(FD_CLOEXEC), and
 *                           O_NONBLOCK cleared: BSD and macOS hand an accepted socket the
 *                           listening socket's O_NONBLOCK, Linux never does, and callers expect
 *                           Linux's blocking socket (transport/socket.c: mcclSocketAccept).
 *   MCCL_HAVE_AFFINITY      sched_getaffinity with CPU_ALLOC'd masks: the CPUs this process may
 *                           run on. Else every online CPU (sysconf), as core/host.h documents.
 *   MCCL_HAVE_PROCFS        /proc/sys/kernel/random/boot_id names the machine and the inode of
 *                           /proc/self/ns/net the network namespace. Else the host name and "-"
 *                           (core/host.h).
 *   MCCL_HAVE_GETTID        syscall(SYS_gettid) is the thread id in log lines (the kernel's, as
 *                           top -H and /proc show it). Else a number the library gives each
 *                           thread the first time it logs (1, 2, ... in the order they log).
 *   MCCL_HAVE_GETRANDOM     getrandom() for the communicator's secret. Else /dev/urandom.
 *   MCCL_HAVE_SETNAME_OF    pthread_setname_np(thread, name): any thread can be named, so the
 *                           creator names a new thread before it runs.
 *   MCCL_HAVE_SETNAME_SELF  pthread_setname_np(name) names the calling thread only (macOS,
 *                           where it needs _DARWIN_C_SOURCE when _POSIX_C_SOURCE is defined).
 *                           With neither, threads keep the process's name.
 *   MCCL_MSG_NOSIGNAL       the flag for every send()/sendmsg() on a socket, so that writing to
 *                           a peer that has closed returns EPIPE instead of raising SIGPIPE:
 *                           MSG_NOSIGNAL (POSIX.1-2008; Linux, the BSDs), else 0, and then
 *                           every socket must carry SO_NOSIGPIPE instead (macOS), which
 *                           mcclSocketOpen, mcclSocketAccept and mcclSocketTune set wherever the
 *                           option exists. With neither the build stops here.
 *   MCCL_HAVE_COND_CLOCK    pthread_condattr_setclock(CLOCK_MONOTONIC) (POSIX clock selection:
 *                           Linux, the BSDs): timed waits on condition variables count on the
 *                           monotonic clock. Else (macOS) pthread_cond_timedwait_relative_np,
 *                           which waits a relative time, also unaffected by a step of the wall
 *                           clock. debug.c's mcclCondInit / mcclCondWaitUntil hide the difference.
 *   MCCL_HAVE_THREAD_CPUTIME  clock_gettime(CLOCK_THREAD_CPUTIME_ID): the CPU time of the calling
 *                           thread (POSIX thread CPU-time clocks: Linux, macOS 10.12 and later).
 *                           Else mcclThreadCpuNs reports -1 and the sender thread's load rule is
 *                           off (transport/tcp.h, MCCL_SEND_THREAD_LOAD).
 *   IFF_UP, IFF_LOOPBACK    the BSD interface flags getifaddrs reports. glibc shows them only
 *                           with _DEFAULT_SOURCE or _GNU_SOURCE (macOS only without
 *                           _POSIX_C_SOURCE or with _DARWIN_C_SOURCE); when hidden they are
 *                           defined here with the values every BSD-derived stack uses.
 */
#ifndef MCCL_CORE_PLATFORM_H_
#define MCCL_CORE_PLATFORM_H_

#include <net/if.h>
#include <sys/socket.h>
#include <time.h>

#if defined(__linux__) && defined(_GNU_SOURCE)
#define MCCL_PLATFORM_LINUX_GNU 1
#else
#define MCCL_PLATFORM_LINUX_GNU 0
#endif

#define MCCL_HAVE_SOCK_CLOEXEC MCCL_PLATFORM_LINUX_GNU
#define MCCL_HAVE_ACCEPT4 MCCL_PLATFORM_LINUX_GNU
#define MCCL_HAVE_AFFINITY MCCL_PLATFORM_LINUX_GNU
#define MCCL_HAVE_PROCFS MCCL_PLATFORM_LINUX_GNU
#define MCCL_HAVE_GETTID MCCL_PLATFORM_LINUX_GNU
#define MCCL_HAVE_GETRANDOM MCCL_PLATFORM_LINUX_GNU
#define MCCL_HAVE_SETNAME_OF MCCL_PLATFORM_LINUX_GNU

#if defined(__APPLE__) && (!defined(_POSIX_C_SOURCE) || defined(_DARWIN_C_SOURCE))
#define MCCL_HAVE_SETNAME_SELF 1
#else
#define MCCL_HAVE_SETNAME_SELF 0
#endif

#if defined(__APPLE__)
#define MCCL_HAVE_COND_CLOCK 0
#else
#define MCCL_HAVE_COND_CLOCK 1
#endif

#if defined(CLOCK_THREAD_CPUTIME_ID)
#define MCCL_HAVE_THREAD_CPUTIME 1
#else
#define MCCL_HAVE_THREAD_CPUTIME 0
#endif

#if defined(MSG_NOSIGNAL)
#define MCCL_MSG_NOSIGNAL MSG_NOSIGNAL
#elif defined(SO_NOSIGPIPE)
#define MCCL_MSG_NOSIGNAL 0
#else
#error "neither MSG_NOSIGNAL nor SO_NOSIGPIPE: writing to a closed peer would raise SIGPIPE (on macOS, define _DARWIN_C_SOURCE)"
#endif

#ifndef IFF_UP
#define IFF_UP 0x1
#endif
#ifndef IFF_LOOPBACK
#define IFF_LOOPBACK 0x8
#endif

#endif /* MCCL_CORE_PLATFORM_H_ */
