/*
 * reduce.c: the element-wise reduction kernels of MCCL (see reduce.h for the contract).
 *
 * Layout. Every (datatype, op) pair has one tight loop, written once as a macro instantiation
 * inside a per-datatype inline function; reduceBody() switches on (datatype, op) once per call and
 * runs that loop over the whole array, so nothing is decided per element. The loops are plain
 * indexed loops with branch-free bodies, which GCC and Clang auto-vectorize at -O3.
 *
 * SIMD dispatch. reduceBody() is compiled twice: once for the baseline target (SSE2 on x86-64,
 * NEON on arm64) and, on x86-64 with GCC or Clang, once more with AVX2 and F16C enabled, where
 * float16 additionally uses the hardware conversion instructions. The choice is made at run time
 * from CPUID, once per process. Both builds produce bitwise identical results, up to which NaN
 * payload survives when both operands are NaN (the compilers may swap the operands of a
 * commutative instruction): every conversion below rounds to nearest even and quiets NaNs exactly
 * as the F16C instructions do.
 *
 * Aliasing. dst may be exactly a or b. Each loop reads element i of both operands before it
 * writes element i of dst, so no pointer is declared restrict; the compilers vectorize anyway
 * (they version the loop on a runtime overlap check that exact aliasing passes).
 *
 * Alignment. Every pointer must be aligned to its element size, as any C array of that type is.
 */
#include "reduce/reduce.h"

#include <stdatomic.h>
#include <string.h>

#ifdef __FAST_MATH__
#error "reduce.c relies on IEEE semantics (NaN tests, exact rounding); build it without -ffast-math"
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define MCCL_REDUCE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define MCCL_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#else
#define MCCL_REDUCE_X86 0
#endif

#if defined(__GNUC__)
#define MCCL_INLINE static inline __attribute__((always_inline))
#else
#define MCCL_INLINE static inline
#endif

/* Test hook, deliberately not in reduce.h: with `on` nonzero every later call uses the portable
 * (baseline) kernels even where AVX2/F16C is available, so tests/c/test_reduce.c can check both
 * builds on one machine; with `on` zero the CPU is probed again. Not for library code. */
void mcclReduceForcePortable(int on);

/* ---------------------------------------------------------------------------------------------
 * Scalar conversions.
 *
 * All of them work on the bit patterns with integer operations (plus one exact int-to-float
 * conversion), so they give the same bits whatever the floating-point environment (rounding mode,
 * flush-to-zero) is. They are written without branches (the ternaries become selects) so that
 * the loops that call them vectorize.
 */

MCCL_INLINE uint32_t floatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

MCCL_INLINE float floatFromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* binary16 to fp32. Every binary16 value is exactly representable in fp32, so no rounding
 * happens. Normal numbers only need the exponent rebiased from 15 to 127. Subnormal numbers are
 * mantissa * 2^-24: the mantissa (< 1024) converts to float exactly, and subtracting 24 from that
 * float's exponent field scales it exactly (the result is a normal fp32 number, so flush-to-zero
 * modes cannot touch it); zero stays zero. Infinities keep a zero mantissa; NaNs keep their
 * payload and get the quiet bit set, as the x86 F16C instruction does, so that a signaling NaN
 * never escapes as such. */
MCCL_INLINE float halfToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu; /* Exponent and mantissa bits without the sign. */
  uint32_t normal = (em << 13) + (112u << 23);
  uint32_t special = (em << 13) | 0x7f800000u | (em > 0x7c00u ? 0x00400000u : 0u);
  uint32_t subnormal = floatBits((float)(int32_t)em) - (em != 0 ? 24u << 23 : 0u);
  uint32_t bits = em < 0x0400u ? subnormal : em < 0x7c00u ? normal : special;
  return floatFromBits(sign | bits);
}

