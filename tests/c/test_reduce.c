/*
 * test_reduce.c: exhaustive checks of the reduction kernels (csrc/reduce/reduce.c).
 *
 * Every expected value is computed here by reference code that shares nothing with the kernels:
 * integers in 64-bit unsigned arithmetic masked to the type's width, floating types in double
 * precision, with binary16 and bfloat16 decoded and encoded through frexp/ldexp/rint rather than
 * bit tricks. For fp32 results (and the fp32 intermediate of the half types) the reference
 * computes `x op y` in double and rounds to float; for +, * and / of two floats that equals the
 * correctly rounded fp32 operation, because double has more than 2 * 24 + 2 bits of precision.
 *
 * Each reduction case runs twice: once on the build the CPU selects (AVX2/F16C on most x86-64)
 * and once forced onto the portable build, so both are checked on one machine. The run ends with
 * a throughput printout for information only.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "reduce/reduce.h"

/* Test hook defined in csrc/reduce/reduce.c (not part of reduce.h): nonzero forces the portable
 * kernels, zero returns to the CPU's best build. */
void mcclReduceForcePortable(int on);

static const char* const kTypeNames[mcclNumTypes] = {
    "int8",    "uint8",   "int32", "int64", "float16", "float32", "float64",
    "bfloat16", "bool",   "int16", "uint16", "uint32", "uint64"};
static const char* const kOpNames[mcclNumOps] = {"sum", "prod", "max", "min", "avg",
                                                 "band", "bor", "bxor", "premul_sum"};

static uint64_t rng_state = 0x5eed0123456789abull;

static uint64_t rnd(void) { return harnessRandom(&rng_state); }

/* A uniformly distributed integer in [lo, hi]. */
static int64_t rndRange(int64_t lo, int64_t hi) {
  return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static size_t typeSize(mcclDataType_t t) {
  static const size_t sizes[mcclNumTypes] = {1, 1, 4, 8, 2, 4, 8, 2, 1, 2, 2, 4, 8};
  return sizes[t];
}

static int isFloatType(mcclDataType_t t) {
  return t == mcclFloat16 || t == mcclFloat32 || t == mcclFloat64 || t == mcclBfloat16;
}

/* ---------------------------------------------------------------------------------------------
 * Reference encodings of small binary floating-point formats (binary16: 10 mantissa bits and 5
 * exponent bits; bfloat16: 7 and 8), written with frexp/ldexp/rint so that they share no code or
 * method with the bit manipulations of the library.
 */

static double refDecode(uint32_t bits, int mbits, int ebits) {
  uint32_t sign = (bits >> (mbits + ebits)) & 1u;
  uint32_t field = (bits >> mbits) & ((1u << ebits) - 1u);
  uint32_t mant = bits & ((1u << mbits) - 1u);
  int bias = (1 << (ebits - 1)) - 1;
  double v;
  if (field == (1u << ebits) - 1u) {
    v = mant ? NAN : INFINITY;
  } else if (field == 0) {
    v = ldexp((double)mant, 1 - bias - mbits);
  } else {
    v = ldexp((double)(mant + (1u << mbits)), (int)field - bias - mbits);
  }
  return sign ? -v : v;
}

/* Round v to the format, to nearest with ties to even (rint in the default rounding mode). NaN
 * becomes the canonical quiet NaN; callers only test NaN-ness. */
static uint32_t refEncode(double v, int mbits, int ebits) {
  uint32_t sign = signbit(v) ? 1u << (mbits + ebits) : 0u;
  uint32_t inf = ((1u << ebits) - 1u) << mbits;
  if (isnan(v)) return inf | (1u << (mbits - 1));
  double av = fabs(v);
  if (isinf(av)) return sign | inf;
  if (av == 0.0) return sign;
  int bias = (1 << (ebits - 1)) - 1;
  int emin = 1 - bias;
  int ex;
  frexp(av, &ex);
  int e = ex - 1; /* av = 1.f * 2^e */
  if (e < emin) e = emin;
  double q = rint(ldexp(av, mbits - e)); /* The significand in units of the last place. */
  if (q >= ldexp(1.0, mbits + 1)) {
    q /= 2;
    e += 1;
  }
  if (q < ldexp(1.0, mbits)) return sign | (uint32_t)q; /* Subnormal (or rounded to zero). */
  if (e + bias >= (1 << ebits) - 1) return sign | inf;
  return sign | ((uint32_t)(e + bias) << mbits) | ((uint32_t)q - (1u << mbits));
}

static double refHalf(uint16_t h) { return refDecode(h, 10, 5); }
static uint16_t refToHalf(double v) { return (uint16_t)refEncode(v, 10, 5); }
static double refBf16(uint16_t b) { return refDecode(b, 7, 8); }
static uint16_t refToBf16(double v) { return (uint16_t)refEncode(v, 7, 8); }

static int halfIsNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
static int bf16IsNan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

static uint32_t bitsOfFloat(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float floatOfBits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---------------------------------------------------------------------------------------------
 * Conversion tests.
 */

/* Every binary16 pattern: decoding matches the reference (sign of zero included, NaN quiet with
 * the sign kept) and encoding the decoded value gives the pattern back, or a NaN for a NaN. */
static void testHalfExhaustive(void) {
  int bad_decode = 0, bad_round_trip = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = mcclHalfToFloat((uint16_t)h);
    double want = refHalf((uint16_t)h);
    uint16_t back = mcclFloatToHalf(f);
    if (halfIsNan((uint16_t)h)) {
      int ok = isnan(f) && (bitsOfFloat(f) & 0x00400000u) && (!signbit(f)) == !(h & 0x8000u);
      if (!ok && bad_decode++ < 5) EXPECT(0, "half 0x%04x decodes to non-quiet-NaN %a", h, f);
      if ((!halfIsNan(back) || (back & 0x8000u) != (h & 0x8000u)) && bad_round_trip++ < 5) {
        EXPECT(0, "half NaN 0x%04x round-trips to 0x%04x", h, back);
      }
    } else {
      if (((double)f != want || !signbit(f) != !signbit(want)) && bad_decode++ < 5) {
        EXPECT(0, "half 0x%04x decodes to %a, want %a", h, f, want);
      }
      if (back != h && bad_round_trip++ < 5) {
        EXPECT(0, "half 0x%04x round-trips to 0x%04x", h, back);
      }
    }
  }
  EXPECT(bad_decode == 0, "%d binary16 patterns decode wrongly", bad_decode);
  EXPECT(bad_round_trip == 0, "%d binary16 patterns do not round-trip", bad_round_trip);
}

static void testBf16Exhaustive(void) {
  int bad_decode = 0, bad_round_trip = 0;
  for (uint32_t b = 0; b < 65536; b++) {
    float f = mcclBfloat16ToFloat((uint16_t)b);
    double want = refBf16((uint16_t)b);
    uint16_t back = mcclFloatToBfloat16(f);
    if (bf16IsNan((uint16_t)b)) {
      int ok = isnan(f) && (bitsOfFloat(f) & 0x00400000u) && (!signbit(f)) == !(b & 0x8000u);
      if (!ok && bad_decode++ < 5) EXPECT(0, "bf16 0x%04x decodes to non-quiet-NaN %a", b, f);
      if ((!bf16IsNan(back) || (back & 0x8000u) != (b & 0x8000u)) && bad_round_trip++ < 5) {
        EXPECT(0, "bf16 NaN 0x%04x round-trips to 0x%04x", b, back);
      }
    } else {
      if (((double)f != want || !signbit(f) != !signbit(want)) && bad_decode++ < 5) {
        EXPECT(0, "bf16 0x%04x decodes to %a, want %a", b, f, want);
      }
      if (back != b && bad_round_trip++ < 5) {
        EXPECT(0, "bf16 0x%04x round-trips to 0x%04x", b, back);
      }
    }
  }
  EXPECT(bad_decode == 0, "%d bfloat16 patterns decode wrongly", bad_decode);
  EXPECT(bad_round_trip == 0, "%d bfloat16 patterns do not round-trip", bad_round_trip);
}

/* Every rounding boundary of binary16: for each pair of adjacent finite halves of either sign,
 * the float exactly halfway between them rounds to the even one, and the floats one fp32 ulp
 * either side round down and up. Above 65504 the "next" value is 65536 (which rounds to inf). */
static void testHalfBoundaries(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 0x7c00u; h++) {
    for (int neg = 0; neg < 2; neg++) {
      double lo = refHalf((uint16_t)h);
      double hi = h + 1 == 0x7c00u ? 65536.0 : refHalf((uint16_t)(h + 1));
      float mid = (float)((lo + hi) / 2); /* Exact: needs 12 significant bits. */
      uint16_t s = neg ? 0x8000u : 0;
      uint16_t even = (uint16_t)((h & 1u) ? h + 1 : h);
      float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
      float sg = neg ? -1.0f : 1.0f;
      uint16_t got_mid = mcclFloatToHalf(sg * mid), got_below = mcclFloatToHalf(sg * below);
      uint16_t got_above = mcclFloatToHalf(sg * above);
      if ((got_mid != (s | even) || got_below != (s | h) || got_above != (s | (h + 1))) &&
          bad++ < 5) {
        EXPECT(0, "half boundary after 0x%04x (%s): got 0x%04x 0x%04x 0x%04x", h,
               neg ? "negative" : "positive", got_below, got_mid, got_above);
      }
    }
  }
  EXPECT(bad == 0, "%d binary16 rounding boundaries wrong", bad);
}

