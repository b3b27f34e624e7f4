/* Conv2d through cuDNN's legacy convolution API, NCHW or NHWC, float32, f16 or bf16 data
 * with fp32 accumulation (the convolution's compute type is always FLOAT: cuDNN's
 * PSEUDO_HALF and PSEUDO_BFLOAT16 configurations for the half types).
 * For float32 the math type is CUDNN_FMA_MATH unless TF32 is allowed: with CUDNN_DEFAULT_MATH
 * cuDNN may run fp32 convolutions as TF32 on Ampere and later (H100 included),
 * which is fast but no longer matches the fp32 CPU reference closely. The half
 * types always may use tensor cores (their inputs are already half, and the
 * products accumulate in fp32). Algorithms come from cuDNN's
 * heuristics at init (or, with 'benchmark', from timing each on the device),
 * the fastest usable one; with 'deterministic' only those
 * cuDNN calls deterministic, so two runs of the same step give the same bits.
 * Under 'benchmark' the half types in NHWC also time backend plans and, for a
 * network's first convolution, a direct path of our own (below). */
#include "ops/conv2d.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "ops/backend_graph.h"
#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"
#include "runtime/mma_cuda.cuh"

static const float kOne = 1.0f, kZero = 0.0f;

/* perf.conv_benchmark times every algorithm twice and keeps the second
 * ranking: the first pass also pays each kernel's first launch (lazy module
 * loading, cuDNN's runtime compilation), which at small sizes can outweigh
 * the kernel itself. */
#define BENCHMARK_PASSES 2

/* A heuristic result we can run: it succeeded, uses tensor-core math on float32
 * only where TF32 is allowed, converts no half type to another, and is
 * deterministic when asked to be. The heuristics list the fastest first. */
static bool usable(const Conv2dCuda *c, cudnnStatus_t status, cudnnMathType_t math,
                   cudnnDeterminism_t det) {
    if (status != CUDNN_STATUS_SUCCESS) return false;
    if (c->dtype == DTYPE_F32) {
        if (!c->policy.allow_tf32 && math != CUDNN_FMA_MATH && math != CUDNN_DEFAULT_MATH)
            return false;
    } else if (math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) {
        return false;
    }
    return !c->policy.deterministic || det == CUDNN_DETERMINISTIC;
}

/* cuDNN's math types (cudnnMathType_t's values 0 to 3): with the algorithm, an
 * entry of cudnnFind's results that is the same on every rank. */
#define MATH_TYPES 4

/* The order to try cudnnFind's count results in (algorithm, math type, time:
 * infinite where it failed): cuDNN's, by this process's times, or where the
 * policy agrees timings with other processes, by the times they agree on, per
 * algorithm and math type (a fixed array, so each process passes as many). */
static void find_order(const ConvAlgoPolicy *policy, int algo_count, int count, const int *algo, const int *math,
                       const float *ms, int *order) {
    for (int i = 0; i < count; i++) order[i] = i;
    if (!policy->benchmark || !policy->agree) return;
    int keys = algo_count * MATH_TYPES;
    float *by_key = (float *)malloc((size_t)keys * sizeof(float));
    float *agreed = (float *)malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
    if (!by_key || !agreed) TC_FATAL("conv2d: out of host memory ranking %d algorithms", algo_count);
    for (int k = 0; k < keys; k++) by_key[k] = INFINITY;
    for (int i = 0; i < count; i++)
        if (algo[i] >= 0 && algo[i] < algo_count && math[i] >= 0 && math[i] < MATH_TYPES)
            by_key[algo[i] * MATH_TYPES + math[i]] = ms[i];
    conv_policy_agree(policy, by_key, keys);
    for (int i = 0; i < count; i++) {
        int key = algo[i] * MATH_TYPES + math[i];
        agreed[i] = key >= 0 && key < keys ? by_key[key] : INFINITY;
    }
    for (int i = 1; i < count; i++) /* stable: ties keep cuDNN's order */
        for (int j = i; j > 0 && agreed[order[j]] < agreed[order[j - 1]]; j--) {
            int o = order[j];
            order[j] = order[j - 1], order[j - 1] = o;
        }
    free(by_key);
    free(agreed);
}

/* find_order over perf, any of the three cudnnFind result types. */
#define FIND_ORDER(c, perf, count, algo_count, order)                                                     \
    do {                                                                                                  \
        int algo_[algo_count], math_[algo_count];                                                          \
        float ms_[algo_count];                                                                            \
        for (int i_ = 0; i_ < (count); i_++) {                                                            \
            algo_[i_] = (int)(perf)[i_].algo, math_[i_] = (int)(perf)[i_].mathType;                        \
            ms_[i_] = (perf)[i_].status == CUDNN_STATUS_SUCCESS ? (perf)[i_].time : INFINITY;             \
        }                                                                                                 \
        find_order(&(c)->policy, algo_count, count, algo_, math_, ms_, order);                            \
    } while (0)

static cudnnConvolutionFwdAlgo_t choose_fwd_algo(const Conv2dCuda *c, cudnnHandle_t h,
                                                 size_t limit, size_t *bytes, cudnnMathType_t *math) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    for (int pass = 0; c->policy.benchmark && pass < BENCHMARK_PASSES; pass++)
        CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, c->x_desc, c->w_desc, c->conv_desc, c->y_desc,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
    if (!c->policy.benchmark)
        CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c->x_desc, c->w_desc, c->conv_desc,
                                                           c->y_desc, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                           &count, perf));
    int order[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    FIND_ORDER(c, perf, count, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, order);
    {
        for (int k = 0; k < count; k++) {
            int i = order[k];
            if (!usable(c, perf[i].status, perf[i].mathType, perf[i].determinism)) continue;
            size_t need = 0;
            if (cudnnGetConvolutionForwardWorkspaceSize(h, c->x_desc, c->w_desc, c->conv_desc,
                                                        c->y_desc, perf[i].algo, &need) !=
                    CUDNN_STATUS_SUCCESS || need > limit)
                continue;
            *bytes = need;
            *math = perf[i].mathType;
            return perf[i].algo;
        }
    }
    TC_FATAL("conv2d: no%s cuDNN forward algorithm fits a %zu-byte workspace (raise "
             "perf.conv_workspace_mb%s)", c->policy.deterministic ? " deterministic" : "", limit,
             c->policy.deterministic ? " or set perf.deterministic = off" : "");
}

static cudnnConvolutionBwdDataAlgo_t choose_bwd_data_algo(const Conv2dCuda *c, cudnnHandle_t h,
                                                          size_t limit, size_t *bytes,
                                                          cudnnMathType_t *math) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    for (int pass = 0; c->policy.benchmark && pass < BENCHMARK_PASSES; pass++)
        CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
            h, c->w_desc, c->y_desc, c->conv_desc, c->x_desc, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            &count, perf));
    if (!c->policy.benchmark)
        CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            h, c->w_desc, c->y_desc, c->conv_desc, c->x_desc, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            &count, perf));
    int order[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    FIND_ORDER(c, perf, count, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, order);
    {
        for (int k = 0; k < count; k++) {
            int i = order[k];
            if (!usable(c, perf[i].status, perf[i].mathType, perf[i].determinism)) continue;
            size_t need = 0;
            if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, c->w_desc, c->y_desc,
                                                             c->conv_desc, c->x_desc,
                                                             perf[i].algo, &need) !=
                    CUDNN_STATUS_SUCCESS || need > limit)
                continue;
            *bytes = need;
            *math = perf[i].mathType;
            return perf[i].algo;
        }
    }
    TC_FATAL("conv2d: no%s cuDNN backward-data algorithm fits a %zu-byte workspace (raise "
             "perf.conv_workspace_mb%s)", c->policy.deterministic ? " deterministic" : "", limit,
             c->policy.deterministic ? " or set perf.deterministic = off" : "");
}

static cudnnConvolutionBwdFilterAlgo_t choose_bwd_filter_algo(const Conv2dCuda *c,
                                                              cudnnHandle_t h, size_t limit,
                                                              size_t *bytes, cudnnMathType_t *math) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    for (int pass = 0; c->policy.benchmark && pass < BENCHMARK_PASSES; pass++)
        CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
            h, c->x_desc, c->y_desc, c->conv_desc, c->w_desc,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    if (!c->policy.benchmark)
        CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            h, c->x_desc, c->y_desc, c->conv_desc, c->w_desc,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    int order[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    FIND_ORDER(c, perf, count, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, order);
    {
        for (int k = 0; k < count; k++) {
            int i = order[k];
            if (!usable(c, perf[i].status, perf[i].mathType, perf[i].determinism)) continue;
            size_t need = 0;
            if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c->x_desc, c->y_desc,
                                                               c->conv_desc, c->w_desc,
                                                               perf[i].algo, &need) !=
                    CUDNN_STATUS_SUCCESS || need > limit)
                continue;
            *bytes = need;
            *math = perf[i].mathType;
            return perf[i].algo;
        }
    }
    TC_FATAL("conv2d: no%s cuDNN backward-filter algorithm fits a %zu-byte workspace (raise "
             "perf.conv_workspace_mb%s)", c->policy.deterministic ? " deterministic" : "", limit,
             c->policy.deterministic ? " or set perf.deterministic = off" : "");
}

static cudnnConvolutionDescriptor_t make_conv_desc(const Conv2dShape *s, cudnnMathType_t math) {
    cudnnConvolutionDescriptor_t d;
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, s->pad, s->pad, s->stride, s->stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, conv2d_groups(s)));
    CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
    return d;
}