/* fp32 to binary16, rounding to nearest with ties to even.
 * - NaN becomes a quiet NaN with the top 10 payload bits kept (the F16C result); it never becomes
 *   an infinity because the quiet bit 0x0200 is set.
 * - |f| >= 65520 (halfway between the largest finite half, 65504, and the next power of two)
 *   rounds to infinity, and so do the infinities themselves.
 * - Normal results: rebias the exponent, then add 0xfff plus the lowest kept bit before dropping
 *   13 bits. That rounds up exactly when the dropped bits exceed half an ulp, or equal it and the
 *   kept mantissa is odd; a carry out of the mantissa correctly bumps the exponent.
 * - Subnormal results (|f| < 2^-14): make the implicit one explicit and shift right so the unit
 *   is 2^-24, with the same round-to-nearest-even trick. The shift is clamped to [14, 31], which
 *   covers every case (anything below 2^-25 rounds to zero, and 2^-25 itself ties to even zero)
 *   and keeps the shift well defined in lanes whose result is not selected. A mantissa that
 *   rounds up to 0x400 is exactly the encoding of the smallest normal, 2^-14. */
MCCL_INLINE uint16_t floatToHalf(float f) {
  uint32_t x = floatBits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  uint32_t nan = 0x7e00u | ((ax >> 13) & 0x03ffu);
  uint32_t normal = (ax - (112u << 23) + 0x0fffu + ((ax >> 13) & 1u)) >> 13;
  uint32_t e = ax >> 23;
  uint32_t shift = 126u - (e < 95u ? 95u : e > 112u ? 112u : e);
  uint32_t m = (ax & 0x007fffffu) | 0x00800000u;
  uint32_t subnormal = (m + (1u << (shift - 1u)) - 1u + ((m >> shift) & 1u)) >> shift;
  uint32_t bits = ax > 0x7f800000u   ? nan
                  : ax >= 0x477ff000u ? 0x7c00u
                  : ax >= 0x38800000u ? normal
                                      : subnormal;
  return (uint16_t)(sign | bits);
}

/* bfloat16 to fp32: bfloat16 is the top half of an fp32, so this is exact. A NaN gets the quiet
 * bit set, the same rule as for binary16. */
MCCL_INLINE float bf16ToFloat(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  uint32_t quiet = (u & 0x7fffffffu) > 0x7f800000u ? 0x00400000u : 0u;
  return floatFromBits(u | quiet);
}

/* The kernels widen bfloat16 without the quieting step: every NaN that reaches the output goes
 * through floatToBf16, which sets the quiet bit anyway, so the stored bits are the same and the
 * loop is shorter. */
MCCL_INLINE float bf16Widen(uint16_t b) { return floatFromBits((uint32_t)b << 16); }

/* fp32 to bfloat16, rounding to nearest with ties to even: add 0x7fff plus the lowest kept bit
 * and drop the low 16 bits. Because bfloat16 has fp32's exponent range the same addition handles
 * subnormals, the carry into the exponent, and overflow of values above the largest finite
 * bfloat16 to infinity. A NaN keeps its sign and top payload bits and gets the quiet bit 0x0040,
 * so it can never round into an infinity. */
MCCL_INLINE uint16_t floatToBf16(float f) {
  uint32_t x = floatBits(f);
  uint32_t nan = (x >> 16) | 0x0040u;
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)(f != f ? nan : rounded);
}

float mcclHalfToFloat(uint16_t h) { return halfToFloat(h); }
uint16_t mcclFloatToHalf(float f) { return floatToHalf(f); }
float mcclBfloat16ToFloat(uint16_t b) { return bf16ToFloat(b); }
uint16_t mcclFloatToBfloat16(float f) { return floatToBf16(f); }

/* ---------------------------------------------------------------------------------------------
 * Integer helpers.
 *
 * Signed SUM and PROD are done in the unsigned type of the same width, where wrap-around is
 * defined, and the bytes are the two's complement result (int8_t, int32_t and int64_t are
 * guaranteed two's complement). AVG needs the wrapped sum as a signed value; these helpers
 * reinterpret it without an implementation-defined conversion (compilers reduce them to nothing).
 */

MCCL_INLINE int32_t signed8(uint8_t u) { return u < 0x80u ? (int32_t)u : (int32_t)u - 256; }

MCCL_INLINE int64_t signed32(uint32_t u) {
  return u < 0x80000000u ? (int64_t)u : (int64_t)u - (int64_t)0x100000000;
}

MCCL_INLINE int64_t signed64(uint64_t u) {
  return u <= (uint64_t)INT64_MAX ? (int64_t)u : (int64_t)(u - (uint64_t)INT64_MIN) + INT64_MIN;
}