/* The same for bfloat16, where the halfway float between patterns b and b+1 is simply
 * (b << 16) | 0x8000, including the one above the largest finite value. */
static void testBf16Boundaries(void) {
  int bad = 0;
  for (uint32_t b = 0; b < 0x7f80u; b++) {
    for (uint32_t s = 0; s <= 0x8000u; s += 0x8000u) {
      uint32_t mid = ((s | b) << 16) | 0x8000u;
      uint16_t even = (uint16_t)(s | ((b & 1u) ? b + 1 : b));
      uint16_t got_mid = mcclFloatToBfloat16(floatOfBits(mid));
      uint16_t got_below = mcclFloatToBfloat16(floatOfBits(mid - 1));
      uint16_t got_above = mcclFloatToBfloat16(floatOfBits(mid + 1));
      if ((got_mid != even || got_below != (s | b) || got_above != (s | (b + 1))) && bad++ < 5) {
        EXPECT(0, "bf16 boundary after 0x%04x: got 0x%04x 0x%04x 0x%04x", s | b, got_below,
               got_mid, got_above);
      }
    }
  }
  EXPECT(bad == 0, "%d bfloat16 rounding boundaries wrong", bad);
}

/* Random fp32 bit patterns (every exponent, NaNs included) against the reference encoders. */
static void testRandomFloats(void) {
  int bad_half = 0, bad_bf16 = 0;
  for (int i = 0; i < 2000000; i++) {
    uint64_t r = rnd();
    uint32_t u = (uint32_t)r;
    /* Half of the samples are confined to the binary16 range, where the interesting cases are. */
    if (r >> 63) u = (u & 0x80000000u) | (0x33000000u + (u & 0x7fffffffu) % 0x14800000u);
    float f = floatOfBits(u);
    uint16_t h = mcclFloatToHalf(f), b = mcclFloatToBfloat16(f);
    uint16_t want_h = refToHalf(f), want_b = refToBf16(f);
    int ok_h = isnan(f) ? halfIsNan(h) : h == want_h;
    int ok_b = isnan(f) ? bf16IsNan(b) : b == want_b;
    if (!ok_h && bad_half++ < 5) EXPECT(0, "half(%a) = 0x%04x, want 0x%04x", f, h, want_h);
    if (!ok_b && bad_bf16++ < 5) EXPECT(0, "bf16(%a) = 0x%04x, want 0x%04x", f, b, want_b);
  }
  EXPECT(bad_half == 0, "%d random floats convert to binary16 wrongly", bad_half);
  EXPECT(bad_bf16 == 0, "%d random floats convert to bfloat16 wrongly", bad_bf16);
}