/* The math type the heuristics are asked under: the widest this policy and
 * data type allow. */
static cudnnMathType_t widest_math(const Conv2dCuda *c) {
    if (c->dtype != DTYPE_F32) return CUDNN_TENSOR_OP_MATH;
    return c->policy.allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

/* Our own bias kernels everywhere but NCHW float32 (see add_bias). */
static bool own_bias_kernels(const Conv2dCuda *c) { return c->dtype != DTYPE_F32 || c->nhwc; }

/* ---- the passes: legacy algorithm or backend plan ------------------------------------ */

/* A pass's tensors, as its graph's unique ids 1..3 and run_pass's pointers:
 * the input side (x or dx), the filter (w or dw), the output side (y or dy). */
enum { UID_X = 1, UID_W, UID_Y, PASS_TENSORS = 3 };

static const BackendConvPass kBackendPass[CONV2D_PASSES] = {BACKEND_CONV_FORWARD, BACKEND_CONV_DATA,
                                                            BACKEND_CONV_DATA, BACKEND_CONV_FILTER,
                                                            BACKEND_CONV_FILTER};
static const float kPassBeta[CONV2D_PASSES] = {0.0f, 0.0f, 1.0f, 0.0f, 1.0f};
static const char *const kPassNames[CONV2D_PASSES] = {"conv2d forward", "conv2d backward data",
                                                      "conv2d backward data (accumulated)", "conv2d backward filter",
                                                      "conv2d backward filter (accumulated)"};

static bool filter_pass(Conv2dPass pass) { return pass == CONV2D_FILTER || pass == CONV2D_FILTER_ADD; }

/* The pass by its legacy algorithm: cuDNN's status. */
static cudnnStatus_t legacy_status(const Conv2dCuda *c, cudnnHandle_t h, Conv2dPass pass, void *const *p,
                                   void *workspace) {
    const float *beta = kPassBeta[pass] != 0.0f ? &kOne : &kZero;
    size_t bytes = c->workspace_bytes;
    if (pass == CONV2D_FORWARD)
        return cudnnConvolutionForward(h, &kOne, c->x_desc, p[0], c->w_desc, p[1], c->conv_desc, c->fwd_algo,
                                       workspace, bytes, beta, c->y_desc, p[2]);
    if (filter_pass(pass))
        return cudnnConvolutionBackwardFilter(h, &kOne, c->x_desc, p[0], c->y_desc, p[2], c->bwd_filter_desc,
                                              c->bwd_filter_algo, workspace, bytes, beta, c->w_desc, p[1]);
    return cudnnConvolutionBackwardData(h, &kOne, c->w_desc, p[1], c->y_desc, p[2], c->bwd_data_desc,
                                        c->bwd_data_algo, workspace, bytes, beta, c->x_desc, p[0]);
}

static int legacy_algo(const Conv2dCuda *c, Conv2dPass pass) {
    return pass == CONV2D_FORWARD ? (int)c->fwd_algo
           : filter_pass(pass)     ? (int)c->bwd_filter_algo
                                   : (int)c->bwd_data_algo;
}

static void run_legacy(const Conv2dCuda *c, cudnnHandle_t h, Conv2dPass pass, void *const *p, void *workspace) {
    cudnnStatus_t status = legacy_status(c, h, pass, p, workspace);
    if (status != CUDNN_STATUS_SUCCESS)
        TC_FATAL("%s of %dx%dx%dx%d k%d %dx%d stride %d by cuDNN's algorithm %d failed: %s", kPassNames[pass],
                 c->shape.n, c->shape.c, c->shape.h, c->shape.w, c->shape.k, c->shape.r, c->shape.s, c->shape.stride,
                 legacy_algo(c, pass), cudnnGetErrorString(status));
}

static bool aligned(void *const *p) {
    for (int i = 0; i < PASS_TENSORS; i++)
        if ((uintptr_t)p[i] % BACKEND_GRAPH_ALIGNMENT != 0) return false;
    return true;
}

/* ---- the direct path: a 3x3 convolution of an image padded to 8 channels ------------------- */

/* A network's first convolution (3 channels padded to 8, 64 out, 3x3, stride 1)
 * is far from its memory bound in cuDNN's kernels: ResNet-18's 32x32 stem took
 * 70 us forward and 97 us for the filter gradient on an H200, where its 67 MB
 * output takes about 20 us to write. Here both passes run as mma.sync on
 * tensor cores (runtime/mma_cuda.cuh) with fp32 accumulation, their operands
 * loaded straight from x, w and dy, 4 bytes a lane (no im2col, and nothing
 * staged in shared memory but the forward's outputs, for 16-byte stores).
 * Under benchmark each pass is timed against cuDNN's and the faster kept. */
#define DIRECT_C CONV2D_DIRECT_CHANNELS
#define DIRECT_TAPS 9
#define DIRECT_COLS 72       /* 9 taps x 8 channels: a filter's row, and a row of the partial sums */
#define DIRECT_TILES 5       /* the forward's K steps of 2 taps, the tenth tap zero */
#define DIRECT_PIXELS 128    /* pixels a block takes, for the grids' size */
#define DIRECT_THREADS 128   /* 4 warps */
#define DIRECT_MAX_OUT CONV2D_DIRECT_MAX_OUT /* 8 tiles of 8 forward, 4 of 16 for the filter gradient */
/* Blocks per SM: warps enough to cover the loads; three forward, whose warps
 * hold the filter in registers (145 of them, 153 with the sums), four for the filter gradient
 * (125), each block a row of partial sums for the finish to read. */
#define DIRECT_FORWARD_BLOCKS_PER_SM 3
#define DIRECT_FILTER_BLOCKS_PER_SM 4

static bool direct_fits(const Conv2dCuda *c) { return conv2d_direct_fits(&c->shape, c->dtype, c->nhwc); }
static bool depthwise_fits(const Conv2dCuda *c) { return conv2d_depthwise_fits(&c->shape, c->dtype, c->nhwc); }
static size_t depthwise_filter_bytes(const Conv2dCuda *c); /* below */

static size_t direct_pixels(const Conv2dShape *s) { return (size_t)s->n * s->h * s->w; }

/* The filter gradient's workspace: each block's fp32 partial sums [k][72]. */
static size_t direct_filter_bytes(const Conv2dCuda *c) {
    if (depthwise_fits(c)) return depthwise_filter_bytes(c);
    return (size_t)c->direct_blocks[CONV2D_FILTER] * c->shape.k * DIRECT_COLS * sizeof(float);
}

/* 32 bits of T at p (4-byte aligned). */
template <typename T>
static __device__ __forceinline__ uint32_t load_pair(const T *p) {
    return *(const uint32_t *)p;
}

/* taps[tap] = x's channels 2 pair and 2 pair + 1 at the pixel's tap neighbour:
 * 0 outside the image and past the last pixel. */
template <typename T>
static __device__ __forceinline__ void load_taps(const T *__restrict__ x, int pixel, int pixels, int h, int w, int pair,
                                                 uint32_t taps[DIRECT_TAPS]) {
    int col = pixel % w, rest = pixel / w, line = rest % h;
    const T *image = x + (size_t)(rest - line) * w * DIRECT_C + 2 * pair;
#pragma unroll
    for (int tap = 0; tap < DIRECT_TAPS; tap++) {
        int yy = line + tap / 3 - 1, xx = col + tap % 3 - 1;
        bool inside = pixel < pixels && yy >= 0 && yy < h && xx >= 0 && xx < w;
        taps[tap] = inside ? load_pair(image + ((size_t)yy * w + xx) * DIRECT_C) : 0u;
    }
}

/* The block's sums of output channels 2 lane, 2 lane + 1 (and of their
 * squares) to out[2][k]: each warp's through shared memory, added in order. */
template <int WARPS>
static __device__ void add_block_stats(const float sum[2], const float sqsum[2], int k, float *__restrict__ out) {
    __shared__ float warp_sums[WARPS][2][DIRECT_MAX_OUT];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        warp_sums[warp][0][2 * lane + e] = sum[e];
        warp_sums[warp][1][2 * lane + e] = sqsum[e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * k; i += blockDim.x) {
        float total = 0.0f;
#pragma unroll
        for (int v = 0; v < WARPS; v++) total += warp_sums[v][i / k][i % k];
        out[i] = total;
    }
}

/* y[pixel][o] = sum over taps and channels of x[the pixel's tap neighbour][ch]
 * * w[o][tap][ch], as m16n8k16 MMAs (runtime/mma_cuda.cuh) over K = 2 taps of
 * 8 channels each, 5 steps (the tenth tap zero). Each warp on its own runs of
 * 16 pixels, with the whole filter in its registers as b fragments: a lane
 * loads its a fragments straight from x (4 bytes a tap, 8 pixels of a warp's
 * load reading 128 contiguous bytes), and the accumulators, rounded to T,
 * pass through shared memory so that the warp writes its pixels' outputs as
 * contiguous 16-byte stores. STATS: lane l also adds up output channels 2 l
 * and 2 l + 1 of the staged values (as stored, rounded to T) and their
 * squares, and the block writes its sums to stats[block][2][k] (the sums,
 * then the squares), the warps' added in order. */
#define DIRECT_OUT_STRIDE (DIRECT_MAX_OUT + 8) /* T a pixel's outputs take in shared memory: 36 words, so a
                                                  lane quad's 8 pixels store to different banks */
template <typename T, bool STATS>
static __global__ void __launch_bounds__(DIRECT_THREADS, DIRECT_FORWARD_BLOCKS_PER_SM)
direct_forward_kernel(const T *__restrict__ x, const T *__restrict__ wt, T *__restrict__ y, int pixels, int h, int w,
                      int k, float *__restrict__ stats) {
    constexpr int WARPS = DIRECT_THREADS / 32, N8 = DIRECT_MAX_OUT / 8;
    __shared__ __align__(16) T out[WARPS][16 * DIRECT_OUT_STRIDE];
    float sum[2] = {0.0f, 0.0f}, sqsum[2] = {0.0f, 0.0f}; /* STATS: output channels 2 lane, 2 lane + 1 */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, pair = lane % 4, n8 = k / 8;
    /* b[j][step]: w[8 j + group][taps 2 step and 2 step + 1][channels 2 pair, 2 pair + 1] */
    uint32_t b[N8][DIRECT_TILES][2];
#pragma unroll
    for (int j = 0; j < N8; j++)
#pragma unroll
        for (int step = 0; step < DIRECT_TILES; step++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int tap = 2 * step + half;
                const T *at = wt + ((size_t)(8 * j + group) * DIRECT_TAPS + tap) * DIRECT_C + 2 * pair;
                b[j][step][half] = j < n8 && tap < DIRECT_TAPS ? load_pair(at) : 0u;
            }
    T *mine = out[warp];
    for (long first = ((long)blockIdx.x * WARPS + warp) * 16; first < pixels; first += (long)gridDim.x * WARPS * 16) {
        /* a[tap][row]: x at pixel first + group + 8 row's tap neighbour, channels 2 pair, 2 pair + 1 */
        uint32_t a[DIRECT_TAPS + 1][2];
#pragma unroll
        for (int row = 0; row < 2; row++) {
            uint32_t taps[DIRECT_TAPS];
            load_taps(x, (int)first + group + 8 * row, pixels, h, w, pair, taps);
#pragma unroll
            for (int tap = 0; tap < DIRECT_TAPS; tap++) a[tap][row] = taps[tap];
            a[DIRECT_TAPS][row] = 0u;
        }
        float acc[N8][4];
#pragma unroll
        for (int j = 0; j < N8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int step = 0; step < DIRECT_TILES; step++) {
            const uint32_t frag[4] = {a[2 * step][0], a[2 * step][1], a[2 * step + 1][0], a[2 * step + 1][1]};
#pragma unroll
            for (int j = 0; j < N8; j++)
                if (j < n8) mma<T>(acc[j], frag, b[j][step][0], b[j][step][1]);
        }
        __syncwarp(); /* the last run's outputs read */
#pragma unroll
        for (int j = 0; j < N8; j++)
            if (j < n8) {
                T *at = mine + group * DIRECT_OUT_STRIDE + 8 * j + 2 * pair;
                *(uint32_t *)at = pack2_float<T>(acc[j][0], acc[j][1]);
                *(uint32_t *)(at + 8 * DIRECT_OUT_STRIDE) = pack2_float<T>(acc[j][2], acc[j][3]);
            }
        __syncwarp();
        for (int i = lane; i < 16 * n8; i += 32) {
            int row = i / n8, vector = i % n8;
            long pixel = first + row;
            const uint4 *staged = (const uint4 *)(mine + row * DIRECT_OUT_STRIDE + 8 * vector);
            if (pixel < pixels) *(uint4 *)(y + (size_t)pixel * k + 8 * vector) = *staged;
        }
        if (STATS && 2 * lane < k)
            for (int row = 0; row < 16 && first + row < pixels; row++) {
                const T *at = mine + row * DIRECT_OUT_STRIDE + 2 * lane;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float v = to_float(at[e]);
                    sum[e] += v;
                    sqsum[e] = fmaf(v, v, sqsum[e]);
                }
            }
    }
    if (STATS) add_block_stats<WARPS>(sum, sqsum, k, stats + (size_t)blockIdx.x * 2 * k);
}

