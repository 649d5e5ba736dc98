/*
 * frames.h: the collective DATA frame header the transport tests write as "the peer" and post as
 * receives: an all-reduce (float32 sum) of 2^20 elements, segment `step` of `length` bytes at
 * offset step x length, collective `seq`. Used by tests/c/test_park.c and tests/c/test_lowat.c.
 * Header-only.
 */
#ifndef MCCL_TEST_FRAMES_H_
#define MCCL_TEST_FRAMES_H_

#include <stdint.h>
#include <string.h>

#include "core/comm.h"
#include "transport/wire.h"

static inline mcclFrame testDataFrame(uint32_t step, uint32_t length, uint64_t seq) {
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  f.type = MCCL_FRAME_DATA;
  f.coll = MCCL_COLL_ALLREDUCE;
  f.dtype = mcclFloat32;
  f.op = mcclSum;
  f.seq = seq;
  f.count = 1 << 20;
  f.offset = (uint64_t)step * length;
  f.length = length;
  f.step = step;
  return f;
}

#endif