static void testConversionSpecials(void) {
  /* binary16: ties to even, overflow, subnormals, signed zero, infinities and NaN. */
  EXPECT(mcclFloatToHalf(2049.0f) == 0x6800u, "2049 -> 0x%04x", mcclFloatToHalf(2049.0f));
  EXPECT(mcclFloatToHalf(2051.0f) == 0x6802u, "2051 -> 0x%04x", mcclFloatToHalf(2051.0f));
  EXPECT(mcclFloatToHalf(2050.0f) == 0x6801u, "2050 -> 0x%04x", mcclFloatToHalf(2050.0f));
  EXPECT(mcclFloatToHalf(65520.0f) == 0x7c00u, "65520 -> 0x%04x", mcclFloatToHalf(65520.0f));
  EXPECT(mcclFloatToHalf(-65520.0f) == 0xfc00u, "-65520 -> 0x%04x", mcclFloatToHalf(-65520.0f));
  EXPECT(mcclFloatToHalf(65519.0f) == 0x7bffu, "65519 -> 0x%04x", mcclFloatToHalf(65519.0f));
  EXPECT(mcclFloatToHalf(65504.0f) == 0x7bffu, "65504 -> 0x%04x", mcclFloatToHalf(65504.0f));
  EXPECT(mcclFloatToHalf(FLT_MAX) == 0x7c00u, "FLT_MAX -> 0x%04x", mcclFloatToHalf(FLT_MAX));
  EXPECT(mcclFloatToHalf(INFINITY) == 0x7c00u, "inf -> 0x%04x", mcclFloatToHalf(INFINITY));
  EXPECT(mcclFloatToHalf(-INFINITY) == 0xfc00u, "-inf -> 0x%04x", mcclFloatToHalf(-INFINITY));
  EXPECT(mcclFloatToHalf(0.0f) == 0x0000u, "0 -> 0x%04x", mcclFloatToHalf(0.0f));
  EXPECT(mcclFloatToHalf(-0.0f) == 0x8000u, "-0 -> 0x%04x", mcclFloatToHalf(-0.0f));
  EXPECT(mcclFloatToHalf(0x1p-24f) == 0x0001u, "2^-24 -> 0x%04x", mcclFloatToHalf(0x1p-24f));
  EXPECT(mcclFloatToHalf(0x1p-25f) == 0x0000u, "2^-25 -> 0x%04x", mcclFloatToHalf(0x1p-25f));
  EXPECT(mcclFloatToHalf(-0x1p-25f) == 0x8000u, "-2^-25 -> 0x%04x", mcclFloatToHalf(-0x1p-25f));
  EXPECT(mcclFloatToHalf(0x1.000002p-25f) == 0x0001u, "just above 2^-25 -> 0x%04x",
         mcclFloatToHalf(0x1.000002p-25f));
  EXPECT(mcclFloatToHalf(0x3p-25f) == 0x0002u, "3*2^-25 -> 0x%04x", mcclFloatToHalf(0x3p-25f));
  EXPECT(mcclFloatToHalf(0x1p-14f) == 0x0400u, "2^-14 -> 0x%04x", mcclFloatToHalf(0x1p-14f));
  EXPECT(mcclFloatToHalf(0x1.ff8p-15f) == 0x03ffu, "largest subnormal -> 0x%04x",
         mcclFloatToHalf(0x1.ff8p-15f));
  EXPECT(mcclFloatToHalf(0x1.ffap-15f) == 0x03ffu, "1023.25 * 2^-24 -> 0x%04x",
         mcclFloatToHalf(0x1.ffap-15f));
  EXPECT(mcclFloatToHalf(0x1.ffcp-15f) == 0x0400u, "tie below 2^-14 -> 0x%04x",
         mcclFloatToHalf(0x1.ffcp-15f));
  EXPECT(mcclFloatToHalf(0x1.ff4p-15f) == 0x03feu, "tie 1022.5 * 2^-24 -> 0x%04x",
         mcclFloatToHalf(0x1.ff4p-15f));
  EXPECT(mcclFloatToHalf(FLT_TRUE_MIN) == 0x0000u, "fp32 subnormal -> 0x%04x",
         mcclFloatToHalf(FLT_TRUE_MIN));
  EXPECT(mcclFloatToHalf(-FLT_TRUE_MIN) == 0x8000u, "-fp32 subnormal -> 0x%04x",
         mcclFloatToHalf(-FLT_TRUE_MIN));
  EXPECT(halfIsNan(mcclFloatToHalf(NAN)), "NaN -> 0x%04x", mcclFloatToHalf(NAN));
  /* A NaN whose payload lives only in the low 13 bits must not become an infinity. */
  EXPECT(halfIsNan(mcclFloatToHalf(floatOfBits(0x7f800001u))), "sNaN 0x7f800001 -> 0x%04x",
         mcclFloatToHalf(floatOfBits(0x7f800001u)));
  EXPECT(mcclFloatToHalf(floatOfBits(0xffc00000u)) == 0xfe00u, "-qNaN -> 0x%04x",
         mcclFloatToHalf(floatOfBits(0xffc00000u)));
  EXPECT(mcclHalfToFloat(0x0001u) == 0x1p-24f, "0x0001 -> %a", mcclHalfToFloat(0x0001u));
  EXPECT(mcclHalfToFloat(0x03ffu) == 0x1.ff8p-15f, "0x03ff -> %a", mcclHalfToFloat(0x03ffu));
  EXPECT(mcclHalfToFloat(0x7bffu) == 65504.0f, "0x7bff -> %a", mcclHalfToFloat(0x7bffu));
  EXPECT(mcclHalfToFloat(0xfc00u) == -INFINITY, "0xfc00 -> %a", mcclHalfToFloat(0xfc00u));
  EXPECT(signbit(mcclHalfToFloat(0x8000u)) && mcclHalfToFloat(0x8000u) == 0.0f, "-0 lost");
  EXPECT(bitsOfFloat(mcclHalfToFloat(0x7c01u)) == 0x7fc02000u, "sNaN 0x7c01 -> 0x%08x",
         bitsOfFloat(mcclHalfToFloat(0x7c01u)));

  /* bfloat16. */
  EXPECT(mcclFloatToBfloat16(257.0f) == 0x4380u, "bf16(257) = 0x%04x", mcclFloatToBfloat16(257.0f));
  EXPECT(mcclFloatToBfloat16(259.0f) == 0x4382u, "bf16(259) = 0x%04x", mcclFloatToBfloat16(259.0f));
  EXPECT(mcclFloatToBfloat16(1.0f) == 0x3f80u, "bf16(1) = 0x%04x", mcclFloatToBfloat16(1.0f));
  EXPECT(mcclFloatToBfloat16(-0.0f) == 0x8000u, "bf16(-0) = 0x%04x", mcclFloatToBfloat16(-0.0f));
  EXPECT(mcclFloatToBfloat16(FLT_MAX) == 0x7f80u, "bf16(FLT_MAX) = 0x%04x",
         mcclFloatToBfloat16(FLT_MAX));
  EXPECT(mcclFloatToBfloat16(-INFINITY) == 0xff80u, "bf16(-inf) = 0x%04x",
         mcclFloatToBfloat16(-INFINITY));
  EXPECT(mcclFloatToBfloat16(floatOfBits(0x7f7f7fffu)) == 0x7f7fu, "largest finite rounding");
  EXPECT(mcclFloatToBfloat16(floatOfBits(0x00008000u)) == 0x0000u, "bf16 subnormal tie to even");
  EXPECT(mcclFloatToBfloat16(floatOfBits(0x00018000u)) == 0x0002u, "bf16 subnormal tie up");
  EXPECT(mcclFloatToBfloat16(floatOfBits(0x007fffffu)) == 0x0080u, "bf16 subnormal to normal");
  /* NaNs with payload only in the low 16 bits, or all ones, stay NaN and never become inf. */
  uint32_t nans[] = {0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x7fc00000u, 0x7f80ffffu};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t b = mcclFloatToBfloat16(floatOfBits(nans[i]));
    EXPECT(bf16IsNan(b) && (b & 0x8000u) == ((nans[i] >> 16) & 0x8000u),
           "bf16(NaN 0x%08x) = 0x%04x", nans[i], b);
  }
  EXPECT(signbit(mcclBfloat16ToFloat(0x8000u)) && mcclBfloat16ToFloat(0x8000u) == 0.0f, "-0");
  EXPECT(mcclBfloat16ToFloat(0x0001u) == 0x1p-133f, "bf16 0x0001 -> %a",
         mcclBfloat16ToFloat(0x0001u));
}

/* ---------------------------------------------------------------------------------------------
 * Reference reductions, one element at a time, on raw element bytes.
 */

/* Integer types (not bool): the width is the element size, and only the int* types are signed. */
static int intBits(mcclDataType_t t) { return 8 * (int)typeSize(t); }

static int intSigned(mcclDataType_t t) {
  return t == mcclInt8 || t == mcclInt16 || t == mcclInt32 || t == mcclInt64;
}

static uint64_t loadRaw(const void* p, mcclDataType_t t) {
  uint64_t v = 0;
  switch (typeSize(t)) {
    case 1: { uint8_t x; memcpy(&x, p, 1); v = x; break; }
    case 2: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
    case 4: { uint32_t x; memcpy(&x, p, 4); v = x; break; }
    default: memcpy(&v, p, 8); break;
  }
  return v;
}

