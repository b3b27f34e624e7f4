#include "ops/conv_bias_relu_pool.h"

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"
#include "runtime/mma_cuda.cuh"

/* The convolution is a GEMM of conv pixels (M) by output channels (N) over
 * K = 9 taps x c_real channels, packed into 32 (k = tap * c_real + channel;
 * past 9 * c_real the pixels read 1 once, then zeros, and the weights are
 * 0), on m16n8k16 tensor-core MMAs.
 *
 * A block of four warps takes a tile of 4 pooled rows by 16 pooled columns
 * (its input, 10 x 34 pixels of 8 channels, in shared memory); a warp takes
 * one pooled row as two groups of 8 pooled pixels. A group's two MMA row
 * tiles are the top and the bottom conv rows of its 8 windows: rows 0-7 the
 * windows' left pixels, rows 8-15 their right ones. So each thread holds a
 * whole window of each of its channels (accumulators c0, c2 of the top tile,
 * c0, c2 of the bottom; c1, c3 the next channel), and the pool, bias and ReLU
 * happen in registers.
 *
 * Backward recomputes the same MMAs (the same bits, so the same maxima),
 * routes dy to each window's first maximum, and takes the filter gradient
 * as MMAs over pixels: dw^T [k][n] += x^T [k][pixels] dconv [pixels][n], with
 * x^T the forward's operands and dconv its accumulators turned into operand
 * layout by movmatrix. The row of x^T that reads 1 gives the bias gradient,
 * the sum of dconv. Every block sums its tiles in registers, then the
 * block's warps in order, into one row of partial sums; a second kernel adds
 * the rows in order into dw and db. */

enum {
    WARPS = 4,
    THREADS = 32 * WARPS,
    TILE_PY = WARPS,              /* pooled rows a block takes */
    TILE_PX = 16,                 /* pooled columns a block takes */
    GROUP = 8,                    /* pooled pixels an MMA pair takes */
    IN_ROWS = 2 * TILE_PY + 2,    /* the tile's input rows, halo included */
    IN_COLS = 2 * TILE_PX + 2,
    CH = 8,                       /* channels of x per pixel (16 bytes) */
    KPACK = 32,                   /* the packed reduction: 9 taps x c_real <= 27, in two k16 steps */
    ROW_PAD = 8,                  /* halves after each pixel's K channels in shared memory: the 8 pixels a
                                     warp's lane quads take fall in different banks */
    BACKWARD_BLOCKS = 396         /* fixed, so that the partial sums add in the same order on every card;
                                     one wave of 3 blocks an SM on an H100 or H200 (132 SMs) */
};

/* ---- where things are ---------------------------------------------------------- */

struct Geometry {
    int n, h, w, k, c_real;
    int oh, ow, tiles_x, tiles_y, tiles;
};

static Geometry geometry(const ConvBiasReluPoolShape *s) {
    Geometry g;
    g.n = s->conv.n, g.h = s->conv.h, g.w = s->conv.w, g.k = s->conv.k, g.c_real = s->c_real;
    g.oh = g.h / 2, g.ow = g.w / 2;
    g.tiles_x = (g.ow + TILE_PX - 1) / TILE_PX, g.tiles_y = (g.oh + TILE_PY - 1) / TILE_PY;
    g.tiles = g.n * g.tiles_x * g.tiles_y;
    return g;
}

/* Packed k's place in the input tile, relative to a pixel's top-left tap; past the real taps, ONE for
 * the first (every pixel reads 1 there: the weights' row is 0, and in backward that row of the filter
 * gradient's product sums dconv, the bias gradient) and ZERO for the rest. */
enum { ONE = -1, ZERO = -2 };

static __device__ __forceinline__ int tap_offset(int k, int c_real) {
    if (k > 9 * c_real) return ZERO;
    if (k == 9 * c_real) return ONE;
    int tap = k / c_real, ch = k % c_real;
    return ((tap / 3) * IN_COLS + tap % 3) * CH + ch;
}

/* one: 1 as T's bits. */
static __device__ __forceinline__ uint16_t tap_value(const uint16_t *tile, int pixel, int offset, uint16_t one) {
    return offset >= 0 ? tile[pixel + offset] : offset == ONE ? one : (uint16_t)0;
}

/* The packed k's a thread's a operands hold (columns 16 ks + 2t, +1, +8, +9), as tap offsets computed
 * once, and 1 in T's bits. */
struct TapOffsets {
    int cols[2][4];
    uint16_t one;
};