/* partials[block][o][tap * 8 + ch] = the block's sum over its pixels of dy[pixel][o] * x[the pixel's tap
 * neighbour][ch], as m16n8k16 MMAs over 16 pixels at a time: a = 16 channels of dy by the 16 pixels, b =
 * one tap's 8 channels of x by them (9 taps, no padding), each loaded straight from memory as a lane's 4
 * bytes of a pixel and turned into operand layout by movmatrix. The block's warps pair up: each pair on
 * its own runs of 16 pixels, its two warps on half the output channels' tiles each (2 x 9 accumulators);
 * the second pair's sums are added to the first's in shared memory, in that order. */
template <typename T>
static __global__ void __launch_bounds__(DIRECT_THREADS, DIRECT_FILTER_BLOCKS_PER_SM)
direct_filter_kernel(const T *__restrict__ x, const T *__restrict__ dy, float *__restrict__ partials, int pixels, int h,
                     int w, int k) {
    static_assert(DIRECT_THREADS == 128, "two pairs of warps");
    __shared__ float second[2][2][DIRECT_TAPS][4][32]; /* the second pair's: [half][m][tap][register][lane] */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, pair = lane % 4;
    int half = warp % 2, runner = blockIdx.x * 2 + warp / 2, runners = gridDim.x * 2, tiles = k / 16;
    bool active = 2 * half < tiles; /* a warp-uniform branch: movmatrix and mma are warp-wide */
    float acc[2][DIRECT_TAPS][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int tap = 0; tap < DIRECT_TAPS; tap++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[m][tap][r] = 0.0f;
    for (long first = (long)runner * 16; active && first < pixels; first += (long)runners * 16) {
        /* b[tap][row]: x at pixels first + 8 row .. + 7's tap neighbours, channel group, pixels 2 pair, 2 pair + 1 */
        uint32_t b[DIRECT_TAPS][2];
#pragma unroll
        for (int row = 0; row < 2; row++) {
            uint32_t taps[DIRECT_TAPS];
            load_taps(x, (int)first + group + 8 * row, pixels, h, w, pair, taps);
#pragma unroll
            for (int tap = 0; tap < DIRECT_TAPS; tap++) b[tap][row] = transpose8x8(taps[tap]);
        }
#pragma unroll
        for (int m = 0; m < 2; m++) {
            int tile = 2 * half + m;
            if (tile >= tiles) continue;
            /* a[q]: dy's channels 16 tile + 8 (q % 2) + group at pixels first + 8 (q / 2) + 2 pair, + 1 */
            uint32_t a[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                long pixel = first + group + 8 * (q / 2);
                const T *at = dy + (size_t)pixel * k + 16 * tile + 8 * (q % 2) + 2 * pair;
                a[q] = transpose8x8(pixel < pixels ? load_pair(at) : 0u);
            }
#pragma unroll
            for (int tap = 0; tap < DIRECT_TAPS; tap++) mma<T>(acc[m][tap], a, b[tap][0], b[tap][1]);
        }
    }
    if (warp >= 2)
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int tap = 0; tap < DIRECT_TAPS; tap++)
#pragma unroll
                for (int r = 0; r < 4; r++) second[half][m][tap][r][lane] = acc[m][tap][r];
    __syncthreads();
    if (warp >= 2 || !active) return;
#pragma unroll
    for (int m = 0; m < 2; m++) {
        int tile = 2 * half + m;
        if (tile >= tiles) continue;
        float *row0 = partials + ((size_t)blockIdx.x * k + 16 * tile + group) * DIRECT_COLS + 2 * pair;
        float *row8 = row0 + 8 * DIRECT_COLS;
#pragma unroll
        for (int tap = 0; tap < DIRECT_TAPS; tap++) {
            float sum[4];
#pragma unroll
            for (int r = 0; r < 4; r++) sum[r] = acc[m][tap][r] + second[half][m][tap][r][lane];
            *(float2 *)(row0 + 8 * tap) = make_float2(sum[0], sum[1]);
            *(float2 *)(row8 + 8 * tap) = make_float2(sum[2], sum[3]);
        }
    }
}

/* dw[o][tap][ch] = (or with accumulate +=) the blocks' partial sums: block o,
 * thread (group, col) adds blocks group, group + DIRECT_FINISH_GROUPS, ... in
 * order, then the groups are added in order, so the sum is the same on every
 * run. */
#define DIRECT_FINISH_GROUPS 12
template <typename T>
static __global__ void __launch_bounds__(DIRECT_FINISH_GROUPS * DIRECT_COLS)
direct_filter_finish(const float *__restrict__ partials, int blocks, int k, T *dw, int accumulate) {
    __shared__ float sums[DIRECT_FINISH_GROUPS][DIRECT_COLS];
    int o = blockIdx.x, col = threadIdx.x % DIRECT_COLS, group = threadIdx.x / DIRECT_COLS;
    float sum = 0.0f;
#pragma unroll 4
    for (int b = group; b < blocks; b += DIRECT_FINISH_GROUPS) sum += partials[((size_t)b * k + o) * DIRECT_COLS + col];
    sums[group][col] = sum;
    __syncthreads();
    if (group) return;
    for (int g = 1; g < DIRECT_FINISH_GROUPS; g++) sum += sums[g][col];
    T *out = dw + (size_t)o * DIRECT_COLS + col;
    *out = from_float<T>(accumulate ? to_float(*out) + sum : sum);
}

