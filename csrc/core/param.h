/*
 * param.h: MCCL_* environment parameters, read once per process (layer "core").
 *
 * This is the only module that reads the environment. Every parameter is listed in the table in
 * param.c and documented in docs/ENVIRONMENT.md; the first access reads all of them and logs
 * each value that was set at INFO.
 */
#ifndef MCCL_PARAM_H_
#define MCCL_PARAM_H_

#include <stdint.h>

/* An integer parameter (bytes, counts, milliseconds), or its default when unset or malformed.
 * `name` must be one of the table's names. */
int64_t mcclParamInt(const char* name);

/* A string parameter, or NULL when unset. */
const char* mcclParamString(const char* name);

/* Read every parameter from the environment again. For tests only: a forked rank whose parent
 * already read them (listening for the store reads MCCL_TCP_CONGESTION) sets its own with setenv
 * and then calls this (tests/c/harness.h: harnessSetenv). The caller must be the only thread of
 * the process using the library; choices cached elsewhere (MCCL_ALGO's, the logger's level) are
 * not re-read. */
void mcclParamReload(void);

/* Log every parameter that is set (called once by the logger). */
void mcclParamLogAll(void);

#endif