template <typename T>
static __device__ TapOffsets tap_offsets(int c_real) {
    int t = threadIdx.x % 4;
    TapOffsets o;
    for (int s = 0; s < 2; s++) {
        const int col[4] = {0, 1, 8, 9};
        for (int i = 0; i < 4; i++) o.cols[s][i] = tap_offset(16 * s + 2 * t + col[i], c_real);
    }
    o.one = bits16(from_float<T>(1.0f));
    return o;
}

/* The input tile of pooled tile (img, py0, px0): conv rows 2 py0 - 1 .. and columns 2 px0 - 1 .., zeros
 * outside the image (the convolution's padding). */
static __device__ void load_input_tile(const uint4 *x, uint4 *tile, const Geometry &g, int img, int py0, int px0) {
    for (int i = threadIdx.x; i < IN_ROWS * IN_COLS; i += THREADS) {
        int gy = 2 * py0 - 1 + i / IN_COLS, gx = 2 * px0 - 1 + i % IN_COLS;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (gy >= 0 && gy < g.h && gx >= 0 && gx < g.w) v = x[((size_t)img * g.h + gy) * g.w + gx];
        tile[i] = v;
    }
}

static __device__ void tile_origin(const Geometry &g, int t, int *img, int *py0, int *px0) {
    *px0 = t % g.tiles_x * TILE_PX;
    *py0 = t / g.tiles_x % g.tiles_y * TILE_PY;
    *img = t / (g.tiles_x * g.tiles_y);
}

/* The weights as MMA b operands (k rows 16 ks + 2t.., channel column n), in shared memory in the order
 * the lanes read them: frag[nt][lane] is lane's four registers for channel tile nt (one 16-byte load,
 * the warp's 512 bytes without a conflict). w is [k][3][3][CH]. */
template <typename T, int NT>
static __device__ void stage_weight_fragments(const T *w, int c_real, uint4 frag[NT][32]) {
    for (int i = threadIdx.x; i < NT * 32; i += THREADS) {
        int nt = i / 32, lane = i % 32, g = lane / 4, t = lane % 4;
        uint32_t r[4];
        for (int j = 0; j < 4; j++) { /* (ks, half) = (j / 2, j % 2) */
            uint16_t v[2];
            for (int e = 0; e < 2; e++) {
                int k = 16 * (j / 2) + 2 * t + 8 * (j % 2) + e, n = nt * 8 + g;
                v[e] = k < 9 * c_real ? bits16(w[((size_t)n * 9 + k / c_real) * CH + k % c_real]) : 0;
            }
            r[j] = pack2(v[0], v[1]);
        }
        frag[nt][lane] = make_uint4(r[0], r[1], r[2], r[3]);
    }
}

/* A group's conv pixels as MMA a operands (rows: pixels, columns: packed k): row tile mt is conv row
 * 2 py + mt of the warp's pooled row, its rows 0-7 the windows' left pixels, 8-15 their right ones. */
static __device__ __forceinline__ void load_pixel_fragments(const uint16_t *tile, int warp, int group,
                                                            const TapOffsets &o, uint32_t frag[2][2][4]) {
    int g = threadIdx.x % 32 / 4;
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        int left = ((2 * warp + mt) * IN_COLS + 2 * (GROUP * group + g)) * CH, right = left + CH;
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            int o0 = o.cols[ks][0], o1 = o.cols[ks][1], o8 = o.cols[ks][2], o9 = o.cols[ks][3];
            frag[mt][ks][0] = pack2(tap_value(tile, left, o0, o.one), tap_value(tile, left, o1, o.one));
            frag[mt][ks][1] = pack2(tap_value(tile, right, o0, o.one), tap_value(tile, right, o1, o.one));
            frag[mt][ks][2] = pack2(tap_value(tile, left, o8, o.one), tap_value(tile, left, o9, o.one));
            frag[mt][ks][3] = pack2(tap_value(tile, right, o8, o.one), tap_value(tile, right, o9, o.one));
        }
    }
}

/* The convolution of the group's 32 pixels for channel tile nt: acc[mt] in accumulator layout. */
template <typename T>
static __device__ __forceinline__ void convolve(const uint32_t pixels[2][2][4], uint4 weights, float acc[2][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
        mma<T>(acc[mt], pixels[mt][0], weights.x, weights.y);
        mma<T>(acc[mt], pixels[mt][1], weights.z, weights.w);
    }
}

/* Channel e (0, 1) of the thread's pair: its window's values of conv + b in window order (top left, top
 * right, bottom left, bottom right), the first maximum's place and its value, as the CPU reference picks. */