/* sum[o], sqsum[o]: the forward blocks' stats [block][2][k] added, thread
 * (group, i) taking blocks group, group + DIRECT_STATS_GROUPS, ... in order
 * (in double), then the groups in order: the same bits on every run. */
#define DIRECT_STATS_GROUPS 8
static __global__ void __launch_bounds__(DIRECT_STATS_GROUPS * 2 * DIRECT_MAX_OUT)
direct_stats_finish(const float *__restrict__ stats, int blocks, int k, float *sum, float *sqsum) {
    __shared__ double sums[DIRECT_STATS_GROUPS][2 * DIRECT_MAX_OUT];
    int i = threadIdx.x % (2 * DIRECT_MAX_OUT), group = threadIdx.x / (2 * DIRECT_MAX_OUT);
    double total = 0.0;
    if (i < 2 * k)
        for (int b = group; b < blocks; b += DIRECT_STATS_GROUPS) total += stats[(size_t)b * 2 * k + i];
    sums[group][i] = total;
    __syncthreads();
    if (group || i >= 2 * k) return;
    for (int g = 1; g < DIRECT_STATS_GROUPS; g++) total += sums[g][i];
    if (i < k) sum[i] = (float)total;
    else sqsum[i - k] = (float)total;
}

/* ---- the direct path, depthwise: 3x3 or 5x5, stride 1 or 2, f16/bf16 NHWC ------------------------ */

/* A depthwise convolution (groups = c = k) does R*S multiply-adds per value it reads or writes: memory-bound,
 * where cuDNN's kernels for it are known to be slow. Forward and data gradient: one thread per output (input)
 * pixel and VEC channels (16 bytes, or 4 where c is no multiple of 8), the taps read straight from x (dy) and
 * the filter's values from cache, summed in fp32, rounded once. The filter gradient in two passes, as the bias
 * gradient: blocks of partial sums over their share of the pixels, each block's threads added in a fixed order,
 * then the blocks added in order (the same bits every run, no atomics). */
#define DW_THREADS 256
#define DW_FILTER_MAX_ROWS 1024             /* blocks of partial sums at most (a few waves of an H200)... */
#define DW_FILTER_MIN_PIXELS 256            /* ...each over this many output pixels at least... */
#define DW_FILTER_MAX_BYTES ((size_t)8 << 20) /* ...and all their sums within this (the finish reads them) */

typedef struct {
    int n, h, w, c, oh, ow, stride, pad;
} DwDims;

static DwDims dw_dims(const Conv2dShape *s) {
    return (DwDims){s->n, s->h, s->w, s->c, conv2d_out_h(s), conv2d_out_w(s), s->stride, s->pad};
}

/* Where tap r of output row (column) p reads: forward, row p * stride - pad + r of x; the data gradient
 * (DATA: p a row of dx), the row of dy whose tap r reads it; -1 where none, in 'size' rows. */
template <bool DATA>
static __device__ __forceinline__ int tap_source(int p, int r, int stride, int pad, int size) {
    int at = DATA ? p + pad - r : p * stride - pad + r;
    if (DATA && at >= 0) {
        if (at % stride) return -1;
        at /= stride;
    }
    return at >= 0 && at < size ? at : -1;
}

/* Forward, y[pixel][ch] = the sum over its taps of x * w; DATA, dx[pixel][ch] = (with accumulate dx +) the sum
 * over the taps that reach it of dy * w. One thread per pixel of out and VEC channels. */
template <typename T, int VEC, int R, bool DATA>
static __global__ void __launch_bounds__(DW_THREADS)
depthwise_pass_kernel(T *__restrict__ out, const T *__restrict__ in, const T *__restrict__ wt, DwDims d,
                      int accumulate) {
    int out_h = DATA ? d.h : d.oh, out_w = DATA ? d.w : d.ow, in_h = DATA ? d.oh : d.h, in_w = DATA ? d.ow : d.w;
    int vecs = d.c / VEC;
    size_t total = (size_t)d.n * out_h * out_w * vecs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)(i % vecs) * VEC;
        size_t pixel = i / vecs;
        int q = (int)(pixel % out_w), p = (int)(pixel / out_w % out_h), img = (int)(pixel / ((size_t)out_w * out_h));
        float acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[e] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = tap_source<DATA>(p, r, d.stride, d.pad, in_h);
            if (row < 0) continue;
#pragma unroll
            for (int t = 0; t < R; t++) {
                int col = tap_source<DATA>(q, t, d.stride, d.pad, in_w);
                if (col < 0) continue;
                Pack<T, VEC> v = *(const Pack<T, VEC> *)(in + (((size_t)img * in_h + row) * in_w + col) * d.c + ch);
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[e] = fmaf(to_float(v.v[e]), to_float(wt[(ch + e) * R * R + r * R + t]), acc[e]);
            }
        }
        Pack<T, VEC> *at = (Pack<T, VEC> *)(out + pixel * d.c + ch), result;
        if (accumulate) result = *at;
#pragma unroll
        for (int e = 0; e < VEC; e++)
            result.v[e] = from_float<T>(accumulate ? to_float(result.v[e]) + acc[e] : acc[e]);
        *at = result;
    }
}

/* partials[block][ch][tap] = the block's sum over its output pixels of dy[pixel][ch] * x[the pixel's tap][ch].
 * Block (x, y) takes channel pairs from y * DW_THREADS, 'width' of them, with 'height' threads a pair, each on
 * every (gridDim.x * height)-th pixel; then per tap one thread a pair adds the column's threads up in order. */
template <typename T, int R>
static __global__ void __launch_bounds__(DW_THREADS)
depthwise_filter_partials(const T *__restrict__ x, const T *__restrict__ dy, float *__restrict__ partials, DwDims d) {
    __shared__ float column[DW_THREADS][2];
    int pairs = d.c / 2, pair0 = blockIdx.y * DW_THREADS;
    int width = min(pairs - pair0, DW_THREADS), height = DW_THREADS / width;
    int col = threadIdx.x % width, lane_row = threadIdx.x / width, ch = 2 * (pair0 + col);
    float acc[2][R * R];
#pragma unroll
    for (int tap = 0; tap < R * R; tap++) acc[0][tap] = acc[1][tap] = 0.0f;
    size_t pixels = (size_t)d.n * d.oh * d.ow;
    for (size_t pixel = (size_t)blockIdx.x * height + lane_row; lane_row < height && pixel < pixels;
         pixel += (size_t)gridDim.x * height) {
        int q = (int)(pixel % d.ow), p = (int)(pixel / d.ow % d.oh), img = (int)(pixel / ((size_t)d.ow * d.oh));
        Pack<T, 2> g = *(const Pack<T, 2> *)(dy + pixel * d.c + ch);
        float g0 = to_float(g.v[0]), g1 = to_float(g.v[1]);
#pragma unroll
        for (int r = 0; r < R; r++) {
            int ih = p * d.stride - d.pad + r;
            if (ih < 0 || ih >= d.h) continue;
#pragma unroll
            for (int t = 0; t < R; t++) {
                int iw = q * d.stride - d.pad + t;
                if (iw < 0 || iw >= d.w) continue;
                Pack<T, 2> v = *(const Pack<T, 2> *)(x + (((size_t)img * d.h + ih) * d.w + iw) * d.c + ch);
                acc[0][r * R + t] = fmaf(g0, to_float(v.v[0]), acc[0][r * R + t]);
                acc[1][r * R + t] = fmaf(g1, to_float(v.v[1]), acc[1][r * R + t]);
            }
        }
    }
#pragma unroll
    for (int tap = 0; tap < R * R; tap++) {
        column[threadIdx.x][0] = acc[0][tap], column[threadIdx.x][1] = acc[1][tap];
        __syncthreads();
        if (lane_row == 0) {
            float sum0 = 0.0f, sum1 = 0.0f;
            for (int lr = 0; lr < height; lr++) {
                sum0 += column[lr * width + col][0];
                sum1 += column[lr * width + col][1];
            }
            float *row = partials + (size_t)blockIdx.x * d.c * R * R;
            row[(size_t)ch * R * R + tap] = sum0;
            row[(size_t)(ch + 1) * R * R + tap] = sum1;
        }
        __syncthreads();
    }
}

/* dw[ch][tap] = (or with accumulate +=) the sum of partials[0..rows)[ch][tap], in order. */
template <typename T>
static __global__ void __launch_bounds__(DW_THREADS)
depthwise_filter_finish(const float *__restrict__ partials, int rows, int count, T *dw, int accumulate) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int row = 0; row < rows; row++) sum += partials[(size_t)row * count + i];
        dw[i] = from_float<T>(accumulate ? to_float(dw[i]) + sum : sum);
    }
}

static int depthwise_filter_rows(const Conv2dShape *s) {
    size_t pixels = (size_t)s->n * conv2d_out_h(s) * conv2d_out_w(s);
    size_t rows = (pixels + DW_FILTER_MIN_PIXELS - 1) / DW_FILTER_MIN_PIXELS;
    size_t most = DW_FILTER_MAX_BYTES / (conv2d_filter_count(s) * sizeof(float));
    if (most > DW_FILTER_MAX_ROWS) most = DW_FILTER_MAX_ROWS;
    if (rows > most) rows = most;
    return rows < 1 ? 1 : (int)rows;
}