/* The divisor is at most 2^32 - 1 and positive, so dividing in int64_t never overflows (the
 * INT_MIN / -1 case cannot occur) and C's `/` truncates toward zero; the quotient's magnitude is
 * at most the dividend's, so it fits the narrow type again. */
MCCL_INLINE int8_t avgInt8(uint8_t sum, uint32_t divisor) {
  return (int8_t)((int64_t)signed8(sum) / (int64_t)divisor);
}

MCCL_INLINE int32_t avgInt32(uint32_t sum, uint32_t divisor) {
  return (int32_t)(signed32(sum) / (int64_t)divisor);
}

MCCL_INLINE int64_t avgInt64(uint64_t sum, uint32_t divisor) {
  return signed64(sum) / (int64_t)divisor;
}

/* ---------------------------------------------------------------------------------------------
 * Loop templates.
 *
 * Each expands to one loop over `count` elements in the enclosing function, whose parameters are
 * named dst, a, b (or dst, src) and count. In EXPR, `x` is a[i] (or src[i]) and `y` is b[i]. For
 * the half types x and y are already widened to fp32 and the fp32 value of EXPR is rounded once
 * by STORE.
 */

#define MCCL_LOOP2(TOUT, TIN, EXPR)           \
  do {                                        \
    TOUT* d_ = (TOUT*)dst;                    \
    const TIN* a_ = (const TIN*)a;            \
    const TIN* b_ = (const TIN*)b;            \
    for (size_t i_ = 0; i_ < count; i_++) {   \
      TIN x = a_[i_];                         \
      TIN y = b_[i_];                         \
      d_[i_] = (TOUT)(EXPR);                  \
    }                                         \
  } while (0)

#define MCCL_LOOP2_HALF(LOAD, STORE, EXPR)    \
  do {                                        \
    uint16_t* d_ = (uint16_t*)dst;            \
    const uint16_t* a_ = (const uint16_t*)a;  \
    const uint16_t* b_ = (const uint16_t*)b;  \
    for (size_t i_ = 0; i_ < count; i_++) {   \
      float x = LOAD(a_[i_]);                 \
      float y = LOAD(b_[i_]);                 \
      d_[i_] = STORE(EXPR);                   \
    }                                         \
  } while (0)

#define MCCL_LOOP1(T, EXPR)                   \
  do {                                        \
    T* d_ = (T*)dst;                          \
    const T* s_ = (const T*)src;              \
    for (size_t i_ = 0; i_ < count; i_++) {   \
      T x = s_[i_];                           \
      d_[i_] = (T)(EXPR);                     \
    }                                         \
  } while (0)

#define MCCL_LOOP1_HALF(LOAD, STORE, EXPR)    \
  do {                                        \
    uint16_t* d_ = (uint16_t*)dst;            \
    const uint16_t* s_ = (const uint16_t*)src;\
    for (size_t i_ = 0; i_ < count; i_++) {   \
      float x = LOAD(s_[i_]);                 \
      d_[i_] = STORE(EXPR);                   \
    }                                         \
  } while (0)

/* MAX and MIN of floating types propagate NaN like torch.maximum/torch.minimum: when x is NaN
 * both comparisons are false and x is chosen by `x != x`; when only y is NaN the comparison is
 * false and y is chosen. Otherwise ties (including -0 vs +0) return y, as x86 maxps/minps do,
 * which keeps the AVX2 half-type loops bitwise identical to these. */
#define MCCL_FMAX(x, y) ((((x) > (y)) | ((x) != (x))) ? (x) : (y))
#define MCCL_FMIN(x, y) ((((x) < (y)) | ((x) != (x))) ? (x) : (y))

/* ---------------------------------------------------------------------------------------------
 * Per-datatype kernels. Each switch runs once per call. Ops that the datatype does not support
 * leave dst untouched (mcclReduce has already filtered them out).
 */

/* SUM, PROD and the bitwise ops are the same on the bytes for signed and unsigned integers of one
 * width, so int8/uint8, int32 and int64 share these loops. */