static __device__ __forceinline__ int window_max(const float acc[2][4], int e, float b, float *max) {
    float v[4] = {acc[0][e] + b, acc[0][2 + e] + b, acc[1][e] + b, acc[1][2 + e] + b};
    int best = 0;
#pragma unroll
    for (int i = 1; i < 4; i++)
        if (v[i] > v[best]) best = i;
    *max = v[best];
    return best;
}

/* ---- forward ---------------------------------------------------------------------- */

template <typename T, int NT>
static __global__ void __launch_bounds__(THREADS) conv_bias_relu_pool_forward_kernel(const T *x, const T *w,
                                                                                      const T *b, T *y, Geometry g) {
    constexpr int K = NT * 8;
    __shared__ __align__(16) uint16_t tile[IN_ROWS * IN_COLS * CH];
    __shared__ __align__(16) uint32_t stage[WARPS][GROUP * (K + ROW_PAD) / 2]; /* a group's y, pixel by pixel */
    __shared__ float bias[K];
    for (int i = threadIdx.x; i < K; i += THREADS) bias[i] = to_float(b[i]);
    __shared__ uint4 weights[NT][32];
    stage_weight_fragments<T, NT>(w, g.c_real, weights);
    TapOffsets offsets = tap_offsets<T>(g.c_real);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = lane / 4, t = lane % 4;

    for (int tile_id = blockIdx.x; tile_id < g.tiles; tile_id += gridDim.x) {
        int img, py0, px0;
        tile_origin(g, tile_id, &img, &py0, &px0);
        __syncthreads(); /* the last tile's reads are done */
        load_input_tile((const uint4 *)x, (uint4 *)tile, g, img, py0, px0);
        __syncthreads();
        int py = py0 + warp;
        if (py >= g.oh) continue;
        for (int group = 0; group < TILE_PX / GROUP; group++) {
            uint32_t pixels[2][2][4];
            load_pixel_fragments(tile, warp, group, offsets, pixels);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float acc[2][4];
                convolve<T>(pixels, weights[nt][lane], acc);
                uint16_t pair[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float max;
                    window_max(acc, e, bias[nt * 8 + 2 * t + e], &max);
                    pair[e] = bits16(from_float<T>(max > 0.0f ? max : 0.0f));
                }
                stage[warp][(q * (K + ROW_PAD) + nt * 8 + 2 * t) / 2] = pack2(pair[0], pair[1]);
            }
            __syncwarp();
            int px_first = px0 + GROUP * group;
            for (int i = lane; i < GROUP * K / 8; i += 32) {
                int pixel = i / (K / 8), part = i % (K / 8), px = px_first + pixel;
                if (px < g.ow)
                    ((uint4 *)y)[(((size_t)img * g.oh + py) * g.ow + px) * (K / 8) + part] =
                        ((const uint4 *)stage[warp])[pixel * (K + ROW_PAD) / 8 + part];
            }
            __syncwarp();
        }
    }
}

/* ---- backward ---------------------------------------------------------------------- */

/* The group's pixels as the filter gradient's a operands (rows: packed k; columns: the 16 pixels of row
 * tile mt in the order of its accumulator rows): the convolution's a operands transposed, each 8x8
 * quarter by movmatrix, the off-diagonal quarters trading places. */
static __device__ __forceinline__ void transpose_fragments(const uint32_t pixels[2][2][4], uint32_t taps[2][2][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int kt = 0; kt < 2; kt++) {
            taps[mt][kt][0] = transpose8x8(pixels[mt][kt][0]);
            taps[mt][kt][1] = transpose8x8(pixels[mt][kt][2]);
            taps[mt][kt][2] = transpose8x8(pixels[mt][kt][1]);
            taps[mt][kt][3] = transpose8x8(pixels[mt][kt][3]);
        }
}

/* dy of the pooled tile, [TILE_PY][TILE_PX][K + ROW_PAD], zeros outside the image. */
template <int K>
static __device__ void load_dy_tile(const uint4 *dy, uint4 *tile, const Geometry &g, int img, int py0, int px0) {
    constexpr int PARTS = K / 8;
    for (int i = threadIdx.x; i < TILE_PY * TILE_PX * PARTS; i += THREADS) {
        int pixel = i / PARTS, py = py0 + pixel / TILE_PX, px = px0 + pixel % TILE_PX;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (py < g.oh && px < g.ow) v = dy[(((size_t)img * g.oh + py) * g.ow + px) * PARTS + i % PARTS];
        tile[pixel * (K + ROW_PAD) / 8 + i % PARTS] = v;
    }
}