static size_t depthwise_filter_bytes(const Conv2dCuda *c) {
    return (size_t)c->direct_blocks[CONV2D_FILTER] * conv2d_filter_count(&c->shape) * sizeof(float);
}

template <typename T, int VEC, int R>
static void launch_depthwise_vec(const Conv2dCuda *c, Conv2dPass pass, void *const *p, cudaStream_t stream) {
    DwDims d = dw_dims(&c->shape);
    size_t pixels = pass == CONV2D_FORWARD ? (size_t)d.n * d.oh * d.ow : (size_t)d.n * d.h * d.w;
    unsigned blocks = elementwise_blocks(pixels * (d.c / VEC));
    if (pass == CONV2D_FORWARD) /* p: x, w, y */
        depthwise_pass_kernel<T, VEC, R, false>
            <<<blocks, DW_THREADS, 0, stream>>>((T *)p[2], (const T *)p[0], (const T *)p[1], d, 0);
    else /* dx, w, dy */
        depthwise_pass_kernel<T, VEC, R, true><<<blocks, DW_THREADS, 0, stream>>>(
            (T *)p[0], (const T *)p[2], (const T *)p[1], d, pass == CONV2D_DATA_ADD);
    CUDA_CHECK_LAUNCH();
}

template <typename T, int R>
static void launch_depthwise_filter(const Conv2dCuda *c, Conv2dPass pass, void *const *p, float *partials,
                                    cudaStream_t stream) {
    DwDims d = dw_dims(&c->shape);
    int rows = c->direct_blocks[CONV2D_FILTER], count = (int)conv2d_filter_count(&c->shape);
    dim3 grid((unsigned)rows, (unsigned)(((size_t)d.c / 2 + DW_THREADS - 1) / DW_THREADS));
    depthwise_filter_partials<T, R><<<grid, DW_THREADS, 0, stream>>>((const T *)p[0], (const T *)p[2], partials, d);
    CUDA_CHECK_LAUNCH();
    depthwise_filter_finish<T><<<elementwise_blocks((size_t)count), DW_THREADS, 0, stream>>>(
        partials, rows, count, (T *)p[1], pass == CONV2D_FILTER_ADD);
    CUDA_CHECK_LAUNCH();
}

template <typename T, int R>
static void launch_depthwise_r(const Conv2dCuda *c, Conv2dPass pass, void *const *p, void *workspace,
                               cudaStream_t stream) {
    if (filter_pass(pass)) launch_depthwise_filter<T, R>(c, pass, p, (float *)workspace, stream);
    else if (c->shape.c % 8 == 0) launch_depthwise_vec<T, 8, R>(c, pass, p, stream);
    else launch_depthwise_vec<T, 2, R>(c, pass, p, stream);
}

template <typename T>
static void launch_depthwise(const Conv2dCuda *c, Conv2dPass pass, void *const *p, void *workspace,
                             cudaStream_t stream) {
    if (c->shape.r == 3) launch_depthwise_r<T, 3>(c, pass, p, workspace, stream);
    else launch_depthwise_r<T, 5>(c, pass, p, workspace, stream);
}

template <typename T>
static void launch_direct(const Conv2dCuda *c, Conv2dPass pass, void *const *p, void *workspace, cudaStream_t stream) {
    if constexpr (std::is_same<T, float>::value) {
        TC_FATAL("conv2d: the direct path takes f16 and bf16 only");
    } else if (depthwise_fits(c)) {
        launch_depthwise<T>(c, pass, p, workspace, stream);
    } else {
        const Conv2dShape *s = &c->shape;
        int pixels = (int)direct_pixels(s);
        unsigned blocks = (unsigned)c->direct_blocks[pass];
        if (pass == CONV2D_FORWARD) {
            direct_forward_kernel<T, false><<<blocks, DIRECT_THREADS, 0, stream>>>(
                (const T *)p[0], (const T *)p[1], (T *)p[2], pixels, s->h, s->w, s->k, NULL);
            CUDA_CHECK_LAUNCH();
            return;
        }
        float *partials = (float *)workspace;
        direct_filter_kernel<T><<<blocks, DIRECT_THREADS, 0, stream>>>((const T *)p[0], (const T *)p[2], partials,
                                                                        pixels, s->h, s->w, s->k);
        CUDA_CHECK_LAUNCH();
        direct_filter_finish<T><<<(unsigned)s->k, DIRECT_FINISH_GROUPS * DIRECT_COLS, 0, stream>>>(
            partials, (int)blocks, s->k, (T *)p[1], pass == CONV2D_FILTER_ADD);
        CUDA_CHECK_LAUNCH();
    }
}

/* The direct forward with its output's sums (conv2d_forward_stats_cuda). */
template <typename T>
static void launch_direct_stats(const Conv2dCuda *c, const void *x, const void *w, void *y, float *sum, float *sqsum,
                                float *stats, cudaStream_t stream) {
    if constexpr (std::is_same<T, float>::value) {
        TC_FATAL("conv2d: the direct path takes f16 and bf16 only");
    } else {
        const Conv2dShape *s = &c->shape;
        int blocks = c->direct_blocks[CONV2D_FORWARD];
        direct_forward_kernel<T, true><<<(unsigned)blocks, DIRECT_THREADS, 0, stream>>>(
            (const T *)x, (const T *)w, (T *)y, (int)direct_pixels(s), s->h, s->w, s->k, stats);
        CUDA_CHECK_LAUNCH();
        direct_stats_finish<<<1, DIRECT_STATS_GROUPS * 2 * DIRECT_MAX_OUT, 0, stream>>>(stats, blocks, s->k, sum,
                                                                                       sqsum);
        CUDA_CHECK_LAUNCH();
    }
}

static void run_direct(const Conv2dCuda *c, cudnnHandle_t h, Conv2dPass pass, void *const *p, void *workspace) {
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    DISPATCH_FLOAT_DTYPE(c->dtype, launch_direct, c, pass, p, workspace, stream);
}

/* The forward stores 16 bytes at a time, and the filter gradient its partial
 * sums 8 bytes at a time. */
static bool direct_aligned(void *const *p, const void *workspace, Conv2dPass pass) {
    for (int i = 0; i < PASS_TENSORS; i++)
        if ((uintptr_t)p[i] % 16 != 0) return false;
    return !filter_pass(pass) || (workspace && (uintptr_t)workspace % 8 == 0);
}

/* The pass by the backend plan where it won (and the tensors are aligned as
 * the plan was built for), else by the legacy algorithm. */
static void run_pass(const Conv2dCuda *c, cudnnHandle_t h, Conv2dPass pass, const void *x, const void *w,
                     const void *y, void *workspace) {
    void *p[PASS_TENSORS] = {(void *)x, (void *)w, (void *)y};
    if (c->use_direct[pass] && direct_aligned(p, workspace, pass)) run_direct(c, h, pass, p, workspace);
    else if (c->use_plan[pass] && aligned(p)) backend_graph_execute(&c->plans[pass], h, p, workspace);
    else run_legacy(c, h, pass, p, workspace);
}

/* Builds the pass's one-operation graph and picks its plan by the policy
 * (timed); 0 where none finalizes. */
static int build_plan(Conv2dCuda *c, cudnnHandle_t h, Conv2dPass pass) {
    const Conv2dShape *s = &c->shape;
    BackendGraph *g = &c->plans[pass];
    cudnnDataType_t type = dtype_cudnn(c->dtype);
    backend_graph_init(g, kPassNames[pass], c->dtype, c->nhwc);
    cudnnBackendDescriptor_t x = backend_graph_tensor(g, UID_X, type, s->n, s->c, s->h, s->w, false);
    /* grouped: the filter's C / G channels, from which cuDNN's graph takes the groups */
    cudnnBackendDescriptor_t w =
        backend_graph_tensor(g, UID_W, type, s->k, s->c / conv2d_groups(s), s->r, s->s, false);
    cudnnBackendDescriptor_t y =
        backend_graph_tensor(g, UID_Y, type, s->n, s->k, conv2d_out_h(s), conv2d_out_w(s), false);
    cudnnBackendDescriptor_t op = backend_graph_conv_pass_op(g, s, kBackendPass[pass], x, w, y, kPassBeta[pass]);
    bool built = backend_graph_build(g, h, &op, 1);
    return backend_graph_choose_plan(g, h, &c->policy) && built; /* which agrees its timings even where not built */
}

typedef struct {
    const Conv2dCuda *c;
    cudnnHandle_t h;
    Conv2dPass pass;
    void **ptrs;
    void *workspace;
} PassRun;

static void run_legacy_timed(void *arg) {
    const PassRun *r = (const PassRun *)arg;
    run_legacy(r->c, r->h, r->pass, r->ptrs, r->workspace);
}

static void run_direct_timed(void *arg) {
    const PassRun *r = (const PassRun *)arg;
    run_direct(r->c, r->h, r->pass, r->ptrs, r->workspace);
}

/* Microseconds per run of the pass by its legacy algorithm; infinite where
 * cuDNN refuses it, so each pass is tried once, unchecked, before it is
 * timed: the backward-data algorithm, chosen for overwriting dx, may not add
 * into it (CUDNN_STATUS_BAD_PARAM on an H100 for a 3x3 stride-2 convolution
 * of a 15x17 map, algorithm 1), and a full GPU suite on an H100 once saw the
 * overwriting pass refused too (8x24x31x31 to 64) where it had run before. */