#define MCCL_DEFINE_BITS_KERNEL(NAME, U)                                                     \
  MCCL_INLINE void NAME(void* dst, const void* a, const void* b, size_t count,              \
                        mcclRedOp_t op) {                                                   \
    switch (op) {                                                                           \
      case mcclSum: MCCL_LOOP2(U, U, x + y); break;                                         \
      case mcclProd: MCCL_LOOP2(U, U, x * y); break;                                        \
      case mcclBand: MCCL_LOOP2(U, U, x & y); break;                                        \
      case mcclBor: MCCL_LOOP2(U, U, x | y); break;                                         \
      case mcclBxor: MCCL_LOOP2(U, U, x ^ y); break;                                        \
      default: break;                                                                       \
    }                                                                                       \
  }

MCCL_DEFINE_BITS_KERNEL(reduceBits8, uint8_t)
MCCL_DEFINE_BITS_KERNEL(reduceBits32, uint32_t)
MCCL_DEFINE_BITS_KERNEL(reduceBits64, uint64_t)

/* One integer type: MAX and MIN compare in the type itself; AVG adds in the unsigned type (wrapping)
 * and, when divisor > 1, divides the wrapped sum truncating toward zero. */
#define MCCL_DEFINE_INT_KERNEL(NAME, T, U, BITS, AVG)                                        \
  MCCL_INLINE void NAME(void* dst, const void* a, const void* b, size_t count, mcclRedOp_t op, \
                        uint32_t divisor) {                                                 \
    switch (op) {                                                                           \
      case mcclMax: MCCL_LOOP2(T, T, x > y ? x : y); break;                                 \
      case mcclMin: MCCL_LOOP2(T, T, x < y ? x : y); break;                                 \
      case mcclAvg:                                                                         \
        if (divisor > 1) {                                                                  \
          MCCL_LOOP2(T, U, AVG((U)(x + y), divisor));                                       \
        } else {                                                                            \
          BITS(dst, a, b, count, mcclSum);                                                  \
        }                                                                                   \
        break;                                                                              \
      default: BITS(dst, a, b, count, op); break;                                           \
    }                                                                                       \
  }

#define MCCL_AVG_UNSIGNED(sum, divisor) ((sum) / (divisor))

MCCL_DEFINE_INT_KERNEL(reduceInt8, int8_t, uint8_t, reduceBits8, avgInt8)
MCCL_DEFINE_INT_KERNEL(reduceUint8, uint8_t, uint8_t, reduceBits8, MCCL_AVG_UNSIGNED)
MCCL_DEFINE_INT_KERNEL(reduceInt32, int32_t, uint32_t, reduceBits32, avgInt32)
MCCL_DEFINE_INT_KERNEL(reduceInt64, int64_t, uint64_t, reduceBits64, avgInt64)

/* Bool: any nonzero byte is true and every output byte is exactly 0 or 1. */
MCCL_INLINE void reduceBool(void* dst, const void* a, const void* b, size_t count,
                            mcclRedOp_t op) {
  switch (op) {
    case mcclSum:
    case mcclMax:
    case mcclBor: MCCL_LOOP2(uint8_t, uint8_t, (x | y) != 0); break;
    case mcclProd:
    case mcclMin:
    case mcclBand: MCCL_LOOP2(uint8_t, uint8_t, (x != 0) & (y != 0)); break;
    case mcclBxor: MCCL_LOOP2(uint8_t, uint8_t, (x != 0) ^ (y != 0)); break;
    default: break;
  }
}

/* fp32 and fp64 combine in their own precision; AVG is (a + b) / divisor with the divisor
 * converted to the type, one rounding for the sum and one for the quotient. */
#define MCCL_DEFINE_FLOAT_KERNEL(NAME, T)                                                    \
  MCCL_INLINE void NAME(void* dst, const void* a, const void* b, size_t count, mcclRedOp_t op, \
                        uint32_t divisor) {                                                 \
    switch (op) {                                                                           \
      case mcclSum: MCCL_LOOP2(T, T, x + y); break;                                         \
      case mcclProd: MCCL_LOOP2(T, T, x * y); break;                                        \
      case mcclMax: MCCL_LOOP2(T, T, MCCL_FMAX(x, y)); break;                               \
      case mcclMin: MCCL_LOOP2(T, T, MCCL_FMIN(x, y)); break;                               \
      case mcclAvg:                                                                         \
        if (divisor > 1) {                                                                  \
          const T fdiv = (T)divisor;                                                        \
          MCCL_LOOP2(T, T, (x + y) / fdiv);                                                 \
        } else {                                                                            \
          MCCL_LOOP2(T, T, x + y);                                                          \
        }                                                                                   \
        break;                                                                              \
      default: break;                                                                       \
    }                                                                                       \
  }