template <typename T, int NT>
static __global__ void __launch_bounds__(THREADS, 3)
    conv_bias_relu_pool_backward_kernel(const T *x, const T *w, const T *b, const T *dy, float *partials, Geometry g) {
    constexpr int K = NT * 8;
    __shared__ __align__(16) uint16_t tile[IN_ROWS * IN_COLS * CH];
    __shared__ __align__(16) T dy_tile[TILE_PY * TILE_PX * (K + ROW_PAD)];
    __shared__ float sums[KPACK * K]; /* dw^T [KPACK][K]: the real taps' rows, then the bias gradient's */
    __shared__ float bias[K];
    __shared__ uint4 weights[NT][32];
    for (int i = threadIdx.x; i < K; i += THREADS) bias[i] = to_float(b[i]);
    stage_weight_fragments<T, NT>(w, g.c_real, weights);
    TapOffsets offsets = tap_offsets<T>(g.c_real);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = lane / 4, t = lane % 4;
    float dw[2][NT][4] = {};

    for (int tile_id = blockIdx.x; tile_id < g.tiles; tile_id += gridDim.x) {
        int img, py0, px0;
        tile_origin(g, tile_id, &img, &py0, &px0);
        __syncthreads(); /* the last tile's reads are done */
        load_input_tile((const uint4 *)x, (uint4 *)tile, g, img, py0, px0);
        load_dy_tile<K>((const uint4 *)dy, (uint4 *)dy_tile, g, img, py0, px0);
        __syncthreads();
        if (py0 + warp >= g.oh) continue;
        for (int group = 0; group < TILE_PX / GROUP; group++) {
            uint32_t pixels[2][2][4], taps[2][2][4];
            load_pixel_fragments(tile, warp, group, offsets, pixels);
            transpose_fragments(pixels, taps);
            const T *dy_row = dy_tile + (warp * TILE_PX + GROUP * group + q) * (K + ROW_PAD);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float acc[2][4];
                convolve<T>(pixels, weights[nt][lane], acc);
                uint16_t routed[4][2]; /* dy at the window's first maximum, 0 at its other places */
                uint32_t dy_pair = *(const uint32_t *)(dy_row + nt * 8 + 2 * t);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float max;
                    int best = window_max(acc, e, bias[nt * 8 + 2 * t + e], &max);
                    uint16_t grad = max > 0.0f ? (uint16_t)(dy_pair >> (16 * e)) : (uint16_t)0;
#pragma unroll
                    for (int i = 0; i < 4; i++) routed[i][e] = i == best ? grad : (uint16_t)0;
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    uint32_t left = transpose8x8(pack2(routed[2 * mt][0], routed[2 * mt][1]));
                    uint32_t right = transpose8x8(pack2(routed[2 * mt + 1][0], routed[2 * mt + 1][1]));
#pragma unroll
                    for (int kt = 0; kt < 2; kt++) mma<T>(dw[kt][nt], taps[mt][kt], left, right);
                }
            }
        }
    }

    /* The block's sum: its warps in order, then one row of partial sums. */
    __syncthreads();
    for (int turn = 0; turn < WARPS; turn++) {
        if (warp == turn)
#pragma unroll
            for (int kt = 0; kt < 2; kt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        int k = 16 * kt + q + 8 * (i / 2), ch = nt * 8 + 2 * t + i % 2;
                        float *s = &sums[k * K + ch];
                        *s = turn ? *s + dw[kt][nt][i] : dw[kt][nt][i];
                    }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < KPACK * K; i += THREADS) partials[(size_t)blockIdx.x * KPACK * K + i] = sums[i];
}

/* dw and db += the rows of partial sums, added in row order: a thread per value. */
template <typename T>
static __global__ void conv_bias_relu_pool_finish_kernel(const float *partials, int rows, Geometry g, T *dw, T *db) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, width = KPACK * g.k;
    int k = i / g.k, n = i % g.k, taps = 9 * g.c_real;
    if (k > taps) return; /* past the bias row: zeros */
    float sum = 0.0f;
    for (int r = 0; r < rows; r++) sum += partials[(size_t)r * width + i];
    T *at = k == taps ? &db[n] : &dw[((size_t)n * 9 + k / g.c_real) * CH + k % g.c_real];
    *at = from_float<T>(to_float(*at) + sum);
}

/* ---- launches --------------------------------------------------------------------- */