static float legacy_time_us(const Conv2dCuda *c, cudnnHandle_t h, Conv2dPass pass, void **ptrs, void *workspace) {
    if (legacy_status(c, h, pass, ptrs, workspace) != CUDNN_STATUS_SUCCESS) return INFINITY;
    PassRun run = {c, h, pass, ptrs, workspace};
    return 1000.0f * backend_graph_time_ms(h, run_legacy_timed, &run, BACKEND_GRAPH_TIMING_RUNS);
}

/* The first convolution's: forward and filter gradient; the depthwise: every pass timed (FILTER_ADD follows
 * FILTER). */
static bool direct_candidate(const Conv2dCuda *c, Conv2dPass pass) {
    if (c->policy.prefer_backend) return false;
    if (depthwise_fits(c)) return pass != CONV2D_FILTER_ADD;
    return direct_fits(c) && (pass == CONV2D_FORWARD || pass == CONV2D_FILTER);
}

/* The direct path against the pass's faster of plan and legacy algorithm
 * (timed as they were, on the same scratch); the faster kept. */
static void choose_direct(Conv2dCuda *c, cudnnHandle_t h, Conv2dPass pass, void **ptrs, void *workspace) {
    PassRun run = {c, h, pass, ptrs, workspace};
    c->direct_us[pass] = 1000.0f * backend_graph_time_ms(h, run_direct_timed, &run, BACKEND_GRAPH_TIMING_RUNS);
    conv_policy_agree(&c->policy, &c->direct_us[pass], 1);
    float best = c->use_plan[pass] ? c->plan_us[pass] : c->legacy_us[pass];
    c->use_direct[pass] = c->policy.prefer_direct || c->direct_us[pass] < best;
    if (c->use_direct[pass]) c->use_plan[pass] = 0;
}

static void set_direct_blocks(Conv2dCuda *c) {
    if (depthwise_fits(c)) { /* forward and data gradient: sized at launch */
        c->direct_blocks[CONV2D_FILTER] = c->direct_blocks[CONV2D_FILTER_ADD] = depthwise_filter_rows(&c->shape);
        return;
    }
    int device, sms;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    size_t rounds = (direct_pixels(&c->shape) + DIRECT_PIXELS - 1) / DIRECT_PIXELS;
    size_t forward = (size_t)sms * DIRECT_FORWARD_BLOCKS_PER_SM, filter = (size_t)sms * DIRECT_FILTER_BLOCKS_PER_SM;
    c->direct_blocks[CONV2D_FORWARD] = (int)(rounds < forward ? rounds : forward);
    c->direct_blocks[CONV2D_FILTER] = c->direct_blocks[CONV2D_FILTER_ADD] = (int)(rounds < filter ? rounds : filter);
}

/* Per pass: the legacy algorithm timed on scratch of random values, the backend plan
 * chosen and timed (ops/backend_graph.h), and the faster kept; the workspace
 * grows to the kept plans'. */
static void choose_backend_plans(Conv2dCuda *c, cudnnHandle_t h) {
    const Conv2dShape *s = &c->shape;
    size_t elem = dtype_size(c->dtype);
    size_t bytes[PASS_TENSORS] = {(size_t)s->n * s->c * s->h * s->w * elem, conv2d_filter_count(s) * elem,
                                  (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s) * elem};
    void *ptrs[PASS_TENSORS], *workspace = NULL, *direct_workspace = NULL;
    for (int i = 0; i < PASS_TENSORS; i++) {
        CUDA_CHECK(cudaMalloc(&ptrs[i], bytes[i]));
        backend_graph_fill_scratch(h, ptrs[i], bytes[i]);
    }
    if (c->workspace_bytes) CUDA_CHECK(cudaMalloc(&workspace, c->workspace_bytes));
    if (direct_fits(c) || depthwise_fits(c)) {
        set_direct_blocks(c);
        CUDA_CHECK(cudaMalloc(&direct_workspace, direct_filter_bytes(c)));
    }
    c->plans = (BackendGraph *)calloc(CONV2D_PASSES, sizeof *c->plans);
    if (!c->plans) TC_FATAL("conv2d: out of host memory for the backend plans");
    size_t plan_bytes = 0;
    for (int pass = 0; pass < CONV2D_PASSES; pass++) {
        if (pass == CONV2D_FILTER_ADD) continue; /* taken after FILTER, below */
        c->legacy_us[pass] = legacy_time_us(c, h, (Conv2dPass)pass, ptrs, workspace);
        conv_policy_agree(&c->policy, &c->legacy_us[pass], 1);
        BackendGraph *g = &c->plans[pass];
        if (build_plan(c, h, (Conv2dPass)pass)) {
            c->plan_us[pass] = 1000.0f * g->plan_ms;
            c->use_plan[pass] = c->policy.prefer_backend || c->plan_us[pass] < c->legacy_us[pass];
        }
        if (direct_candidate(c, (Conv2dPass)pass)) choose_direct(c, h, (Conv2dPass)pass, ptrs, direct_workspace);
        if (!c->use_plan[pass] && !c->use_direct[pass] && isinf(c->legacy_us[pass]))
            TC_FATAL("conv2d %dx%dx%dx%d k%d %dx%d stride %d: cuDNN refuses its %s by algorithm %d for this shape, "
                     "and no backend plan builds for it", s->n, s->c, s->h, s->w, s->k, s->r, s->s, s->stride,
                     kPassNames[pass], legacy_algo(c, (Conv2dPass)pass));
        if (c->use_plan[pass] && g->workspace_bytes > plan_bytes) plan_bytes = g->workspace_bytes;
        if (!c->use_plan[pass]) backend_graph_destroy(g);
    }
    for (int i = 0; i < PASS_TENSORS; i++) CUDA_CHECK(cudaFree(ptrs[i]));
    if (workspace) CUDA_CHECK(cudaFree(workspace));
    if (direct_workspace) CUDA_CHECK(cudaFree(direct_workspace));
    if (plan_bytes > c->workspace_bytes) c->workspace_bytes = plan_bytes;
    if (c->use_direct[CONV2D_FILTER] && direct_filter_bytes(c) > c->workspace_bytes)
        c->workspace_bytes = direct_filter_bytes(c);
    /* Only the micro-batches after an optimizer step's first add filter gradients: FILTER's direct path (its
     * finish adds), else the legacy algorithm, which takes beta 1 as it runs; a plan holds its beta. */
    c->use_direct[CONV2D_FILTER_ADD] = c->use_direct[CONV2D_FILTER];
}

void conv2d_cuda_init(Conv2dCuda *c, cudnnHandle_t h, const Conv2dShape *s, DType dtype, int nhwc,
                      const ConvAlgoPolicy *policy) {
    memset(c, 0, sizeof *c);
    check_float_dtype("conv2d", dtype);
    c->shape = *s;
    c->dtype = dtype;
    c->nhwc = nhwc != 0;
    cudnnTensorFormat_t format = c->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    c->policy = *policy;
    cudnnDataType_t data_type = dtype_cudnn(dtype);
    size_t workspace_limit = policy->workspace_limit;
    int out_h = conv2d_out_h(s), out_w = conv2d_out_w(s);
    int groups = conv2d_groups(s);
    if (s->n <= 0 || s->c <= 0 || s->k <= 0 || s->k > 65535 || s->r <= 0 || s->s <= 0 ||
        s->stride <= 0 || s->pad < 0 || out_h <= 0 || out_w <= 0 || s->groups < 0 || s->c % groups || s->k % groups)
        TC_FATAL("conv2d: bad shape n=%d c=%d h=%d w=%d k=%d r=%d s=%d pad=%d stride=%d groups=%d", s->n,
                 s->c, s->h, s->w, s->k, s->r, s->s, s->pad, s->stride, s->groups);

    CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->y_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->b_desc));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&c->w_desc));
    /* Dimensions are given as NCHW in either format; the format says how they lie in memory. */
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->x_desc, format, data_type, s->n, s->c, s->h, s->w));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(c->w_desc, data_type, format, s->k, s->c / groups, s->r, s->s));
    /* Heuristics are asked under the widest math allowed; each pass then runs
     * under the math type of the algorithm it got. */
    c->conv_desc = make_conv_desc(s, widest_math(c));

    int dims[4];
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(c->conv_desc, c->x_desc, c->w_desc,
                                                      &dims[0], &dims[1], &dims[2], &dims[3]));
    if (dims[0] != s->n || dims[1] != s->k || dims[2] != out_h || dims[3] != out_w)
        TC_FATAL("conv2d: cuDNN output %dx%dx%dx%d, expected %dx%dx%dx%d", dims[0], dims[1],
                 dims[2], dims[3], s->n, s->k, out_h, out_w);
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->y_desc, format, data_type, s->n, s->k, out_h, out_w));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->b_desc, CUDNN_TENSOR_NCHW, data_type, 1,
                                           s->k, 1, 1));

    size_t fwd_bytes = 0, data_bytes = 0, filter_bytes = 0;
    cudnnMathType_t fwd_math, data_math, filter_math;
    c->fwd_algo = choose_fwd_algo(c, h, workspace_limit, &fwd_bytes, &fwd_math);
    c->bwd_data_algo = choose_bwd_data_algo(c, h, workspace_limit, &data_bytes, &data_math);
    c->bwd_filter_algo = choose_bwd_filter_algo(c, h, workspace_limit, &filter_bytes, &filter_math);
    CUDNN_CHECK(cudnnSetConvolutionMathType(c->conv_desc, fwd_math));
    c->bwd_data_desc = make_conv_desc(s, data_math);
    c->bwd_filter_desc = make_conv_desc(s, filter_math);
    c->workspace_bytes = fwd_bytes;
    if (data_bytes > c->workspace_bytes) c->workspace_bytes = data_bytes;
    if (filter_bytes > c->workspace_bytes) c->workspace_bytes = filter_bytes;
    if (c->policy.benchmark && c->nhwc && c->dtype != DTYPE_F32) choose_backend_plans(c, h);
    /* The bias gradient's partial sums use the workspace after the filter gradient is done. */
    size_t bias_bytes = own_bias_kernels(c)
                            ? conv2d_bias_grad_workspace_bytes(s->n, s->k, out_h, out_w, c->nhwc)
                            : 0;
    if (bias_bytes > c->workspace_bytes) c->workspace_bytes = bias_bytes;
}