MCCL_DEFINE_FLOAT_KERNEL(reduceFloat32, float)
MCCL_DEFINE_FLOAT_KERNEL(reduceFloat64, double)

/* float16 and bfloat16: both operands are widened to fp32 (exactly), combined in fp32 with fp32
 * rounding, AVG divides that fp32 sum by (float)divisor in fp32, and the fp32 result is rounded
 * to the half type once, to nearest even. MAX and MIN return one operand unchanged (up to NaN
 * quieting) since widening and narrowing a half value is the identity. */
#define MCCL_DEFINE_HALF_KERNEL(NAME, LOAD, STORE)                                           \
  MCCL_INLINE void NAME(void* dst, const void* a, const void* b, size_t count, mcclRedOp_t op, \
                        uint32_t divisor) {                                                 \
    switch (op) {                                                                           \
      case mcclSum: MCCL_LOOP2_HALF(LOAD, STORE, x + y); break;                             \
      case mcclProd: MCCL_LOOP2_HALF(LOAD, STORE, x * y); break;                            \
      case mcclMax: MCCL_LOOP2_HALF(LOAD, STORE, MCCL_FMAX(x, y)); break;                   \
      case mcclMin: MCCL_LOOP2_HALF(LOAD, STORE, MCCL_FMIN(x, y)); break;                   \
      case mcclAvg:                                                                         \
        if (divisor > 1) {                                                                  \
          const float fdiv = (float)divisor;                                                \
          MCCL_LOOP2_HALF(LOAD, STORE, (x + y) / fdiv);                                     \
        } else {                                                                            \
          MCCL_LOOP2_HALF(LOAD, STORE, x + y);                                              \
        }                                                                                   \
        break;                                                                              \
      default: break;                                                                       \
    }                                                                                       \
  }

MCCL_DEFINE_HALF_KERNEL(reduceFloat16, halfToFloat, floatToHalf)
MCCL_DEFINE_HALF_KERNEL(reduceBfloat16, bf16Widen, floatToBf16)

/* The whole (datatype, op) table. Inlined into each SIMD build below. */
MCCL_INLINE void reduceBody(void* dst, const void* a, const void* b, size_t count,
                            mcclDataType_t datatype, mcclRedOp_t op, uint32_t divisor) {
  switch (datatype) {
    case mcclInt8: reduceInt8(dst, a, b, count, op, divisor); break;
    case mcclUint8: reduceUint8(dst, a, b, count, op, divisor); break;
    case mcclInt32: reduceInt32(dst, a, b, count, op, divisor); break;
    case mcclInt64: reduceInt64(dst, a, b, count, op, divisor); break;
    case mcclFloat16: reduceFloat16(dst, a, b, count, op, divisor); break;
    case mcclFloat32: reduceFloat32(dst, a, b, count, op, divisor); break;
    case mcclFloat64: reduceFloat64(dst, a, b, count, op, divisor); break;
    case mcclBfloat16: reduceBfloat16(dst, a, b, count, op, divisor); break;
    case mcclBool: reduceBool(dst, a, b, count, op); break;
    default: break;
  }
}

/* dst = src / divisor under the same rules as AVG (divisor >= 2 here). Bool has no division. */
MCCL_INLINE void divideBody(void* dst, const void* src, size_t count, mcclDataType_t datatype,
                            uint32_t divisor) {
  switch (datatype) {
    case mcclInt8: MCCL_LOOP1(int8_t, (int64_t)x / (int64_t)divisor); break;
    case mcclUint8: MCCL_LOOP1(uint8_t, x / divisor); break;
    case mcclInt32: MCCL_LOOP1(int32_t, (int64_t)x / (int64_t)divisor); break;
    case mcclInt64: MCCL_LOOP1(int64_t, x / (int64_t)divisor); break;
    case mcclFloat32: {
      const float fdiv = (float)divisor;
      MCCL_LOOP1(float, x / fdiv);
      break;
    }
    case mcclFloat64: {
      const double fdiv = (double)divisor;
      MCCL_LOOP1(double, x / fdiv);
      break;
    }
    case mcclFloat16: {
      const float fdiv = (float)divisor;
      MCCL_LOOP1_HALF(halfToFloat, floatToHalf, x / fdiv);
      break;
    }
    case mcclBfloat16: {
      const float fdiv = (float)divisor;
      MCCL_LOOP1_HALF(bf16Widen, floatToBf16, x / fdiv);
      break;
    }
    default: break;
  }
}

