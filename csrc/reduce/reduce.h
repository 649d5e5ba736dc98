/*
 * reduce.h: element-wise reduction kernels, the [op][dtype] table of MCCL (layer "reductions").
 *
 * Algorithms call mcclReduce on each chunk they receive. The kernel knows nothing about ranks or
 * sockets; it only combines two arrays. Operand order matters for bitwise reproducibility: the
 * caller passes the operands in a canonical order (see csrc/algo/), the kernel evaluates exactly
 * `a op b`.
 */
#ifndef MCCL_REDUCE_H_
#define MCCL_REDUCE_H_

#include <stddef.h>
#include <stdint.h>

#include "mccl.h"

/* mcclSuccess if `op` is defined for `datatype`; mcclUnsupported for AVG of bool and bitwise ops
 * of floating types; mcclInvalidArgument for values outside the enums. */
mcclResult_t mcclReduceCheck(mcclDataType_t datatype, mcclRedOp_t op);

/* dst[i] = a[i] op b[i] for 0 <= i < count.
 *
 * dst may be the same pointer as a or b (exact aliasing only, no partial overlap).
 * float16 and bfloat16 are widened to fp32, combined, and rounded to nearest even once.
 * Integer types use wrap-around arithmetic and never pass through floating point.
 * AVG combines as SUM; when `avg_divisor` > 1 the sum is then divided by it in the same pass
 * (fp32 for the half types, the type itself otherwise, integers truncating toward zero), so an
 * algorithm passes the world size on the final hop and 1 elsewhere. avg_divisor is ignored for
 * other ops. The caller has validated (datatype, op) with mcclReduceCheck. */
void mcclReduceKernel(void* dst, const void* a, const void* b, size_t count, mcclDataType_t datatype,
                mcclRedOp_t op, uint32_t avg_divisor);

/* dst[i] = src[i] * factor, for PREMUL_SUM: each rank scales its own input once, then the
 * collective sums. Floating types only (mcclUnsupported from mcclPremulCheck otherwise); the
 * product is formed in double for float64, in fp32 for the others, and rounded once. dst may
 * equal src. */
mcclResult_t mcclPremulCheck(mcclDataType_t datatype);
void mcclReduceScale(void* dst, const void* src, size_t count, mcclDataType_t datatype, double factor);

/* dst[i] = src[i] / divisor (AVG on a single rank, and any place that must finish an average
 * without a second operand). dst may equal src. Same rounding and integer rules as mcclReduce. */
void mcclReduceDivide(void* dst, const void* src, size_t count, mcclDataType_t datatype,
                      uint32_t divisor);

/* Scalar conversions, exposed for tests and the reference code: IEEE binary16 and bfloat16 to and
 * from fp32, rounding to nearest even; NaN stays NaN, infinities and signed zeros are kept. */
float mcclHalfToFloat(uint16_t h);
uint16_t mcclFloatToHalf(float f);
float mcclBfloat16ToFloat(uint16_t b);
uint16_t mcclFloatToBfloat16(float f);

#endif /* MCCL_REDUCE_H_ */