void conv2d_cuda_destroy(Conv2dCuda *c) {
    for (int pass = 0; c->plans && pass < CONV2D_PASSES; pass++) backend_graph_destroy(&c->plans[pass]);
    free(c->plans);
    if (c->conv_desc) CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(c->conv_desc));
    if (c->bwd_data_desc) CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(c->bwd_data_desc));
    if (c->bwd_filter_desc) CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(c->bwd_filter_desc));
    if (c->w_desc) CUDNN_CHECK(cudnnDestroyFilterDescriptor(c->w_desc));
    if (c->b_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(c->b_desc));
    if (c->y_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(c->y_desc));
    if (c->x_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(c->x_desc));
    memset(c, 0, sizeof *c);
}

/* The bias runs in our own kernels except for NCHW float32: cuDNN's legacy
 * cudnnAddTensor and cudnnConvolutionBackwardBias need not take bf16 nor sum in
 * fp32, and NHWC float32 takes ours too rather than lean on those legacy calls'
 * channels-last support. NCHW float32 keeps the cuDNN calls, and so its exact
 * bits.
 *
 * The kernels move 16 bytes (VEC elements) at a time where the tensor allows:
 * a vector must not span two channels, so the run of elements one channel owns
 * (the plane in NCHW, the channels of a pixel in NHWC) must be a multiple of
 * VEC, and the pointer 16-byte aligned. Otherwise VEC is 1. */

template <typename T>
static constexpr int wide_vec() { return (int)(16 / sizeof(T)); }

/* The widest vector for a tensor at p whose channel runs are 'run' elements. */
template <typename T>
static int vector_width(const void *p, size_t run) {
    return (uintptr_t)p % 16 == 0 && run % wide_vec<T>() == 0 ? wide_vec<T>() : 1;
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

static size_t out_plane(const Conv2dShape *s) { return (size_t)conv2d_out_h(s) * conv2d_out_w(s); }

/* y += b per channel, rounded once. y is 'vectors' packs; 'run' is the channel
 * run in packs: in NCHW pack i lies in plane i / run, whose channel is that
 * modulo the channel count; in NHWC it starts at channel (i % run) * VEC. */
template <typename T, int VEC>
static __global__ void conv_add_bias_kernel(T *y, const T *b, size_t vectors, size_t run,
                                            int channels, int nhwc) {
    Pack<T, VEC> *yv = (Pack<T, VEC> *)y;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < vectors;
         i += (size_t)gridDim.x * blockDim.x) {
        Pack<T, VEC> p = yv[i];
        if (nhwc) {
            int k0 = (int)(i % run) * VEC;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                p.v[e] = from_float<T>(to_float(p.v[e]) + to_float(b[k0 + e]));
        } else {
            float bias = to_float(b[(i / run) % channels]);
#pragma unroll
            for (int e = 0; e < VEC; e++) p.v[e] = from_float<T>(to_float(p.v[e]) + bias);
        }
        yv[i] = p;
    }
}