static int backward_blocks(const Geometry &g) { return g.tiles < BACKWARD_BLOCKS ? g.tiles : BACKWARD_BLOCKS; }

size_t conv_bias_relu_pool_workspace_bytes_cuda(const ConvBiasReluPoolShape *s) {
    Geometry g = geometry(s);
    return (size_t)backward_blocks(g) * KPACK * g.k * sizeof(float);
}

static void check_aligned(const char *what, const void *p) {
    if ((uintptr_t)p % 16) TC_FATAL("conv_bias_relu_pool: %s is not 16-byte aligned", what);
}

template <typename T, int NT>
static void launch(const Geometry &g, const void *x, const void *w, const void *b, const void *dy, void *y_or_dw,
                   void *db, void *workspace, cudaStream_t stream) {
    if (!dy) { /* one wave: each block stages the weights once and loops over tiles */
        static int wave = 0;
        if (!wave) {
            int device, sms, per_sm;
            CUDA_CHECK(cudaGetDevice(&device));
            CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, conv_bias_relu_pool_forward_kernel<T, NT>,
                                                                     THREADS, 0));
            wave = sms * (per_sm > 0 ? per_sm : 1);
        }
        int blocks = g.tiles < wave ? g.tiles : wave;
        conv_bias_relu_pool_forward_kernel<T, NT><<<blocks, THREADS, 0, stream>>>(
            (const T *)x, (const T *)w, (const T *)b, (T *)y_or_dw, g);
        CUDA_CHECK_LAUNCH();
        return;
    }
    int rows = backward_blocks(g);
    conv_bias_relu_pool_backward_kernel<T, NT><<<rows, THREADS, 0, stream>>>(
        (const T *)x, (const T *)w, (const T *)b, (const T *)dy, (float *)workspace, g);
    CUDA_CHECK_LAUNCH();
    int width = KPACK * g.k;
    conv_bias_relu_pool_finish_kernel<T><<<(width + 127) / 128, 128, 0, stream>>>((const float *)workspace, rows, g,
                                                                                  (T *)y_or_dw, (T *)db);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_k(const Geometry &g, const void *x, const void *w, const void *b, const void *dy, void *y_or_dw,
                     void *db, void *workspace, cudaStream_t stream) {
    switch (g.k / 8) {
    case 1: launch<T, 1>(g, x, w, b, dy, y_or_dw, db, workspace, stream); break;
    case 2: launch<T, 2>(g, x, w, b, dy, y_or_dw, db, workspace, stream); break;
    case 3: launch<T, 3>(g, x, w, b, dy, y_or_dw, db, workspace, stream); break;
    case 4: launch<T, 4>(g, x, w, b, dy, y_or_dw, db, workspace, stream); break;
    case 5: launch<T, 5>(g, x, w, b, dy, y_or_dw, db, workspace, stream); break;
    case 6: launch<T, 6>(g, x, w, b, dy, y_or_dw, db, workspace, stream); break;
    case 7: launch<T, 7>(g, x, w, b, dy, y_or_dw, db, workspace, stream); break;
    default: launch<T, 8>(g, x, w, b, dy, y_or_dw, db, workspace, stream); break;
    }
}

static void dispatch(DType dtype, const ConvBiasReluPoolShape *s, const void *x, const void *w, const void *b,
                     const void *dy, void *y_or_dw, void *db, void *workspace, cudaStream_t stream) {
    Geometry g = geometry(s);
    check_aligned("x", x), check_aligned(dy ? "dy" : "y", dy ? dy : y_or_dw); /* read and written 16 bytes at a time */
    if (dy && !workspace) TC_FATAL("conv_bias_relu_pool: backward without a workspace");
    if (dtype == DTYPE_F16) launch_k<__half>(g, x, w, b, dy, y_or_dw, db, workspace, stream);
    else launch_k<__nv_bfloat16>(g, x, w, b, dy, y_or_dw, db, workspace, stream);
}

void conv_bias_relu_pool_forward_cuda(DType dtype, const ConvBiasReluPoolShape *s, const void *x, const void *w,
                                      const void *b, void *y, cudaStream_t stream) {
    dispatch(dtype, s, x, w, b, NULL, y, NULL, NULL, stream);
}

void conv_bias_relu_pool_backward_cuda(DType dtype, const ConvBiasReluPoolShape *s, const void *x, const void *w,
                                       const void *b, const void *dy, void *dw, void *db, void *workspace,
                                       cudaStream_t stream) {
    dispatch(dtype, s, x, w, b, dy, dw, db, workspace, stream);
}
