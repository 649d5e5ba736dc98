/*
 * fuzz_common.h: what the fuzz targets and the seed generator share: the expectations a fuzzed
 * hello is checked against, and the layout of fuzz_rx's input (a script of receives to post,
 * then the bytes "rank 1" sends). Header-only.
 */
#ifndef MCCL_FUZZ_COMMON_H_
#define MCCL_FUZZ_COMMON_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "transport/wire.h"

/* ---- fuzz_wire ------------------------------------------------------------------------------
 * Input: mode u8 | cap u8 | who u8 | then 48 bytes (hello or frame header) or 96 (two headers).
 *   mode & 3: 0 hello checked as a HELLO, 1 as an ACK, 2 one frame header, 3 two frame headers
 *             (each checked, then the first matched against the second)
 *   mode & 4: P2P frames allowed
 *   cap:      size of the reason buffer (0: none, NULL)
 *   who:      this rank (who % FUZZ_NRANKS); for an ACK, the rank dialled is (who / 16) % FUZZ_NRANKS
 */
#define FUZZ_NRANKS 8
#define FUZZ_GENERATION 3
#define FUZZ_COMM_HASH 0x5a5aa5a5c3c33c3cull
static const uint8_t kFuzzToken[MCCL_TOKEN_BYTES] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
                                                     0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01};

/* ---- fuzz_rx --------------------------------------------------------------------------------
 * Input: a header, receive descriptors, then the stream rank 1 sends to rank 0.
 *   u8 ncoll (& 7)   collective receives posted on rank 1's connection, in order
 *   u8 np2p (& 7)    point-to-point receives
 *   u8 flags         bit 0: point-to-point hooks installed (else P2P frames are errors);
 *                    bit 1: shut rank 1's sending side once the stream is written;
 *                    bits 4-7: chunking seed (0: the whole stream in one write)
 *   ncoll x 16 bytes: coll u8, dtype u8, op u8, step u8, seq u32, count u32 (& 0xffff),
 *                     offset u16, length u16 (& 1023: the receive buffer's size), root u8,
 *                     post_at u8 (the chunk before which it is posted; 255: at the end)
 *   np2p x 8 bytes:   tag u8, peer u8 (bit 0: 1 = rank 1, 0 = any source), dtype u8,
 *                     count u16 (& 1023), timeout_ms u8 (0: none), post_at u8, pad u8
 *   the rest: rank 1's bytes, written in chunks between progress rounds.
 */
#define FUZZ_RX_COLL_BYTES 16
#define FUZZ_RX_P2P_BYTES 8

/* A cursor over the fuzzer's bytes; reads past the end give zeros. */
typedef struct {
  const uint8_t* p;
  size_t left;
} fuzzCursor;

static inline uint64_t fuzzTake(fuzzCursor* c, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) {
    uint64_t b = 0;
    if (c->left > 0) {
      b = *c->p++;
      c->left--;
    }
    v |= b << (8 * i);
  }
  return v;
}

/* Little-endian appends, for the seed generator. */
static inline size_t fuzzPut(uint8_t* out, size_t pos, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) out[pos + (size_t)i] = (uint8_t)(v >> (8 * i));
  return pos + (size_t)bytes;
}

#endif