/* ---------------------------------------------------------------------------------------------
 * The two builds.
 */

static void reducePortable(void* dst, const void* a, const void* b, size_t count,
                           mcclDataType_t datatype, mcclRedOp_t op, uint32_t divisor) {
  reduceBody(dst, a, b, count, datatype, op, divisor);
}

static void dividePortable(void* dst, const void* src, size_t count, mcclDataType_t datatype,
                           uint32_t divisor) {
  divideBody(dst, src, count, datatype, divisor);
}

#if MCCL_REDUCE_X86

/* F16C converts 8 binary16 values to fp32 and back per instruction. vcvtph2ps is exact and sets
 * the quiet bit of NaNs; vcvtps2ph with immediate 0 rounds to nearest even regardless of MXCSR,
 * keeps the top payload bits of a NaN (setting the quiet bit) and produces subnormals (FTZ does
 * not apply to it). That is bit for bit what halfToFloat and floatToHalf do. */
MCCL_TARGET_AVX2 MCCL_INLINE __m256 f16cLoad(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(const void*)p));
}

MCCL_TARGET_AVX2 MCCL_INLINE void f16cStore(uint16_t* p, __m256 v) {
  _mm_storeu_si128((__m128i*)(void*)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

/* bfloat16 by 16 values at a time. Interleaving zero words below the bfloat16 words (unpacklo and
 * unpackhi, which work within each 128-bit lane) widens them to fp32 exactly; bf16Narrow applies
 * floatToBf16's rounding to both halves and packs them back, and because packus also works within
 * 128-bit lanes the original element order comes back without a permute. */
MCCL_TARGET_AVX2 MCCL_INLINE __m256 bf16WidenLo(__m256i v) {
  return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
}

MCCL_TARGET_AVX2 MCCL_INLINE __m256 bf16WidenHi(__m256i v) {
  return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
}

/* Round to nearest even as floatToBf16 does, and leave the result in the low 16 bits of each
 * 32-bit lane: NaN lanes take x | 0x00400000 (quiet) instead of the rounding addition. */
MCCL_TARGET_AVX2 MCCL_INLINE __m256i bf16Round(__m256 v) {
  __m256i x = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
  __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), is_nan);
  return _mm256_srli_epi32(_mm256_castps_si256(r), 16);
}

MCCL_TARGET_AVX2 MCCL_INLINE __m256i bf16Narrow(__m256 lo, __m256 hi) {
  return _mm256_packus_epi32(bf16Round(lo), bf16Round(hi));
}

/* maxps(x, y) is x > y ? x : y, which returns y when either is NaN; blending x back in where x is
 * NaN gives exactly MCCL_FMAX(x, y). Likewise for minps and MCCL_FMIN. */