static void storeRaw(void* p, mcclDataType_t t, uint64_t v) {
  switch (typeSize(t)) {
    case 1: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case 2: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
    case 4: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    default: memcpy(p, &v, 8); break;
  }
}

static uint64_t widthMask(int bits) {
  return bits == 64 ? ~(uint64_t)0 : ((uint64_t)1 << bits) - 1;
}

/* Two's complement value of the low `bits` bits of raw. */
static int64_t signExtend(uint64_t raw, int bits) {
  raw &= widthMask(bits);
  if (bits < 64 && (raw >> (bits - 1)) & 1u) raw |= ~widthMask(bits);
  int64_t v;
  memcpy(&v, &raw, sizeof v);
  return v;
}

/* Signed division truncating toward zero, done on magnitudes; returns the raw two's complement
 * bits of the quotient. */
static uint64_t refDivSigned(uint64_t raw, int bits, uint32_t divisor) {
  int64_t v = signExtend(raw, bits);
  uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  uint64_t q = mag / divisor;
  return (v < 0 ? (uint64_t)0 - q : q) & widthMask(bits);
}

static uint64_t refInt(mcclDataType_t t, mcclRedOp_t op, uint32_t divisor, uint64_t x,
                       uint64_t y) {
  int bits = intBits(t);
  uint64_t mask = widthMask(bits);
  int sgn = intSigned(t);
  switch (op) {
    case mcclSum: return (x + y) & mask;
    case mcclProd: return (x * y) & mask;
    case mcclBand: return x & y;
    case mcclBor: return x | y;
    case mcclBxor: return x ^ y;
    case mcclMax:
      if (sgn) return signExtend(x, bits) > signExtend(y, bits) ? x : y;
      return x > y ? x : y;
    case mcclMin:
      if (sgn) return signExtend(x, bits) < signExtend(y, bits) ? x : y;
      return x < y ? x : y;
    case mcclAvg: {
      uint64_t s = (x + y) & mask;
      if (divisor <= 1) return s;
      return sgn ? refDivSigned(s, bits, divisor) : s / divisor;
    }
    default: return 0;
  }
}

static uint64_t refBool(mcclRedOp_t op, uint64_t x, uint64_t y) {
  int p = x != 0, q = y != 0;
  switch (op) {
    case mcclSum:
    case mcclMax:
    case mcclBor: return (uint64_t)(p || q);
    case mcclProd:
    case mcclMin:
    case mcclBand: return (uint64_t)(p && q);
    case mcclBxor: return (uint64_t)(p != q);
    default: return 0;
  }
}

/* Decode any floating element to double (exact). */
static double refLoadFloat(const void* p, mcclDataType_t t) {
  uint64_t raw = loadRaw(p, t);
  switch (t) {
    case mcclFloat16: return refHalf((uint16_t)raw);
    case mcclBfloat16: return refBf16((uint16_t)raw);
    case mcclFloat32: return (double)floatOfBits((uint32_t)raw);
    default: { double d; memcpy(&d, &raw, sizeof d); return d; }
  }
}

/* Round a double to the element type and store it. */
static void refStoreFloat(void* p, mcclDataType_t t, double v) {
  switch (t) {
    case mcclFloat16: storeRaw(p, t, refToHalf(v)); break;
    case mcclBfloat16: storeRaw(p, t, refToBf16(v)); break;
    case mcclFloat32: { float f = (float)v; memcpy(p, &f, 4); break; }
    default: memcpy(p, &v, 8); break;
  }
}

/* The spec's AVG for fp32 and the half types, written out separately: the fp32 sum divided by
 * the divisor converted to fp32, in fp32. */
static float refAvgFloat(float x, float y, uint32_t divisor) {
  float s = x + y;
  return s / (float)divisor;
}

/* x op y for a floating type, as the double value that refStoreFloat then rounds. fp64 combines
 * in double. The other types combine in fp32: computing in double and rounding to float is the
 * correctly rounded fp32 result (see the top of the file). MAX/MIN: NaN wins; ties give y. */
static double refFloat(mcclDataType_t t, mcclRedOp_t op, uint32_t divisor, double x, double y) {
  int wide = t == mcclFloat64;
  double r;
  switch (op) {
    case mcclSum: r = x + y; break;
    case mcclProd: r = x * y; break;
    case mcclMax: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
    case mcclMin: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
    case mcclAvg:
      if (divisor <= 1) {
        r = x + y;
      } else if (wide) {
        r = (x + y) / (double)divisor;
      } else {
        return (double)refAvgFloat((float)x, (float)y, divisor);
      }
      break;
    default: return NAN;
  }
  return wide ? r : (double)(float)r;
}

/* Bitwise equality, except that any NaN matches any NaN. */
static int elemEqual(const void* p, const void* q, mcclDataType_t t) {
  if (memcmp(p, q, typeSize(t)) == 0) return 1;
  if (!isFloatType(t)) return 0;
  uint64_t a = loadRaw(p, t), b = loadRaw(q, t);
  switch (t) {
    case mcclFloat16: return halfIsNan((uint16_t)a) && halfIsNan((uint16_t)b);
    case mcclBfloat16: return bf16IsNan((uint16_t)a) && bf16IsNan((uint16_t)b);
    default: return isnan(refLoadFloat(p, t)) && isnan(refLoadFloat(q, t));
  }
}

static void refCombine(void* out, const void* x, const void* y, mcclDataType_t t, mcclRedOp_t op,
                       uint32_t divisor) {
  if (t == mcclBool) {
    storeRaw(out, t, refBool(op, loadRaw(x, t), loadRaw(y, t)));
  } else if (!isFloatType(t)) {
    storeRaw(out, t, refInt(t, op, divisor, loadRaw(x, t), loadRaw(y, t)));
  } else {
    refStoreFloat(out, t, refFloat(t, op, divisor, refLoadFloat(x, t), refLoadFloat(y, t)));
  }
}