template <typename T, int VEC>
static void launch_add_bias_vec(int nhwc, int n, int k, size_t plane, const void *b, void *y,
                                cudaStream_t stream) {
    size_t vectors = (size_t)n * k * plane / VEC, run = (nhwc ? (size_t)k : plane) / VEC;
    conv_add_bias_kernel<T, VEC><<<elementwise_blocks(vectors), ELEMENTWISE_THREADS, 0, stream>>>(
        (T *)y, (const T *)b, vectors, run, k, nhwc);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_conv_add_bias(int nhwc, int n, int k, size_t plane, const void *b, void *y,
                                 cudaStream_t stream) {
    if (vector_width<T>(y, nhwc ? (size_t)k : plane) > 1)
        launch_add_bias_vec<T, wide_vec<T>()>(nhwc, n, k, plane, b, y, stream);
    else
        launch_add_bias_vec<T, 1>(nhwc, n, k, plane, b, y, stream);
}

/* db[k] += the sum of dy over channel k, in two passes. The first writes
 * partial sums partials[row][k], row = blockIdx.x, each block summing a fixed
 * share of the tensor in a fixed order; the second adds each channel's rows up,
 * again in a fixed order. So the result is deterministic without atomics, and
 * the first pass has enough blocks to read at memory bandwidth. */
#define BIAS_GRAD_THREADS 256
/* At most this many blocks in the first pass: about five waves on an H100 or
 * H200 (132 SMs), so the last, partial wave costs little... */
#define BIAS_GRAD_MAX_BLOCKS 4096
/* ...each with at least this many elements, so small tensors take few blocks. */
#define BIAS_GRAD_MIN_BLOCK_ELEMS 8192
/* Loads each thread issues before adding: bytes in flight to cover latency. */
#define BIAS_GRAD_UNROLL 4

/* Rows of partial sums, the first pass's grid x. Its grid y is k blocks in NCHW
 * and at most ceil(k / BIAS_GRAD_THREADS) in NHWC. */
static unsigned bias_grad_partial_rows(int n, int k, size_t plane, int nhwc) {
    size_t blocks_per_row = nhwc ? ceil_div((size_t)k, BIAS_GRAD_THREADS) : (size_t)k;
    size_t elems = (size_t)n * plane * k;
    size_t rows = ceil_div(ceil_div(elems, BIAS_GRAD_MIN_BLOCK_ELEMS), blocks_per_row);
    size_t most = BIAS_GRAD_MAX_BLOCKS / blocks_per_row;
    if (rows > most) rows = most;
    return rows ? (unsigned)rows : 1;
}

/* The block's sum of v, a tree in shared memory (a fixed order); every thread
 * gets it. Once per kernel. */
static __device__ float block_sum(float v) {
    __shared__ float partial[BIAS_GRAD_THREADS];
    partial[threadIdx.x] = v;
    __syncthreads();
    for (int half = BIAS_GRAD_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    return partial[0];
}

/* NCHW: block (x, k) sums channel k, whose n planes of plane_vecs packs it
 * takes as one sequence, strided over the gridDim.x blocks of the channel.
 * A thread tracks its (image, pack) position instead of dividing each step. */
template <typename T, int VEC>
static __global__ void __launch_bounds__(BIAS_GRAD_THREADS)
bias_grad_nchw_partials(const T *__restrict__ dy, float *__restrict__ partials, int images,
                        int channels, size_t plane_vecs) {
    int k = blockIdx.y;
    const Pack<T, VEC> *channel = (const Pack<T, VEC> *)dy + (size_t)k * plane_vecs;
    size_t image_stride = (size_t)channels * plane_vecs, count = (size_t)images * plane_vecs;
    size_t stride = (size_t)gridDim.x * BIAS_GRAD_THREADS;
    size_t j = (size_t)blockIdx.x * BIAS_GRAD_THREADS + threadIdx.x;
    size_t n = j / plane_vecs, pq = j % plane_vecs;
    size_t step_n = stride / plane_vecs, step_pq = stride % plane_vecs;
    float sum = 0.0f;
    for (; j < count; j += BIAS_GRAD_UNROLL * stride) {
        Pack<T, VEC> v[BIAS_GRAD_UNROLL];
#pragma unroll
        for (int u = 0; u < BIAS_GRAD_UNROLL; u++) {
            if (j + u * stride < count) v[u] = channel[n * image_stride + pq];
            n += step_n;
            pq += step_pq;
            if (pq >= plane_vecs) {
                pq -= plane_vecs;
                n++;
            }
        }
#pragma unroll
        for (int u = 0; u < BIAS_GRAD_UNROLL; u++)
            if (j + u * stride < count)
#pragma unroll
                for (int e = 0; e < VEC; e++) sum += to_float(v[u].v[e]);
    }
    float total = block_sum(sum);
    if (threadIdx.x == 0) partials[(size_t)blockIdx.x * channels + k] = total;
}

/* NHWC: dy is a [rows][cols] matrix of packs (cols = channels / VEC). Block
 * (x, y) takes columns from y * BIAS_GRAD_THREADS, 'width' of them, with
 * 'height' threads per column, each summing every (gridDim.x * height)-th row.
 * Then one thread per channel adds its column's threads up in order. */
template <typename T, int VEC>
static __global__ void __launch_bounds__(BIAS_GRAD_THREADS)
bias_grad_nhwc_partials(const T *__restrict__ dy, float *__restrict__ partials, size_t rows,
                        int channels) {
    __shared__ float column_sums[BIAS_GRAD_THREADS * VEC];
    int cols = channels / VEC, col0 = blockIdx.y * BIAS_GRAD_THREADS;
    int width = min(cols - col0, BIAS_GRAD_THREADS), height = BIAS_GRAD_THREADS / width;
    int col = threadIdx.x % width, lane_row = threadIdx.x / width;
    float sum[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) sum[e] = 0.0f;
    if (lane_row < height) {
        const Pack<T, VEC> *p = (const Pack<T, VEC> *)dy + col0 + col;
        size_t stride = (size_t)gridDim.x * height;
        for (size_t r = (size_t)blockIdx.x * height + lane_row; r < rows;
             r += BIAS_GRAD_UNROLL * stride) {
            Pack<T, VEC> v[BIAS_GRAD_UNROLL];
#pragma unroll
            for (int u = 0; u < BIAS_GRAD_UNROLL; u++)
                if (r + u * stride < rows) v[u] = p[(r + u * stride) * cols];
#pragma unroll
            for (int u = 0; u < BIAS_GRAD_UNROLL; u++)
                if (r + u * stride < rows)
#pragma unroll
                    for (int e = 0; e < VEC; e++) sum[e] += to_float(v[u].v[e]);
        }
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) column_sums[threadIdx.x * VEC + e] = sum[e];
    __syncthreads();
    for (int i = threadIdx.x; i < width * VEC; i += BIAS_GRAD_THREADS) {
        int c = i / VEC, e = i % VEC;
        float total = 0.0f;
        for (int lr = 0; lr < height; lr++) total += column_sums[(lr * width + c) * VEC + e];
        partials[(size_t)blockIdx.x * channels + (size_t)(col0 + c) * VEC + e] = total;
    }
}

/* Block k: db[k] += the sum of partials[0..rows)[k]. */
template <typename T>
static __global__ void __launch_bounds__(BIAS_GRAD_THREADS)
bias_grad_finish(const float *__restrict__ partials, int rows, int channels, T *db) {
    int k = blockIdx.x;
    float sum = 0.0f;
    for (int r = threadIdx.x; r < rows; r += BIAS_GRAD_THREADS)
        sum += partials[(size_t)r * channels + k];
    float total = block_sum(sum);
    if (threadIdx.x == 0) db[k] = from_float<T>(to_float(db[k]) + total);
}

template <typename T>
static void launch_bias_grad_finish(const float *partials, int rows, int k, void *db, cudaStream_t stream) {
    bias_grad_finish<T><<<(unsigned)k, BIAS_GRAD_THREADS, 0, stream>>>(partials, rows, k, (T *)db);
    CUDA_CHECK_LAUNCH();
}

template <typename T, int VEC>
static void launch_bias_grad_partials(int nhwc, int n, int k, size_t plane, const void *dy,
                                      float *partials, unsigned rows, cudaStream_t stream) {
    if (nhwc) {
        dim3 grid(rows, (unsigned)ceil_div((size_t)k / VEC, BIAS_GRAD_THREADS));
        bias_grad_nhwc_partials<T, VEC><<<grid, BIAS_GRAD_THREADS, 0, stream>>>(
            (const T *)dy, partials, (size_t)n * plane, k);
    } else {
        dim3 grid(rows, (unsigned)k);
        bias_grad_nchw_partials<T, VEC><<<grid, BIAS_GRAD_THREADS, 0, stream>>>(
            (const T *)dy, partials, n, k, plane / VEC);
    }
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_conv_bias_grad(int nhwc, int n, int k, size_t plane, const void *dy, void *db,
                                  float *partials, cudaStream_t stream) {
    unsigned rows = bias_grad_partial_rows(n, k, plane, nhwc);
    if (vector_width<T>(dy, nhwc ? (size_t)k : plane) > 1)
        launch_bias_grad_partials<T, wide_vec<T>()>(nhwc, n, k, plane, dy, partials, rows, stream);
    else
        launch_bias_grad_partials<T, 1>(nhwc, n, k, plane, dy, partials, rows, stream);
    launch_bias_grad_finish<T>(partials, (int)rows, k, db, stream);
}

static void check_bias_shape(int n, int k, int out_h, int out_w) {
    if (n <= 0 || k <= 0 || k > 65535 || out_h <= 0 || out_w <= 0)
        TC_FATAL("conv2d bias gradient: bad shape n=%d k=%d out %dx%d", n, k, out_h, out_w);
}

size_t conv2d_bias_grad_workspace_bytes(int n, int k, int out_h, int out_w, int nhwc) {
    check_bias_shape(n, k, out_h, out_w);
    return (size_t)bias_grad_partial_rows(n, k, (size_t)out_h * out_w, nhwc) * k * sizeof(float);
}

void conv2d_bias_grad_cuda(DType dtype, int nhwc, int n, int k, int out_h, int out_w,
                           const void *dy, void *db, void *workspace, cudaStream_t stream) {
    check_float_dtype("conv2d bias gradient", dtype);
    check_bias_shape(n, k, out_h, out_w);
    if (!workspace) TC_FATAL("conv2d bias gradient: no workspace for the partial sums");
    DISPATCH_FLOAT_DTYPE(dtype, launch_conv_bias_grad, nhwc != 0, n, k, (size_t)out_h * out_w, dy,
                         db, (float *)workspace, stream);
}

void conv2d_bias_grad_finish_cuda(DType dtype, const float *partials, int rows, int k, void *db,
                                  cudaStream_t stream) {
    check_float_dtype("conv2d bias gradient", dtype);
    if (rows <= 0 || k <= 0 || k > 65535) TC_FATAL("conv2d bias gradient: %d rows of %d partial sums", rows, k);
    DISPATCH_FLOAT_DTYPE(dtype, launch_bias_grad_finish, partials, rows, k, db, stream);
}

static cudaStream_t handle_stream(cudnnHandle_t h) {
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    return stream;
}

static void add_bias(const Conv2dCuda *c, cudnnHandle_t h, const void *b, void *y) {
    if (!own_bias_kernels(c))
        CUDNN_CHECK(cudnnAddTensor(h, &kOne, c->b_desc, b, &kOne, c->y_desc, y));
    else
        DISPATCH_FLOAT_DTYPE(c->dtype, launch_conv_add_bias, c->nhwc, c->shape.n, c->shape.k,
                             out_plane(&c->shape), b, y, handle_stream(h));
}

static void accumulate_bias_grad(const Conv2dCuda *c, cudnnHandle_t h, const void *dy, void *db,
                                 void *workspace) {
    const Conv2dShape *s = &c->shape;
    if (!own_bias_kernels(c))
        CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &kOne, c->y_desc, dy, &kOne, c->b_desc, db));
    else
        conv2d_bias_grad_cuda(c->dtype, c->nhwc, s->n, s->k, conv2d_out_h(s), conv2d_out_w(s), dy,
                              db, workspace, handle_stream(h));
}

static void check_workspace(const Conv2dCuda *c, const void *workspace) {
    if (c->workspace_bytes > 0 && !workspace)
        TC_FATAL("conv2d: a %zu-byte workspace is needed but none was given", c->workspace_bytes);
}

void conv2d_forward_cuda(const Conv2dCuda *c, cudnnHandle_t h, const void *x, const void *w,
                         const void *b, void *y, void *workspace) {
    check_workspace(c, workspace);
    run_pass(c, h, CONV2D_FORWARD, x, w, y, workspace);
    if (b) add_bias(c, h, b, y);
}

size_t conv2d_direct_stats_bytes(const Conv2dCuda *c) {
    if (!direct_fits(c) || c->direct_blocks[CONV2D_FORWARD] <= 0) return 0;
    return (size_t)c->direct_blocks[CONV2D_FORWARD] * 2 * c->shape.k * sizeof(float);
}

void conv2d_forward_stats_cuda(const Conv2dCuda *c, cudnnHandle_t h, const void *x, const void *w, void *y,
                               float *sum, float *sqsum, void *workspace) {
    const Conv2dShape *s = &c->shape;
    if (conv2d_direct_stats_bytes(c) == 0)
        TC_FATAL("conv2d %dx%dx%dx%d k%d: the direct forward with statistics does not fit this convolution (or was "
                 "not set up: perf.conv_benchmark)", s->n, s->c, s->h, s->w, s->k);
    void *p[PASS_TENSORS] = {(void *)x, (void *)w, y};
    if (!direct_aligned(p, workspace, CONV2D_FILTER))
        TC_FATAL("conv2d: the direct forward with statistics needs x, w, y 16-byte aligned and a workspace");
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    DISPATCH_FLOAT_DTYPE(c->dtype, launch_direct_stats, c, x, w, y, sum, sqsum, (float *)workspace, stream);
}

/* Each flag of accumulate is cuDNN's beta for its gradient: dx = dgrad + beta * dx, dw = wgrad + beta * dw. */
void conv2d_backward_ex_cuda(const Conv2dCuda *c, cudnnHandle_t h, const void *x, const void *w,
                             const void *dy, void *dx, void *dw, void *db, void *workspace,
                             int accumulate) {
    check_workspace(c, workspace);
    if (dx) run_pass(c, h, accumulate & CONV2D_ADD_DX ? CONV2D_DATA_ADD : CONV2D_DATA, dx, w, dy, workspace);
    if (dw) run_pass(c, h, accumulate & CONV2D_ADD_DW ? CONV2D_FILTER_ADD : CONV2D_FILTER, x, dw, dy, workspace);
    if (db) accumulate_bias_grad(c, h, dy, db, workspace);
}