MCCL_TARGET_AVX2 MCCL_INLINE __m256 avx2Max(__m256 x, __m256 y) {
  return _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

MCCL_TARGET_AVX2 MCCL_INLINE __m256 avx2Min(__m256 x, __m256 y) {
  return _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Vector loops over the whole multiples of the vector width; `i` is left at the first element
 * they did not cover. In EXPR, x and y are __m256 of fp32 operands. */
#define MCCL_F16C_LOOP2(EXPR)                                         \
  for (; i + 8 <= count; i += 8) {                                    \
    __m256 x = f16cLoad(a16 + i);                                     \
    __m256 y = f16cLoad(b16 + i);                                     \
    f16cStore(d16 + i, (EXPR));                                       \
  }

#define MCCL_BF16_LOOP2(EXPR)                                         \
  for (; i + 16 <= count; i += 16) {                                  \
    __m256i va = _mm256_loadu_si256((const __m256i*)(const void*)(a16 + i)); \
    __m256i vb = _mm256_loadu_si256((const __m256i*)(const void*)(b16 + i)); \
    __m256 x = bf16WidenLo(va);                                       \
    __m256 y = bf16WidenLo(vb);                                       \
    __m256 lo = (EXPR);                                               \
    x = bf16WidenHi(va);                                              \
    y = bf16WidenHi(vb);                                              \
    __m256i packed = bf16Narrow(lo, (EXPR));                          \
    _mm256_storeu_si256((__m256i*)(void*)(d16 + i), packed);         \
  }

/* The op switch shared by both half types, with the same fp32 arithmetic as the portable loops:
 * one rounding to the half type at the end, AVG divides the fp32 sum in fp32. */
#define MCCL_AVX2_HALF_OPS(LOOP)                                      \
  switch (op) {                                                       \
    case mcclSum: LOOP(_mm256_add_ps(x, y)); break;                   \
    case mcclProd: LOOP(_mm256_mul_ps(x, y)); break;                  \
    case mcclMax: LOOP(avx2Max(x, y)); break;                         \
    case mcclMin: LOOP(avx2Min(x, y)); break;                         \
    case mcclAvg:                                                     \
      if (divisor > 1) {                                              \
        const __m256 fdiv = _mm256_set1_ps((float)divisor);           \
        LOOP(_mm256_div_ps(_mm256_add_ps(x, y), fdiv));               \
      } else {                                                        \
        LOOP(_mm256_add_ps(x, y));                                    \
      }                                                               \
      break;                                                          \
    default: return;                                                  \
  }

/* Vector body, then the last few elements through the portable loop, which rounds identically. */
MCCL_TARGET_AVX2 static void reduceFloat16Avx2(void* dst, const void* a, const void* b,
                                               size_t count, mcclRedOp_t op, uint32_t divisor) {
  uint16_t* d16 = (uint16_t*)dst;
  const uint16_t* a16 = (const uint16_t*)a;
  const uint16_t* b16 = (const uint16_t*)b;
  size_t i = 0;
  MCCL_AVX2_HALF_OPS(MCCL_F16C_LOOP2)
  reduceFloat16(d16 + i, a16 + i, b16 + i, count - i, op, divisor);
}

MCCL_TARGET_AVX2 static void reduceBfloat16Avx2(void* dst, const void* a, const void* b,
                                                size_t count, mcclRedOp_t op, uint32_t divisor) {
  uint16_t* d16 = (uint16_t*)dst;
  const uint16_t* a16 = (const uint16_t*)a;
  const uint16_t* b16 = (const uint16_t*)b;
  size_t i = 0;
  MCCL_AVX2_HALF_OPS(MCCL_BF16_LOOP2)
  reduceBfloat16(d16 + i, a16 + i, b16 + i, count - i, op, divisor);
}

/* The AVX2 build: the half types use the loops above; every other type runs the same C loops as
 * the portable build, which the compiler now vectorizes with 256-bit registers. */
MCCL_TARGET_AVX2 static void reduceAvx2(void* dst, const void* a, const void* b, size_t count,
                                        mcclDataType_t datatype, mcclRedOp_t op,
                                        uint32_t divisor) {
  if (datatype == mcclFloat16) {
    reduceFloat16Avx2(dst, a, b, count, op, divisor);
  } else if (datatype == mcclBfloat16) {
    reduceBfloat16Avx2(dst, a, b, count, op, divisor);
  } else {
    reduceBody(dst, a, b, count, datatype, op, divisor);
  }
}

MCCL_TARGET_AVX2 static void divideAvx2(void* dst, const void* src, size_t count,
                                        mcclDataType_t datatype, uint32_t divisor) {
  uint16_t* d16 = (uint16_t*)dst;
  const uint16_t* s16 = (const uint16_t*)src;
  const __m256 fdiv = _mm256_set1_ps((float)divisor);
  size_t i = 0;
  if (datatype == mcclFloat16) {
    for (; i + 8 <= count; i += 8) f16cStore(d16 + i, _mm256_div_ps(f16cLoad(s16 + i), fdiv));
    divideBody(d16 + i, s16 + i, count - i, datatype, divisor);
  } else if (datatype == mcclBfloat16) {
    for (; i + 16 <= count; i += 16) {
      __m256i v = _mm256_loadu_si256((const __m256i*)(const void*)(s16 + i));
      __m256 lo = _mm256_div_ps(bf16WidenLo(v), fdiv);
      __m256 hi = _mm256_div_ps(bf16WidenHi(v), fdiv);
      _mm256_storeu_si256((__m256i*)(void*)(d16 + i), bf16Narrow(lo, hi));
    }
    divideBody(d16 + i, s16 + i, count - i, datatype, divisor);
  } else {
    divideBody(dst, src, count, datatype, divisor);
  }
}

/* AVX2 needs the OS to save the YMM registers, which __builtin_cpu_supports checks; F16C is
 * CPUID leaf 1, ECX bit 29 (every AVX2 CPU has it, but ask anyway). */
static int probeAvx2(void) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) return 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  return (ecx & (1u << 29)) != 0;
}