static void elemString(char* buf, size_t cap, const void* p, mcclDataType_t t) {
  uint64_t raw = loadRaw(p, t);
  if (isFloatType(t)) {
    snprintf(buf, cap, "%.17g (0x%llx)", refLoadFloat(p, t), (unsigned long long)raw);
  } else if (intSigned(t)) {
    snprintf(buf, cap, "%lld (0x%llx)", (long long)signExtend(raw, intBits(t)), (unsigned long long)raw);
  } else {
    snprintf(buf, cap, "%llu (0x%llx)", (unsigned long long)raw, (unsigned long long)raw);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Inputs.
 */

/* One random element. Integers mix values at and near the limits (so SUM and PROD wrap), small
 * values of both signs and uniform random bits. Floats are mostly integer-valued (so that most
 * sums and products are exact and the result is rounded only by the half types), with some
 * fractions and, when `specials` is set, a sprinkling of ±0, ±inf, NaN, extremes and
 * subnormals. */
static void genElem(void* p, mcclDataType_t t, int specials) {
  uint64_t r = rnd();
  unsigned pick = (unsigned)(r % 100);
  if (t == mcclBool) {
    static const uint8_t vals[] = {0, 1, 0, 1, 0, 1, 2, 0x80, 0xff};
    storeRaw(p, t, vals[r % (sizeof vals)]);
    return;
  }
  if (!isFloatType(t)) {
    int bits = intBits(t);
    uint64_t mask = widthMask(bits);
    uint64_t top = (uint64_t)1 << (bits - 1);
    uint64_t v;
    if (pick < 20) {
      static const int64_t near[] = {0, 1, -1, 2, -2};
      uint64_t edges[] = {top, top - 1, top + 1, top - 2, mask, mask - 1, 0, 1};
      v = (r >> 8) & 1 ? edges[(r >> 9) % 8] : (uint64_t)near[(r >> 9) % 5];
    } else if (pick < 50) {
      v = (uint64_t)rndRange(-100, 100);
    } else {
      v = rnd();
    }
    storeRaw(p, t, v & mask);
    return;
  }
  double range = t == mcclFloat64 ? 1048576.0 : t == mcclBfloat16 ? 512.0 : 2048.0;
  double v;
  if (specials && pick < 8) {
    double big = t == mcclFloat16 ? 65504.0 : t == mcclBfloat16 ? 0x1.fep127 : t == mcclFloat32
                                                                          ? (double)FLT_MAX
                                                                          : DBL_MAX;
    double tiny = t == mcclFloat16 ? 0x1p-24 : t == mcclBfloat16 ? 0x1p-133 : t == mcclFloat32
                                                                            ? 0x1p-149
                                                                            : 0x1p-1074;
    double vals[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, big, -big, tiny, -tiny, 3 * tiny};
    v = vals[(r >> 8) % (sizeof vals / sizeof vals[0])];
  } else if (pick < 20) {
    v = (double)rndRange(-64, 64) / 8.0;
  } else if (pick < 30) {
    v = (double)rndRange(-16, 16); /* Small values make exact products. */
  } else {
    v = (double)rndRange(-(int64_t)range, (int64_t)range);
  }
  refStoreFloat(p, t, v);
}

/* ---------------------------------------------------------------------------------------------
 * mcclReduce cases.
 */

enum { kAliasNone, kAliasDstA, kAliasDstB, kAliasAB, kAliasAll, kNumAlias };
static const char* const kAliasNames[kNumAlias] = {"dst,a,b", "dst==a", "dst==b", "a==b",
                                                   "dst==a==b"};

#define kMaxCount 4099
#define kPad 64 /* Elements of guard space around every buffer. */
#define kBufElems (kMaxCount + 2 * kPad)

static unsigned char* buf_a;
static unsigned char* buf_b;
static unsigned char* buf_d;
static unsigned char* save_a;
static unsigned char* save_b;
static unsigned char* save_d;
static unsigned char* expect_buf;

/* One call of mcclReduce checked element by element against the reference, plus a check that no
 * byte outside dst[0, count) changed in any of the three buffers. One EXPECT per case. */
static void runReduceCase(mcclDataType_t t, mcclRedOp_t op, uint32_t divisor, size_t count,
                          const size_t off[3], int alias, const char* build) {
  size_t es = typeSize(t);
  /* Only the elements around the operands are refilled; the rest of each buffer stays as it was
   * and is covered by the before/after comparison all the same. */
  size_t span = (count + 2 * kPad) * es;
  int specials = (rnd() & 1) != 0;
  for (size_t i = 0; i < count + 2 * kPad; i++) {
    genElem(buf_a + i * es, t, specials);
    genElem(buf_b + i * es, t, specials);
  }
  memset(buf_d, 0xa5, span);
  unsigned char* a = buf_a + (kPad + off[0]) * es;
  unsigned char* b = buf_b + (kPad + off[1]) * es;
  unsigned char* d = buf_d + (kPad + off[2]) * es;
  unsigned char* d_base = buf_d; /* The buffer that holds dst, and its snapshot. */
  unsigned char* d_save = save_d;
  if (alias == kAliasAB || alias == kAliasAll) b = a;
  if (alias == kAliasDstA || alias == kAliasAll) {
    d = a;
    d_base = buf_a;
    d_save = save_a;
  }
  if (alias == kAliasDstB) {
    d = b;
    d_base = buf_b;
    d_save = save_b;
  }
  for (size_t i = 0; i < count; i++) {
    refCombine(expect_buf + i * es, a + i * es, b + i * es, t, op, divisor);
  }
  memcpy(save_a, buf_a, span);
  memcpy(save_b, buf_b, span);
  memcpy(save_d, buf_d, span);

  mcclReduceKernel(d, a, b, count, t, op, divisor);

  size_t bad = count;
  for (size_t i = 0; i < count && bad == count; i++) {
    if (!elemEqual(d + i * es, expect_buf + i * es, t)) bad = i;
  }
  char got_s[64] = "", want_s[64] = "", x_s[64] = "", y_s[64] = "";
  if (bad < count) {
    elemString(got_s, sizeof got_s, d + bad * es, t);
    elemString(want_s, sizeof want_s, expect_buf + bad * es, t);
    /* The operands may have been overwritten through aliasing; show the saved copies. */
    elemString(x_s, sizeof x_s, save_a + (a - buf_a) + bad * es, t);
    unsigned char* y_saved = b == a ? save_a + (a - buf_a) : save_b + (b - buf_b);
    elemString(y_s, sizeof y_s, y_saved + bad * es, t);
  }
  /* Put dst's new bytes into its snapshot, then any other difference is a stray write. */
  memcpy(d_save + (d - d_base), d, count * es);
  int stray = memcmp(save_a, buf_a, span) != 0 || memcmp(save_b, buf_b, span) != 0 ||
              memcmp(save_d, buf_d, span) != 0;
  EXPECT(bad == count && !stray,
         "%s %s %s divisor=%u count=%zu offsets=%zu,%zu,%zu %s: %sfirst bad element %zu: "
         "%s op %s = %s, want %s",
         build, kTypeNames[t], kOpNames[op], divisor, count, off[0], off[1], off[2],
         kAliasNames[alias], stray ? "wrote outside dst; " : "", bad, x_s, y_s, got_s, want_s);
}

static mcclResult_t expectedVerdict(int t, int op) {
  if (t < 0 || t >= mcclNumTypes || op < 0 || op >= mcclNumOps) return mcclInvalidArgument;
  if (t == mcclBool && op == mcclAvg) return mcclUnsupported;
  if (isFloatType((mcclDataType_t)t) && (op == mcclBand || op == mcclBor || op == mcclBxor)) {
    return mcclUnsupported;
  }
  if (op == mcclPremulSum && !isFloatType((mcclDataType_t)t)) return mcclUnsupported;
  return mcclSuccess;
}

static void testReduceCheck(void) {
  for (int t = -1; t <= mcclNumTypes; t++) {
    for (int op = -1; op <= mcclNumOps; op++) {
      mcclResult_t got = mcclReduceCheck((mcclDataType_t)t, (mcclRedOp_t)op);
      EXPECT(got == expectedVerdict(t, op), "mcclReduceCheck(%d, %d) = %d, want %d", t, op, got,
             expectedVerdict(t, op));
    }
  }
  EXPECT(mcclReduceCheck((mcclDataType_t)1000, mcclSum) == mcclInvalidArgument, "type 1000");
  EXPECT(mcclReduceCheck(mcclFloat32, (mcclRedOp_t)1000) == mcclInvalidArgument, "op 1000");
  for (int t = 0; t < mcclNumTypes; t++) {
    EXPECT(mcclDataTypeSize((mcclDataType_t)t) == typeSize((mcclDataType_t)t),
           "mcclDataTypeSize(%s) = %zu", kTypeNames[t], mcclDataTypeSize((mcclDataType_t)t));
  }
  EXPECT(mcclDataTypeSize(mcclNumTypes) == 0, "size of an invalid type");
  EXPECT(mcclDataTypeSize((mcclDataType_t)-1) == 0, "size of type -1");
}

static const size_t kCounts[] = {0, 1, 7, 33, 1000, 4099};
static const size_t kOffsets[][3] = {{0, 0, 0}, {1, 2, 3}, {3, 1, 7}, {5, 5, 5}};

static void testReduceAll(const char* build) {
  for (int t = 0; t < mcclNumTypes; t++) {
    for (int op = 0; op < mcclNumOps; op++) {
      /* The kernel combines PREMUL_SUM as SUM (the scaling happens once, in mcclReduceScale). */
      if (expectedVerdict(t, op) != mcclSuccess || op == mcclPremulSum) continue;
      uint32_t divisors[] = {1, 3, 4, 0};
      int ndiv = op == mcclAvg ? 4 : 1;
      for (int di = 0; di < ndiv; di++) {
        for (size_t ci = 0; ci < sizeof kCounts / sizeof kCounts[0]; ci++) {
          for (size_t oi = 0; oi < sizeof kOffsets / sizeof kOffsets[0]; oi++) {
            for (int alias = 0; alias < kNumAlias; alias++) {
              runReduceCase((mcclDataType_t)t, (mcclRedOp_t)op, divisors[di], kCounts[ci],
                            kOffsets[oi], alias, build);
            }
          }
        }
      }
    }
  }
}

/* Explicit NaN propagation and signed zeros through the array kernels (count 17 runs both the
 * vector body and the scalar tail). */
static void testNanAndZero(const char* build) {
  static const mcclDataType_t types[] = {mcclFloat16, mcclFloat32, mcclFloat64, mcclBfloat16};
  enum { n = 17 };
  for (size_t ti = 0; ti < 4; ti++) {
    mcclDataType_t t = types[ti];
    size_t es = typeSize(t);
    unsigned char* a = buf_a;
    unsigned char* b = buf_b;
    unsigned char* d = buf_d;
    for (int which = 0; which < 3; which++) {
      for (int i = 0; i < n; i++) {
        double x = (i % 3 == 0) ? -INFINITY : (double)(i - 8);
        double y = (i % 2 == 0) ? INFINITY : (double)(8 - i);
        refStoreFloat(a + i * es, t, which != 1 ? NAN : x);
        refStoreFloat(b + i * es, t, which != 0 ? NAN : y);
      }
      for (int op = mcclMax; op <= mcclMin; op++) {
        mcclReduceKernel(d, a, b, n, t, (mcclRedOp_t)op, 1);
        int all_nan = 1;
        for (int i = 0; i < n; i++) all_nan &= isnan(refLoadFloat(d + i * es, t));
        EXPECT(all_nan, "%s %s %s with NaN in %s: result not NaN", build, kTypeNames[t],
               kOpNames[op], which == 0 ? "a" : which == 1 ? "b" : "both");
      }
    }
    /* -0 + -0 = -0 and -0 + +0 = +0 in every floating type. */
    for (int i = 0; i < n; i++) {
      refStoreFloat(a + i * es, t, -0.0);
      refStoreFloat(b + i * es, t, (i & 1) ? 0.0 : -0.0);
    }
    mcclReduceKernel(d, a, b, n, t, mcclSum, 1);
    int zeros_ok = 1;
    for (int i = 0; i < n; i++) {
      double v = refLoadFloat(d + i * es, t);
      zeros_ok &= v == 0.0 && (signbit(v) ? 0 : 1) == (i & 1);
    }
    EXPECT(zeros_ok, "%s %s signed zeros through SUM", build, kTypeNames[t]);
  }
}

/* ---------------------------------------------------------------------------------------------
 * mcclReduceDivide.
 */

static void refDivide(void* out, const void* x, mcclDataType_t t, uint32_t divisor) {
  if (divisor <= 1) {
    memcpy(out, x, typeSize(t));
  } else if (!isFloatType(t)) {
    uint64_t raw = loadRaw(x, t);
    storeRaw(out, t, intSigned(t) ? refDivSigned(raw, intBits(t), divisor) : raw / divisor);
  } else if (t == mcclFloat64) {
    refStoreFloat(out, t, refLoadFloat(x, t) / (double)divisor);
  } else {
    /* fp32 division of the (widened) value by (float)divisor, then one rounding to the type. */
    double q = (double)(float)(refLoadFloat(x, t) / (double)(float)divisor);
    refStoreFloat(out, t, q);
  }
}

static void testDivide(const char* build) {
  static const uint32_t divisors[] = {0, 1, 2, 3, 4, 7, 1000, 4294967295u};
  for (int t = 0; t < mcclNumTypes; t++) {
    size_t es = typeSize((mcclDataType_t)t);
    for (size_t di = 0; di < sizeof divisors / sizeof divisors[0]; di++) {
      for (size_t ci = 0; ci < sizeof kCounts / sizeof kCounts[0]; ci++) {
        for (int in_place = 0; in_place < 2; in_place++) {
          size_t count = kCounts[ci], off = ci % 4, doff = in_place ? off : (ci * 3) % 7;
          for (size_t i = 0; i < (size_t)kBufElems; i++) genElem(buf_a + i * es, t, 1);
          memset(buf_d, 0x5a, (size_t)kBufElems * 8);
          unsigned char* s = buf_a + (kPad + off) * es;
          unsigned char* d = in_place ? s : buf_d + (kPad + doff) * es;
          for (size_t i = 0; i < count; i++) {
            refDivide(expect_buf + i * es, s + i * es, (mcclDataType_t)t, divisors[di]);
          }
          memcpy(save_a, buf_a, (size_t)kBufElems * 8);
          memcpy(save_d, buf_d, (size_t)kBufElems * 8);
          mcclReduceDivide(d, s, count, (mcclDataType_t)t, divisors[di]);
          size_t bad = count;
          if (t != mcclBool) {
            for (size_t i = 0; i < count && bad == count; i++) {
              if (!elemEqual(d + i * es, expect_buf + i * es, (mcclDataType_t)t)) bad = i;
            }
            /* Accept dst's new bytes in its snapshot; any other change is a stray write. Bool has
             * no division, so for bool nothing at all may change. */
            unsigned char* d_save = in_place ? save_a + (d - buf_a) : save_d + (d - buf_d);
            memcpy(d_save, d, count * es);
          }
          int stray = memcmp(save_a, buf_a, (size_t)kBufElems * 8) != 0 ||
                      memcmp(save_d, buf_d, (size_t)kBufElems * 8) != 0;
          char got_s[64] = "", want_s[64] = "";
          if (bad < count && t != mcclBool) {
            elemString(got_s, sizeof got_s, d + bad * es, (mcclDataType_t)t);
            elemString(want_s, sizeof want_s, expect_buf + bad * es, (mcclDataType_t)t);
          }
          EXPECT(bad == count && !stray,
                 "%s divide %s by %u count=%zu %s: %selement %zu = %s, want %s", build,
                 kTypeNames[t], divisors[di], count, in_place ? "in place" : "out of place",
                 stray ? "wrote outside dst; " : "", bad, got_s, want_s);
        }
      }
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * On arbitrary bit patterns (NaNs with payloads, infinities, subnormals, every exponent) both
 * builds must agree with each other and with the reference, bit for bit except that a NaN may
 * carry any payload: which operand's payload survives `x + y` depends on the operand order the
 * compiler picks for a commutative instruction.
 */
static void testBuildsAgree(void) {
  enum { n = 4099 };
  /* Heap buffers have no declared type, so the kernels may store any element type into them. */
  unsigned char* a = malloc(n * 8);
  unsigned char* b = malloc(n * 8);
  unsigned char* d1 = malloc(n * 8);
  unsigned char* d2 = malloc(n * 8);
  unsigned char* want = malloc(n * 8);
  EXPECT(a && b && d1 && d2 && want, "out of memory");
  static const mcclDataType_t types[] = {mcclFloat16, mcclBfloat16, mcclFloat32, mcclFloat64};
  for (size_t ti = 0; ti < 4 && a && b && d1 && d2 && want; ti++) {
    mcclDataType_t t = types[ti];
    size_t es = typeSize(t);
    for (int op = 0; op <= mcclAvg; op++) {
      for (uint32_t divisor = 1; divisor <= 3; divisor += 2) {
        if (op != mcclAvg && divisor != 1) continue;
        for (size_t i = 0; i < n; i++) {
          storeRaw(a + 8 * i, mcclInt64, rnd());
          storeRaw(b + 8 * i, mcclInt64, rnd());
        }
        mcclReduceForcePortable(0);
        mcclReduceKernel(d1, a, b, n, t, (mcclRedOp_t)op, divisor);
        mcclReduceForcePortable(1);
        mcclReduceKernel(d2, a, b, n, t, (mcclRedOp_t)op, divisor);
        mcclReduceForcePortable(0);
        size_t differ = n;
        for (size_t i = 0; i < n && differ == n; i++) {
          if (!elemEqual(d1 + i * es, d2 + i * es, t)) differ = i;
        }
        EXPECT(differ == n, "native and portable %s %s differ at element %zu", kTypeNames[t],
               kOpNames[op], differ);
        /* A half-type result is always rounded from fp32, which makes every NaN quiet, even when
         * MAX or MIN selects a signaling NaN operand. */
        if (t == mcclFloat16 || t == mcclBfloat16) {
          uint16_t quiet_bit = t == mcclFloat16 ? 0x0200u : 0x0040u;
          int loud = 0;
          for (size_t i = 0; i < n; i++) {
            uint16_t r1 = (uint16_t)loadRaw(d1 + i * es, t);
            uint16_t r2 = (uint16_t)loadRaw(d2 + i * es, t);
            int nan1 = t == mcclFloat16 ? halfIsNan(r1) : bf16IsNan(r1);
            int nan2 = t == mcclFloat16 ? halfIsNan(r2) : bf16IsNan(r2);
            loud += (nan1 && !(r1 & quiet_bit)) + (nan2 && !(r2 & quiet_bit));
          }
          EXPECT(loud == 0, "%s %s left %d signaling NaNs", kTypeNames[t], kOpNames[op], loud);
        }
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++) {
          refCombine(want + i * es, a + i * es, b + i * es, t, (mcclRedOp_t)op, divisor);
          if (!elemEqual(d1 + i * es, want + i * es, t)) bad = i;
        }
        char got_s[64] = "", want_s[64] = "";
        if (bad < n) {
          elemString(got_s, sizeof got_s, d1 + bad * es, t);
          elemString(want_s, sizeof want_s, want + bad * es, t);
        }
        EXPECT(bad == n, "random bits %s %s /%u: element %zu = %s, want %s", kTypeNames[t],
               kOpNames[op], divisor, bad, got_s, want_s);
      }
    }
  }
  free(a);
  free(b);
  free(d1);
  free(d2);
  free(want);
}

/* ---------------------------------------------------------------------------------------------
 * Throughput (printed, never asserted).
 */

static double nowSeconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of a few runs, in GB/s (1e9 B/s) of output bytes. kind < 0 times memcpy. */
static double timeKernel(void* d, const void* a, const void* b, size_t bytes, int kind) {
  double best = 1e30;
  for (int rep = 0; rep < 8; rep++) {
    double t0 = nowSeconds();
    if (kind < 0) {
      memcpy(d, a, bytes);
    } else {
      mcclDataType_t t = (mcclDataType_t)kind;
      mcclReduceKernel(d, a, b, bytes / typeSize(t), t, mcclSum, 1);
    }
    double dt = nowSeconds() - t0;
    if (dt < best) best = dt;
  }
  return (double)bytes / best / 1e9;
}

static void benchmark(void) {
  const size_t bytes = (size_t)64 << 20;
  unsigned char* a = malloc(bytes);
  unsigned char* b = malloc(bytes);
  unsigned char* d = malloc(bytes);
  if (!a || !b || !d) {
    printf("throughput: skipped (out of memory)\n");
    free(a);
    free(b);
    free(d);
    return;
  }
  /* Small integer-valued floats; read as pairs of 16-bit values they are small finite halves and
   * bfloat16s too, so no NaN, infinity or denormal slows anything down. */
  for (size_t i = 0; i < bytes / 4; i++) {
    float f = (float)(i % 1000);
    memcpy(a + 4 * i, &f, 4);
    memcpy(b + 4 * i, &f, 4);
  }
  memset(d, 0, bytes);
  double copy = timeKernel(d, a, NULL, bytes, -1);
  printf("throughput (64 MiB, GB/s of output, one core): memcpy %.2f GB/s\n", copy);
  static const mcclDataType_t types[] = {mcclFloat32, mcclBfloat16, mcclFloat16};
  for (int portable = 0; portable < 2; portable++) {
    mcclReduceForcePortable(portable);
    for (size_t i = 0; i < 3; i++) {
      double out = timeKernel(d, a, b, bytes, (int)types[i]);
      double in = timeKernel(a, a, b, bytes, (int)types[i]);
      printf("throughput (64 MiB): %-8s SUM %-8s %6.2f GB/s out of place, %6.2f GB/s in place "
             "(memcpy %.2f GB/s)\n",
             kTypeNames[types[i]], portable ? "portable" : "native", out, in, copy);
    }
  }
  mcclReduceForcePortable(0);
  free(a);
  free(b);
  free(d);
}

/* mcclReduceScale: x * factor, formed in double for float64 and in fp32 for the others, rounded
 * once; only floating types are accepted by mcclPremulCheck. */
static void testScale(void) {
  for (int t = 0; t < mcclNumTypes; t++)
    EXPECT(mcclPremulCheck((mcclDataType_t)t) == (isFloatType((mcclDataType_t)t) ? mcclSuccess : mcclUnsupported),
           "mcclPremulCheck(%s)", kTypeNames[t]);
  enum { n = 37 };
  float f32[n], g32[n];
  double f64[n];
  uint16_t h[n], b[n];
  for (int i = 0; i < n; i++) {
    double x = (double)(i - 18) * 3.0;
    f32[i] = (float)x;
    f64[i] = x;
    h[i] = mcclFloatToHalf((float)x);
    b[i] = mcclFloatToBfloat16((float)x);
  }
  mcclReduceScale(g32, f32, n, mcclFloat32, 0.25);
  mcclReduceScale(f64, f64, n, mcclFloat64, 1.0 / 3.0);
  mcclReduceScale(h, h, n, mcclFloat16, 0.5);
  mcclReduceScale(b, b, n, mcclBfloat16, 0.5);
  for (int i = 0; i < n; i++) {
    double x = (double)(i - 18) * 3.0;
    EXPECT(g32[i] == (float)x * 0.25f, "float32 scale at %d: %g", i, g32[i]);
    EXPECT(f64[i] == x * (1.0 / 3.0), "float64 scale at %d: %g", i, f64[i]);
    EXPECT(mcclHalfToFloat(h[i]) == (float)x * 0.5f, "float16 scale at %d", i);
    EXPECT(mcclBfloat16ToFloat(b[i]) == (float)x * 0.5f, "bfloat16 scale at %d", i);
  }
}

/* Hand-picked cases of the 16-bit and unsigned types, next to the randomized sweep: wrap-around
 * at the type's width (a uint16 product that would overflow int), unsigned comparison of values
 * with the top bit set, AVG of a wrapped sum (unsigned division) and truncation toward zero for
 * int16. */
static void testNewIntegerTypes(const char* build) {
  uint16_t u16a[3] = {65535, 40000, 7}, u16b[3] = {65535, 40000, 9}, u16d[3];
  mcclReduceKernel(u16d, u16a, u16b, 3, mcclUint16, mcclProd, 1);
  EXPECT(u16d[0] == 1 && u16d[1] == (uint16_t)(40000u * 40000u) && u16d[2] == 63,
         "%s uint16 prod: %u %u %u", build, u16d[0], u16d[1], u16d[2]);
  mcclReduceKernel(u16d, u16a, u16b, 3, mcclUint16, mcclSum, 1);
  EXPECT(u16d[0] == 65534 && u16d[1] == 14464 && u16d[2] == 16, "%s uint16 sum: %u %u %u", build,
         u16d[0], u16d[1], u16d[2]);
  mcclReduceKernel(u16d, u16a, u16b, 3, mcclUint16, mcclAvg, 2);
  EXPECT(u16d[0] == 32767 && u16d[1] == 7232 && u16d[2] == 8, "%s uint16 avg: %u %u %u", build,
         u16d[0], u16d[1], u16d[2]);
  int16_t i16a[4] = {-32768, 32767, -7, 100}, i16b[4] = {-1, 1, 0, -100}, i16d[4];
  mcclReduceKernel(i16d, i16a, i16b, 4, mcclInt16, mcclSum, 1);
  EXPECT(i16d[0] == 32767 && i16d[1] == -32768 && i16d[2] == -7 && i16d[3] == 0,
         "%s int16 sum: %d %d %d %d", build, i16d[0], i16d[1], i16d[2], i16d[3]);
  mcclReduceKernel(i16d, i16a, i16b, 4, mcclInt16, mcclMin, 1);
  EXPECT(i16d[0] == -32768 && i16d[1] == 1 && i16d[2] == -7 && i16d[3] == -100,
         "%s int16 min: %d %d %d %d", build, i16d[0], i16d[1], i16d[2], i16d[3]);
  mcclReduceKernel(i16d, i16a, i16b, 4, mcclInt16, mcclAvg, 2);
  EXPECT(i16d[0] == 16383 && i16d[1] == -16384 && i16d[2] == -3 && i16d[3] == 0,
         "%s int16 avg: %d %d %d %d", build, i16d[0], i16d[1], i16d[2], i16d[3]);
  uint32_t u32a[2] = {0xffffffffu, 0x80000000u}, u32b[2] = {1, 0x7fffffffu}, u32d[2];
  mcclReduceKernel(u32d, u32a, u32b, 2, mcclUint32, mcclMax, 1);
  EXPECT(u32d[0] == 0xffffffffu && u32d[1] == 0x80000000u, "%s uint32 max: %x %x", build, u32d[0], u32d[1]);
  mcclReduceKernel(u32d, u32a, u32b, 2, mcclUint32, mcclAvg, 3);
  EXPECT(u32d[0] == 0 && u32d[1] == 0x55555555u, "%s uint32 avg: %x %x", build, u32d[0], u32d[1]);
  uint64_t u64a[2] = {UINT64_MAX, 1ull << 63}, u64b[2] = {UINT64_MAX, 3}, u64d[2];
  mcclReduceKernel(u64d, u64a, u64b, 2, mcclUint64, mcclProd, 1);
  EXPECT(u64d[0] == 1 && u64d[1] == 1ull << 63, "%s uint64 prod: %llx %llx", build,
         (unsigned long long)u64d[0], (unsigned long long)u64d[1]);
  mcclReduceKernel(u64d, u64a, u64b, 2, mcclUint64, mcclMin, 1);
  EXPECT(u64d[0] == UINT64_MAX && u64d[1] == 3, "%s uint64 min", build);
  mcclReduceKernel(u64d, u64a, u64b, 2, mcclUint64, mcclBxor, 1);
  EXPECT(u64d[0] == 0 && u64d[1] == ((1ull << 63) | 3), "%s uint64 bxor", build);
  mcclReduceDivide(u64d, u64a, 2, mcclUint64, 2);
  EXPECT(u64d[0] == UINT64_MAX / 2 && u64d[1] == 1ull << 62, "%s uint64 divide", build);
  mcclReduceDivide(i16d, i16a, 4, mcclInt16, 3);
  EXPECT(i16d[0] == -10922 && i16d[1] == 10922 && i16d[2] == -2 && i16d[3] == 33, "%s int16 divide", build);
}

int main(void) {
  size_t bytes = (size_t)kBufElems * 8;
  buf_a = malloc(bytes);
  buf_b = malloc(bytes);
  buf_d = malloc(bytes);
  save_a = malloc(bytes);
  save_b = malloc(bytes);
  save_d = malloc(bytes);
  expect_buf = malloc(bytes);
  if (!buf_a || !buf_b || !buf_d || !save_a || !save_b || !save_d || !expect_buf) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }

  testHalfExhaustive();
  testBf16Exhaustive();
  testHalfBoundaries();
  testBf16Boundaries();
  testRandomFloats();
  testConversionSpecials();
  testReduceCheck();
  testScale();
  for (int portable = 0; portable < 2; portable++) {
    const char* build = portable ? "portable" : "native";
    mcclReduceForcePortable(portable);
    testReduceAll(build);
    testNewIntegerTypes(build);
    testNanAndZero(build);
    testDivide(build);
  }
  mcclReduceForcePortable(0);
  testBuildsAgree();

  free(buf_a);
  free(buf_b);
  free(buf_d);
  free(save_a);
  free(save_b);
  free(save_d);
  free(expect_buf);
  if (!getenv("MCCL_TEST_NO_BENCH")) benchmark();
  return harnessExit("test_reduce");
}
