/* Tensor-core pieces for kernels of our own (CUDA sources only): mma.sync
 * m16n8k16 on f16 or bf16 operands with fp32 accumulators, and the 16-bit
 * packing its fragments take. Fragment layouts as the PTX ISA gives them,
 * with group = lane / 4 and pair = lane % 4:
 *   a (16x16, row-major), 4 registers: rows group, group + 8, group, group + 8;
 *     columns 2 pair, 2 pair + 1 (the first two), + 8 (the last two)
 *   b (16x8, column-major), 2 registers: column group; rows 2 pair, 2 pair + 1,
 *     then + 8
 *   d (16x8, fp32), 4 floats: row group (d[0], d[1]), group + 8 (d[2], d[3]);
 *     columns 2 pair, 2 pair + 1 */
#ifndef TRAINC_MMA_CUDA_CUH
#define TRAINC_MMA_CUDA_CUH

#include <stdint.h>

#include "runtime/dtype_cuda.cuh"

static __device__ __forceinline__ uint16_t bits16(__half v) { return __half_as_ushort(v); }
static __device__ __forceinline__ uint16_t bits16(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
static __device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) { return lo | ((uint32_t)hi << 16); }

/* Two floats rounded to T, lo in the low half. */
template <typename T>
static __device__ __forceinline__ uint32_t pack2_float(float lo, float hi) {
    return pack2(bits16(from_float<T>(lo)), bits16(from_float<T>(hi)));
}

/* d += a b: m16n8k16, a row-major 16x16, b column-major 16x8, fp32 accumulators. */
template <typename T>
static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

#define MMA_M16N8K16(TYPE)                                                                                    \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "     \
                 "{%8,%9}, {%0,%1,%2,%3};\n"                                                                       \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                   \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

template <>
__device__ __forceinline__ void mma<__half>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    MMA_M16N8K16("f16");
}

template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    MMA_M16N8K16("bf16");
}

#undef MMA_M16N8K16

/* An 8x8 matrix of 16-bit values, a row per lane quad, transposed across the warp. */
static __device__ __forceinline__ uint32_t transpose8x8(uint32_t v) {
    uint32_t r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(v));
    return r;
}

#endif