#endif /* MCCL_REDUCE_X86 */

static atomic_int force_portable = 0;

#if MCCL_REDUCE_X86
/* 0: portable build; 1: AVX2/F16C build; -1: not probed yet. Probing twice from racing threads is
 * harmless: both store the same answer. */
static atomic_int simd_level = -1;

static int simdLevel(void) {
  int level = atomic_load_explicit(&simd_level, memory_order_relaxed);
  if (level < 0) {
    level = probeAvx2();
    atomic_store_explicit(&simd_level, level, memory_order_relaxed);
  }
  if (atomic_load_explicit(&force_portable, memory_order_relaxed)) level = 0;
  return level;
}
#endif

void mcclReduceForcePortable(int on) {
  atomic_store_explicit(&force_portable, on != 0, memory_order_relaxed);
}

/* ---------------------------------------------------------------------------------------------
 * Public entry points.
 */

mcclResult_t mcclReduceCheck(mcclDataType_t datatype, mcclRedOp_t op) {
  if ((unsigned)datatype >= (unsigned)mcclNumTypes || (unsigned)op >= (unsigned)mcclNumOps) {
    return mcclInvalidArgument;
  }
  int is_float = datatype == mcclFloat16 || datatype == mcclFloat32 ||
                 datatype == mcclFloat64 || datatype == mcclBfloat16;
  int is_bitwise = op == mcclBand || op == mcclBor || op == mcclBxor;
  if (is_float && is_bitwise) return mcclUnsupported;
  if (datatype == mcclBool && op == mcclAvg) return mcclUnsupported;
  return mcclSuccess;
}

MCCL_API size_t mcclDataTypeSize(mcclDataType_t datatype) {
  switch (datatype) {
    case mcclInt8:
    case mcclUint8:
    case mcclBool: return 1;
    case mcclFloat16:
    case mcclBfloat16: return 2;
    case mcclInt32:
    case mcclFloat32: return 4;
    case mcclInt64:
    case mcclFloat64: return 8;
    default: return 0;
  }
}

void mcclReduce(void* dst, const void* a, const void* b, size_t count, mcclDataType_t datatype,
                mcclRedOp_t op, uint32_t avg_divisor) {
  if (count == 0 || mcclReduceCheck(datatype, op) != mcclSuccess) return;
#if MCCL_REDUCE_X86
  if (simdLevel() == 1) {
    reduceAvx2(dst, a, b, count, datatype, op, avg_divisor);
    return;
  }
#endif
  reducePortable(dst, a, b, count, datatype, op, avg_divisor);
}

/* A divisor of 0 or 1 leaves the values unchanged (0 is treated as 1 rather than dividing by
 * zero); bool and out-of-range types are left untouched. */
void mcclReduceDivide(void* dst, const void* src, size_t count, mcclDataType_t datatype,
                      uint32_t divisor) {
  if (count == 0 || mcclDataTypeSize(datatype) == 0 || datatype == mcclBool) return;
  if (divisor <= 1) {
    if (dst != src) memmove(dst, src, count * mcclDataTypeSize(datatype));
    return;
  }
#if MCCL_REDUCE_X86
  if (simdLevel() == 1) {
    divideAvx2(dst, src, count, datatype, divisor);
    return;
  }
#endif
  dividePortable(dst, src, count, datatype, divisor);
}
