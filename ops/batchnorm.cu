/* Batch normalization on the GPU with our own kernels (why not cuDNN's: see
 * batchnorm.h). Three kernels a call, all but the middle one memory-bound:
 *
 *   reduce:   grid (rows, channel groups). NCHW: block (r, c) sums its share of
 *             channel c (the channel's n*h*w values taken as one sequence of
 *             vectors, cut into 'rows' contiguous chunks). NHWC: the tensor is a
 *             [n*h*w][c] matrix; block (r, g) takes chunk r of its rows and a
 *             tile of up to 256 column vectors, 'height' threads per column, so
 *             a warp reads contiguous memory. Each block writes its partial sums
 *             of every channel it touched to the scratch.
 *   finalize: a block per channel adds that channel's partial sums in a fixed
 *             order, in double, and derives the statistics and four per-channel
 *             coefficients (and adds dgamma, dbeta).
 *   apply:    the reduce's grid, its chunks taken in reverse order so that the
 *             first blocks find what the reduce read last still in L2; each
 *             thread's channel (NCHW: the block's; NHWC: its column's) is
 *             fixed, so its coefficients sit in registers:
 *               forward   y  = (x - mean) * scale + shift           [relu or gelu]
 *               backward  dx = a * dy' + b * (x - mean) + d  [+ dx]
 *             (dy' = dy masked by y > 0 for relu, y recomputed from x as the
 *             forward computed it, bit for bit, so that backward never reads
 *             y, or where a convolution's prologue applied the norm, by
 *             x * scale' + bias' > 0 from that prologue's scale and bias; for
 *             gelu dy * gelu'(z), z = (x - mean) * gamma * invstd + beta
 *             recomputed in both passes)
 *             with scale = gamma * invstd, shift = beta and
 *               a = gamma * invstd, b = -gamma * invstd^3 * sum(dy' (x - mean)) / m,
 *               d = -gamma * invstd * sum(dy') / m,
 *             which is batchnorm.h's dx rearranged; x - mean is kept as such so
 *             that a large mean does not cancel.
 * Synchronized (several processes share the batch), the finalize is split in
 * two: one kernel writes each channel's local sums and count (double) to the
 * scratch, the caller's reduce adds them over the processes on the stream,
 * and a second kernel derives the statistics and coefficients from the global
 * sums. Backward, the first also adds dgamma and dbeta (local sums). Forward,
 * each process shifts by its own first value, which the others do not know:
 * the first kernel turns its shifted sums into sums of x and x^2 in double,
 * where |mean| >> std no longer cancels.
 * Threads sum in fp32, each over a few dozen vectors, in a fixed order. The
 * partial sums are 2 x channels x rows floats: NCHW takes many blocks per
 * channel; NHWC, where every block touches every channel, few enough that each
 * covers at least 64 rows and 16 per thread, so that the partials stay a small
 * fraction of the tensor (1/16 of an f16 one at most, 1/128 at c = 64), unless
 * that leaves the GPU idle: a small tensor takes 512 blocks, down to a row a
 * thread (its partials at most 2 x 512 x c floats). */
#include "ops/batchnorm.h"
#include "ops/gelu_math.h"

#include <stdint.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

#define BN_THREADS 256
/* Blocks of one reduction at most: several waves of 256-thread blocks on an
 * H100 or H200 (132 SMs)... */
#define BN_MAX_BLOCKS 2048
/* ...each with at least this many elements (NCHW), so small tensors take few blocks. */
#define BN_MIN_BLOCK_ELEMS 8192
/* NHWC: each block takes at least this many rows of the [n*h*w][c] matrix, and
 * at least BN_NHWC_ROWS_PER_THREAD per thread: the partial sums (two rows of c
 * per block) stay small, and a thread's coefficients are loaded once for many
 * vectors. */
#define BN_NHWC_MIN_ROWS 64
#define BN_NHWC_ROWS_PER_THREAD 16
/* ...but where that leaves fewer blocks than this (about four an SM of an
 * H100), they take fewer rows each: at 2000x256x3x3 the 141 blocks of 16
 * rows a thread kept 13% of the warps busy (ncu: the forward apply 17 us
 * for 9 MB). */
#define BN_NHWC_MIN_BLOCKS 512
/* Channels-last forward apply: blocks resident per SM that its registers must
 * allow. ncu on an H100 found its GELU pass latency-bound at 3 (69 registers,
 * 37% occupancy, 44% of the memory roof); at 4 it fits 64 registers without
 * spilling. The backward passes need more and would spill. */
#define BN_NHWC_APPLY_BLOCKS 4
/* ...and with a residual added (its loads in flight too), fewer. */
#define BN_NHWC_RES_BLOCKS 3
/* Vectors each thread loads before using them: bytes in flight. */
#define BN_UNROLL 4
/* n*h*w at most: per-channel indices stay 32-bit (fast division). */
#define BN_MAX_COUNT (1u << 30)

/* reductions; BN_BWD_GELU_STORE also writes dy * gelu'(z) to dz, BN_BWD_MASK_STORE dy masked by mask > 0
 * (BN_ACT_ADD_RELU), each for an apply pass as BN_BWD's; the _PROLOGUE modes mask by the ReLU's input as
 * a convolution's prologue computed it, x * relu_coef[c] + relu_coef[channels + c] */
enum { BN_FWD, BN_BWD, BN_BWD_RELU, BN_BWD_GELU, BN_BWD_GELU_STORE, BN_BWD_MASK_STORE, BN_BWD_RELU_PROLOGUE };
enum { BN_APPLY_FWD, BN_APPLY_FWD_RELU, BN_APPLY_FWD_GELU, /* apply passes; backward from BN_APPLY_BWD on */
       BN_APPLY_BWD, BN_APPLY_BWD_RELU, BN_APPLY_BWD_GELU, BN_APPLY_BWD_RELU_PROLOGUE };

template <typename T, int N>
struct alignas(sizeof(T) * N) BnPack {
    T v[N];
};

/* Everything a kernel may need, passed by value. */
struct BnArgs {
    const void *x, *dy;
    void *out;              /* y (forward) or dx (backward) */
    unsigned images, channels, plane, count; /* n, c, h*w, n*h*w */
    unsigned rows;          /* partial sums per channel */
    float *partials;        /* [2][channels][rows]: partial_at */
    float4 *coef;           /* [channels]: mean, then scale/shift/- or a/b/d */
    /* forward statistics */
    const float *gamma, *beta;
    float momentum, eps;
    float *running_mean, *running_var, *save_mean, *save_invstd;
    /* eval */
    const float *eval_mean, *eval_var;
    /* backward */
    const float *mean_in, *invstd_in;
    int coef_saved;         /* BN_TRAIN_SAVED: the forward apply pass makes its coefficients (saved_coef) */
    void *dgamma, *dbeta;
    int grad_dtype;
    int accumulate;
    double *sums;           /* synchronized: [3][channels], the two sums and the count */
    void *dz;               /* BN_BWD_GELU_STORE: dy * gelu'(z); BN_BWD_MASK_STORE: dy masked; in the dtype */
    const void *mask;       /* BN_BWD_MASK_STORE: the ReLU's output after the add (dy passes where > 0) */
    const void *relu_coef;  /* the _PROLOGUE modes: [2][channels] in the dtype, the prologue's scale and bias */
    const void *res;        /* forward: added before the activation, as x (NULL: none) */
    const MaxPoolCuda *pool;/* forward: the max-pool after the activation runs the apply pass (NULL: none) */
};

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* The partial sum 'which' (0, 1) of channel c from reduction block 'row': a
 * channel's rows side by side, so that the finish's loads are coalesced (in
 * [rows][channels] each lane of a warp loaded a sector of its own). */
static __device__ __forceinline__ float *partial_at(const BnArgs &a, int which, size_t c, unsigned row) {
    return a.partials + ((size_t)which * a.channels + c) * a.rows + row;
}

/* Blocks along a channel group: the reductions' grid x, fixed at init for the
 * shape (the scratch holds rows x c partial sums). NHWC sizes it for the
 * 16-byte vectors the aligned case runs with (the half types' backward
 * reductions, on 8-byte ones, take twice the rows a thread). */
static unsigned bn_rows(const BatchNormShape *s, DType dtype, int nhwc) {
    size_t count = (size_t)s->n * s->h * s->w, rows;
    if (nhwc) {
        size_t wide = 16 / dtype_size(dtype), vec = s->c % wide == 0 ? wide : 1;
        size_t cols = s->c / vec, groups = ceil_div(cols, BN_THREADS);
        size_t width = cols < BN_THREADS ? cols : BN_THREADS, height = BN_THREADS / width;
        size_t per_block = height * BN_NHWC_ROWS_PER_THREAD;
        if (per_block < BN_NHWC_MIN_ROWS) per_block = BN_NHWC_MIN_ROWS;
        rows = ceil_div(count, per_block);
        if (rows * groups < BN_NHWC_MIN_BLOCKS) { /* a small tensor: more blocks, down to a row a thread */
            size_t fill = ceil_div(BN_NHWC_MIN_BLOCKS, groups), most = ceil_div(count, height);
            rows = fill < most ? fill : most;
        }
        if (rows > BN_MAX_BLOCKS / groups) rows = BN_MAX_BLOCKS / groups;
    } else {
        size_t blocks = ceil_div(count * s->c, BN_MIN_BLOCK_ELEMS);
        if (blocks > BN_MAX_BLOCKS) blocks = BN_MAX_BLOCKS;
        rows = ceil_div(blocks, (size_t)s->c);
        if (rows > count) rows = count;
    }
    return rows ? (unsigned)rows : 1;
}

/* ---- device helpers ---------------------------------------------------------- */

static __device__ __forceinline__ float relu_f(float v) { return v < 0.0f ? 0.0f : v; }

/* The forward's scale, gamma * invstd, from the saved invstd (rounded to
 * fp32): the backward's coefficient a is the same value, so its ReLU mask
 * recomputes the forward's output bit for bit. */
static __device__ __forceinline__ float bn_scale(float gamma, float invstd) {
    return (float)((double)gamma * (double)invstd);
}

/* The forward's y = act(bn(x)) before the activation: (x - mean) * scale + shift, one rounding. */
static __device__ __forceinline__ float bn_value(float xc, float scale, float shift) {
    return __fmaf_rn(xc, scale, shift);
}

/* Channel c's scale and bias where a convolution's prologue applied the norm
 * (BatchNormParams.relu_coef): bn_value(x, scale, bias) is that prologue's
 * ReLU input (conv_genstats.h). */
template <typename T>
static __device__ __forceinline__ void prologue_coef(const BnArgs &a, unsigned c, float &scale,
                                                     float &bias) {
    scale = to_float(((const T *)a.relu_coef)[c]);
    bias = to_float(((const T *)a.relu_coef)[a.channels + c]);
}

static __device__ __forceinline__ float load_grad(const void *buf, int dtype, unsigned c) {
    switch (dtype) {
    case DTYPE_F16: return to_float(((const __half *)buf)[c]);
    case DTYPE_BF16: return to_float(((const __nv_bfloat16 *)buf)[c]);
    default: return ((const float *)buf)[c];
    }
}

static __device__ __forceinline__ void store_grad(void *buf, int dtype, unsigned c, float v) {
    switch (dtype) {
    case DTYPE_F16: ((__half *)buf)[c] = from_float<__half>(v); break;
    case DTYPE_BF16: ((__nv_bfloat16 *)buf)[c] = from_float<__nv_bfloat16>(v); break;
    default: ((float *)buf)[c] = v; break;
    }
}

/* Channel c's values that its statistics or coefficients start from. The
 * finalize loads them before it adds the partial sums: loaded after its first
 * store, each would wait for the one before (the compiler cannot tell the
 * pointers apart), a trip to memory each. */
struct ChannelIn {
    double k;                        /* forward: the sums' shift (the caller sets it) */
    float gamma, beta;
    float running_mean, running_var; /* forward, where updated */
    float mean, invstd;              /* backward: the forward's saved statistics */
    float dgamma, dbeta;             /* backward: the gradients added to */
};

template <int MODE>
static __device__ __forceinline__ ChannelIn channel_in(const BnArgs &a, unsigned c) {
    ChannelIn in = {};
    in.gamma = a.gamma[c];
    if (MODE == BN_FWD) {
        in.beta = a.beta[c];
        if (a.momentum != 0.0f && a.running_mean) in.running_mean = a.running_mean[c];
        if (a.momentum != 0.0f && a.running_var) in.running_var = a.running_var[c];
    } else {
        in.mean = a.mean_in[c];
        in.invstd = a.invstd_in[c];
        if (a.dbeta) in.dbeta = load_grad(a.dbeta, a.grad_dtype, c);
        if (a.dgamma) in.dgamma = load_grad(a.dgamma, a.grad_dtype, c);
    }
    return in;
}

/* Block c adds channel c's partial sums, thread t taking rows t, t + 256, ...
 * (four rows' loads issued before their adds), then a tree in shared memory
 * (fixed order), in double; thread 0 gets the channel's two sums. */
static __device__ void channel_sums(const BnArgs &a, unsigned c, double &s1, double &s2) {
    __shared__ double sums1[BN_THREADS], sums2[BN_THREADS];
    const float *p1 = partial_at(a, 0, c, 0), *p2 = partial_at(a, 1, c, 0);
    s1 = 0.0, s2 = 0.0;
    unsigned r = threadIdx.x;
    for (; r + 3 * BN_THREADS < a.rows; r += 4 * BN_THREADS) {
        float v1[4], v2[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            v1[u] = p1[r + u * BN_THREADS];
            v2[u] = p2[r + u * BN_THREADS];
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            s1 += v1[u];
            s2 += v2[u];
        }
    }
    for (; r < a.rows; r += BN_THREADS) {
        s1 += p1[r];
        s2 += p2[r];
    }
    sums1[threadIdx.x] = s1;
    sums2[threadIdx.x] = s2;
    __syncthreads();
    for (int half = BN_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            sums1[threadIdx.x] += sums1[threadIdx.x + half];
            sums2[threadIdx.x] += sums2[threadIdx.x + half];
        }
        __syncthreads();
    }
    s1 = sums1[0];
    s2 = sums2[0];
}

/* Forward: from the sums of x - in.k and (x - in.k)^2 over m values, the
 * statistics (saved, running) and the coefficients. */
static __device__ void forward_stats(const BnArgs &a, unsigned c, const ChannelIn &in, double s1, double s2,
                                     double m) {
    double d = s1 / m, mean = in.k + d, var = s2 / m - d * d;
    if (var < 0.0) var = 0.0;
    double invstd = 1.0 / sqrt(var + (double)a.eps);
    if (a.save_mean) a.save_mean[c] = (float)mean;
    if (a.save_invstd) a.save_invstd[c] = (float)invstd;
    if (a.momentum != 0.0f) {
        double mom = a.momentum;
        if (a.running_mean) a.running_mean[c] = (float)((1.0 - mom) * in.running_mean + mom * mean);
        if (a.running_var) a.running_var[c] = (float)((1.0 - mom) * in.running_var + mom * var * m / (m - 1.0));
    }
    a.coef[c] = make_float4((float)mean, bn_scale(in.gamma, (float)invstd), in.beta, 0.0f);
}

/* Backward, from the sums of dy' and dy' * (x - mean). */
static __device__ void add_param_grads(const BnArgs &a, unsigned c, const ChannelIn &in, double s1, double s2) {
    if (a.dbeta) store_grad(a.dbeta, a.grad_dtype, c, in.dbeta + (float)s1);
    if (a.dgamma) store_grad(a.dgamma, a.grad_dtype, c, in.dgamma + (float)(s2 * in.invstd));
}

static __device__ void backward_coef(const BnArgs &a, unsigned c, const ChannelIn &in, double s1, double s2,
                                     double m) {
    double invstd = in.invstd, g = in.gamma;
    a.coef[c] = make_float4(in.mean, bn_scale(in.gamma, in.invstd),
                            (float)(-g * invstd * invstd * invstd * s2 / m),
                            (float)(-g * invstd * s1 / m));
}

/* The forward reduction's shift: channel c's first value. */
template <typename T>
static __device__ __forceinline__ double first_value(const BnArgs &a, unsigned c, int nhwc) {
    return to_float(((const T *)a.x)[nhwc ? (size_t)c : (size_t)c * a.plane]);
}

/* Block c: channel c's statistics and coefficients (and dgamma, dbeta). */
template <typename T, int MODE>
static __global__ void __launch_bounds__(BN_THREADS) bn_finalize(BnArgs a, int nhwc) {
    unsigned c = blockIdx.x;
    ChannelIn in;
    if (threadIdx.x == 0) {
        in = channel_in<MODE>(a, c);
        if (MODE == BN_FWD) in.k = first_value<T>(a, c, nhwc);
    }
    double s1, s2;
    channel_sums(a, c, s1, s2);
    if (threadIdx.x != 0) return;
    if (MODE == BN_FWD) {
        forward_stats(a, c, in, s1, s2, a.count);
    } else {
        add_param_grads(a, c, in, s1, s2);
        backward_coef(a, c, in, s1, s2, a.count);
    }
}

/* Synchronized, block c: channel c's local sums and count to a.sums.
 * Forward: sums of x and x^2, from those of x - k and (x - k)^2; backward:
 * dgamma and dbeta added from the local sums. */
template <typename T, int MODE>
static __global__ void __launch_bounds__(BN_THREADS) bn_finalize_local(BnArgs a, int nhwc) {
    unsigned c = blockIdx.x, C = a.channels;
    double s1, s2, m = a.count, k = 0.0;
    ChannelIn in;
    if (threadIdx.x == 0) {
        if (MODE == BN_FWD) k = first_value<T>(a, c, nhwc);
        else in = channel_in<MODE>(a, c);
    }
    channel_sums(a, c, s1, s2);
    if (threadIdx.x != 0) return;
    if (MODE == BN_FWD) {
        s2 += (2.0 * s1 + m * k) * k;
        s1 += m * k;
    } else {
        add_param_grads(a, c, in, s1, s2);
    }
    a.sums[c] = s1;
    a.sums[C + c] = s2;
    a.sums[2 * C + c] = m;
}

/* Synchronized: the statistics and coefficients from the global sums. */
template <int MODE>
static __global__ void bn_sync_coef(BnArgs a) {
    unsigned C = a.channels;
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        ChannelIn in = channel_in<MODE>(a, c);
        double s1 = a.sums[c], s2 = a.sums[C + c], m = a.sums[2 * C + c];
        if (MODE == BN_FWD) forward_stats(a, c, in, s1, s2, m);
        else backward_coef(a, c, in, s1, s2, m);
    }
}

/* dy through the fused activation's derivative, xc = x - mean and shift =
 * beta: ReLU masks it by its output y > 0, y recomputed as the forward stored
 * it (bn_value with scale = bn_scale, rounded to the dtype; NaN and -0 masked
 * as there); GELU multiplies by gelu'(z) at its input z = xc * scale + shift,
 * scale = gamma * invstd, rounded to the dtype as BN_BWD_GELU_STORE stores it:
 * every path sums the same values. */
template <typename T, bool RELU, bool GELU>
static __device__ __forceinline__ float activation_dy(float dy, float xc, float scale, float shift) {
    if (RELU) return to_float(from_float<T>(bn_value(xc, scale, shift))) > 0.0f ? dy : 0.0f;
    if (GELU) return to_float(from_float<T>(dy * gelu_grad_f(xc * scale + shift)));
    return dy;
}

/* What one element adds to the two sums. k: the forward's shift, or the mean;
 * zs, zb: the activation's scale and shift (activation_dy), applied to x - k,
 * or under BN_BWD_RELU_PROLOGUE to x itself. */
template <typename T, int MODE>
static __device__ __forceinline__ void accumulate_element(float x, float dy, float k, float zs, float zb,
                                                          float &s1, float &s2) {
    if (MODE == BN_FWD) {
        float d = x - k;
        s1 += d;
        s2 += d * d;
    } else {
        constexpr bool PROLOGUE = MODE == BN_BWD_RELU_PROLOGUE;
        float g = activation_dy<T, MODE == BN_BWD_RELU || PROLOGUE, MODE == BN_BWD_GELU>(dy, PROLOGUE ? x : x - k,
                                                                                          zs, zb);
        s1 += g;
        s2 += g * (x - k);
    }
}

/* One element of the apply pass; coef = mean, then three per mode; shift:
 * the backward's beta, for the activation (backward, p = gamma * invstd);
 * under BN_APPLY_BWD_RELU_PROLOGUE the ReLU's mask from zs and shift (the
 * prologue's scale and bias) applied to x; res: forward, the residual's
 * element added before the activation (NULL: none). */
template <typename T, int MODE>
static __device__ __forceinline__ float apply_element(float x, float dy, float old, float mean, float p,
                                                      float q, float r, float zs, float shift, int accumulate,
                                                      const float *res) {
    if (MODE < BN_APPLY_BWD) {
        float v = bn_value(x - mean, p, q);
        if (res) v += *res;
        if (MODE == BN_APPLY_FWD_GELU) return gelu_value_f(v);
        return MODE == BN_APPLY_FWD_RELU ? relu_f(v) : v;
    }
    constexpr bool PROLOGUE = MODE == BN_APPLY_BWD_RELU_PROLOGUE;
    float g = activation_dy<T, MODE == BN_APPLY_BWD_RELU || PROLOGUE, MODE == BN_APPLY_BWD_GELU>(
        dy, PROLOGUE ? x : x - mean, PROLOGUE ? zs : p, shift);
    float v = p * g + q * (x - mean) + r;
    return accumulate ? old + v : v;
}

/* BN_BWD_GELU_STORE: g = dy * gelu'(z) for one vector, rounded to the dtype as
 * the unfused GELU's backward would write it, stored to dz and left in g for
 * the sums. k, zs, zb: the mean and GELU's scale and shift, one value (NCHW:
 * a channel) or one per element (NHWC). */
static __device__ __forceinline__ float pick(float v, int) { return v; }
template <int N>
static __device__ __forceinline__ float pick(const float (&v)[N], int e) { return v[e]; }

template <typename T, int VEC, typename K>
static __device__ __forceinline__ void store_gelu_dy(const BnPack<T, VEC> &x, BnPack<T, VEC> &g, const K &k,
                                                     const K &zs, const K &zb, BnPack<T, VEC> *dz) {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        float z = (to_float(x.v[e]) - pick(k, e)) * pick(zs, e) + pick(zb, e);
        g.v[e] = from_float<T>(to_float(g.v[e]) * gelu_grad_f(z));
    }
    *dz = g;
}

/* BN_BWD_MASK_STORE: g = dy where the ReLU's output y > 0, else 0 (as relu_backward), stored to dz (which may
 * be dy itself) and left in g for the sums. */
template <typename T, int VEC>
static __device__ __forceinline__ void store_masked_dy(const BnPack<T, VEC> &y, BnPack<T, VEC> &g,
                                                       BnPack<T, VEC> *dz) {
#pragma unroll
    for (int e = 0; e < VEC; e++)
        if (!(to_float(y.v[e]) > 0.0f)) g.v[e] = from_float<T>(0.0f);
    *dz = g;
}

/* BN_TRAIN_SAVED: channel c's coefficients from the saved statistics, as forward_stats makes them. */
static __device__ __forceinline__ float4 saved_coef(const BnArgs &a, unsigned c) {
    return make_float4(a.mean_in[c], bn_scale(a.gamma[c], a.invstd_in[c]), a.beta[c], 0.0f);
}

/* Channel c's coefficients for an apply pass: the finalize's, or (forward,
 * a.coef_saved) made where the pass starts, a launch fewer than a kernel
 * writing them first. */
template <int MODE>
static __device__ __forceinline__ float4 apply_coef(const BnArgs &a, unsigned c) {
    if (MODE < BN_APPLY_BWD && a.coef_saved) return saved_coef(a, c);
    return a.coef[c];
}

/* ---- NCHW ------------------------------------------------------------------------- */

/* Vector j of channel c's sequence (image j / plane_v, position j % plane_v). */
static __device__ __forceinline__ size_t nchw_vector(unsigned j, unsigned plane_v, unsigned c,
                                                     unsigned channels) {
    unsigned image = j / plane_v;
    return ((size_t)image * channels + c) * plane_v + (j - image * plane_v);
}

template <typename T, int VEC, int MODE>
static __global__ void __launch_bounds__(BN_THREADS) bn_reduce_nchw(BnArgs a) {
    using P = BnPack<T, VEC>;
    const P *x = (const P *)a.x, *dy = (const P *)a.dy;
    unsigned c = blockIdx.y, plane_v = a.plane / VEC, total = a.images * plane_v;
    unsigned chunk = (total + gridDim.x - 1) / gridDim.x;
    unsigned lo = min(total, blockIdx.x * chunk), hi = min(total, lo + chunk);
    float k = MODE == BN_FWD ? to_float(((const T *)a.x)[(size_t)c * a.plane]) : a.mean_in[c];
    constexpr bool Z = MODE == BN_BWD_RELU || MODE == BN_BWD_GELU || MODE == BN_BWD_GELU_STORE;
    constexpr bool STORE = MODE == BN_BWD_GELU_STORE || MODE == BN_BWD_MASK_STORE;
    constexpr int SUMS = STORE ? BN_BWD : MODE; /* dy already through gelu' or the mask */
    float zs = Z ? bn_scale(a.gamma[c], a.invstd_in[c]) : 0.0f;
    float zb = Z ? a.beta[c] : 0.0f;
    if (MODE == BN_BWD_RELU_PROLOGUE) prologue_coef<T>(a, c, zs, zb);
    float s1 = 0.0f, s2 = 0.0f;
    for (unsigned j0 = lo + threadIdx.x; j0 < hi; j0 += BN_THREADS * BN_UNROLL) {
        P xv[BN_UNROLL], gv[BN_UNROLL], mv[BN_UNROLL];
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            unsigned j = j0 + u * BN_THREADS;
            if (j < hi) {
                size_t at = nchw_vector(j, plane_v, c, a.channels);
                xv[u] = x[at];
                if (MODE != BN_FWD) gv[u] = dy[at];
                if (MODE == BN_BWD_MASK_STORE) mv[u] = ((const P *)a.mask)[at];
            }
        }
        if (STORE)
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                unsigned j = j0 + u * BN_THREADS;
                if (j >= hi) continue;
                P *dz = (P *)a.dz + nchw_vector(j, plane_v, c, a.channels);
                if (MODE == BN_BWD_GELU_STORE) store_gelu_dy(xv[u], gv[u], k, zs, zb, dz);
                else store_masked_dy(mv[u], gv[u], dz);
            }
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++)
            if (j0 + u * BN_THREADS < hi)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    accumulate_element<T, SUMS>(to_float(xv[u].v[e]),
                                             MODE != BN_FWD ? to_float(gv[u].v[e]) : 0.0f, k, zs, zb, s1, s2);
    }
    /* block sum: warps by shuffles, then the warps in order */
    __shared__ float warp_s1[BN_THREADS / 32], warp_s2[BN_THREADS / 32];
    for (int offset = 16; offset > 0; offset /= 2) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, offset);
        s2 += __shfl_xor_sync(0xffffffffu, s2, offset);
    }
    if (threadIdx.x % 32 == 0) {
        warp_s1[threadIdx.x / 32] = s1;
        warp_s2[threadIdx.x / 32] = s2;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float t1 = 0.0f, t2 = 0.0f;
        for (int w = 0; w < BN_THREADS / 32; w++) {
            t1 += warp_s1[w];
            t2 += warp_s2[w];
        }
        *partial_at(a, 0, c, blockIdx.x) = t1;
        *partial_at(a, 1, c, blockIdx.x) = t2;
    }
}

template <typename T, int VEC, int MODE, bool RES>
static __global__ void __launch_bounds__(BN_THREADS) bn_apply_nchw(BnArgs a) {
    using P = BnPack<T, VEC>;
    const P *x = (const P *)a.x, *dy = (const P *)a.dy, *res = (const P *)a.res;
    P *out = (P *)a.out;
    constexpr bool BWD = MODE >= BN_APPLY_BWD;
    unsigned c = blockIdx.y, C = a.channels, plane_v = a.plane / VEC, total = a.images * plane_v;
    unsigned chunk = (total + gridDim.x - 1) / gridDim.x;
    unsigned lo = min(total, (gridDim.x - 1 - blockIdx.x) * chunk), hi = min(total, lo + chunk);
    float4 k = apply_coef<MODE>(a, c);
    float mean = k.x, p = k.y, q = k.z, r = k.w, zs = 0.0f;
    float shift = MODE == BN_APPLY_BWD_RELU || MODE == BN_APPLY_BWD_GELU ? a.beta[c] : 0.0f;
    if (MODE == BN_APPLY_BWD_RELU_PROLOGUE) prologue_coef<T>(a, c, zs, shift);
    for (unsigned j0 = lo + threadIdx.x; j0 < hi; j0 += BN_THREADS * BN_UNROLL) {
        P xv[BN_UNROLL], gv[BN_UNROLL], ov[BN_UNROLL], rv[BN_UNROLL];
        size_t at[BN_UNROLL];
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            unsigned j = j0 + u * BN_THREADS;
            if (j < hi) {
                at[u] = nchw_vector(j, plane_v, c, C);
                xv[u] = x[at[u]];
                if (BWD) gv[u] = dy[at[u]];
                if (RES) rv[u] = res[at[u]];
                if (BWD && a.accumulate) ov[u] = out[at[u]];
            }
        }
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            if (j0 + u * BN_THREADS >= hi) continue;
            P o;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float rf = RES ? to_float(rv[u].v[e]) : 0.0f;
                o.v[e] = from_float<T>(apply_element<T, MODE>(
                    to_float(xv[u].v[e]), BWD ? to_float(gv[u].v[e]) : 0.0f,
                    BWD && a.accumulate ? to_float(ov[u].v[e]) : 0.0f, mean, p, q, r, zs, shift, a.accumulate,
                    RES ? &rf : NULL));
            }
            out[at[u]] = o;
        }
    }
}

/* ---- NHWC ------------------------------------------------------------------------- */

/* The block's tile: 'width' column vectors from col0, 'height' threads each. */
struct NhwcTile {
    unsigned col0, width, height, col, lane_row;
};

static __device__ __forceinline__ NhwcTile nhwc_tile(unsigned cols) {
    NhwcTile t;
    t.col0 = blockIdx.y * BN_THREADS;
    t.width = min(cols - t.col0, (unsigned)BN_THREADS);
    t.height = BN_THREADS / t.width;
    t.col = threadIdx.x % t.width;
    t.lane_row = threadIdx.x / t.width;
    return t;
}

template <typename T, int VEC, int MODE>
static __global__ void __launch_bounds__(BN_THREADS) bn_reduce_nhwc(BnArgs a) {
    using P = BnPack<T, VEC>;
    __shared__ float sums1[BN_THREADS * VEC], sums2[BN_THREADS * VEC];
    const P *x = (const P *)a.x, *dy = (const P *)a.dy;
    unsigned cols = a.channels / VEC, rows = a.count;
    NhwcTile t = nhwc_tile(cols);
    unsigned chunk = (rows + gridDim.x - 1) / gridDim.x;
    unsigned lo = min(rows, blockIdx.x * chunk), hi = min(rows, lo + chunk);
    constexpr bool Z = MODE == BN_BWD_RELU || MODE == BN_BWD_GELU || MODE == BN_BWD_GELU_STORE;
    constexpr bool STORE = MODE == BN_BWD_GELU_STORE || MODE == BN_BWD_MASK_STORE;
    constexpr int SUMS = STORE ? BN_BWD : MODE; /* dy already through gelu' or the mask */
    float s1[VEC], s2[VEC], k[VEC], zs[VEC], zb[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) s1[e] = s2[e] = 0.0f;
    if (t.lane_row < t.height) {
        unsigned col = t.col0 + t.col;
        if (MODE == BN_FWD) {
            P first = x[col];
#pragma unroll
            for (int e = 0; e < VEC; e++) k[e] = to_float(first.v[e]);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                unsigned ch = col * VEC + e;
                k[e] = a.mean_in[ch];
                zs[e] = Z ? bn_scale(a.gamma[ch], a.invstd_in[ch]) : 0.0f;
                zb[e] = Z ? a.beta[ch] : 0.0f;
                if (MODE == BN_BWD_RELU_PROLOGUE) prologue_coef<T>(a, ch, zs[e], zb[e]);
            }
        }
        unsigned step = t.height;
        for (unsigned r0 = lo + t.lane_row; r0 < hi; r0 += step * BN_UNROLL) {
            P xv[BN_UNROLL], gv[BN_UNROLL], mv[BN_UNROLL];
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                unsigned r = r0 + u * step;
                if (r < hi) {
                    size_t at = (size_t)r * cols + col;
                    xv[u] = x[at];
                    if (MODE != BN_FWD) gv[u] = dy[at];
                    if (MODE == BN_BWD_MASK_STORE) mv[u] = ((const P *)a.mask)[at];
                }
            }
            if (STORE)
#pragma unroll
                for (int u = 0; u < BN_UNROLL; u++) {
                    unsigned r = r0 + u * step;
                    if (r >= hi) continue;
                    P *dz = (P *)a.dz + (size_t)r * cols + col;
                    if (MODE == BN_BWD_GELU_STORE) store_gelu_dy(xv[u], gv[u], k, zs, zb, dz);
                    else store_masked_dy(mv[u], gv[u], dz);
                }
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++)
                if (r0 + u * step < hi)
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        accumulate_element<T, SUMS>(to_float(xv[u].v[e]),
                                                 MODE != BN_FWD ? to_float(gv[u].v[e]) : 0.0f, k[e], zs[e],
                                                 zb[e], s1[e], s2[e]);
        }
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        sums1[threadIdx.x * VEC + e] = s1[e];
        sums2[threadIdx.x * VEC + e] = s2[e];
    }
    __syncthreads();
    /* (lane_row, col, e) sits at (lane_row * width + col) * VEC + e = lane_row * width * VEC + i,
     * i = col * VEC + e, the tile's i-th channel. */
    unsigned tile_channels = t.width * VEC;
    for (unsigned i = threadIdx.x; i < tile_channels; i += BN_THREADS) {
        float t1 = 0.0f, t2 = 0.0f;
        for (unsigned lr = 0; lr < t.height; lr++) {
            t1 += sums1[lr * tile_channels + i];
            t2 += sums2[lr * tile_channels + i];
        }
        size_t c = (size_t)t.col0 * VEC + i;
        *partial_at(a, 0, c, blockIdx.x) = t1;
        *partial_at(a, 1, c, blockIdx.x) = t2;
    }
}

template <typename T, int VEC, int MODE, bool RES>
static __global__ void __launch_bounds__(BN_THREADS, MODE >= BN_APPLY_BWD ? 1 : RES ? BN_NHWC_RES_BLOCKS
                                                                                    : BN_NHWC_APPLY_BLOCKS)
    bn_apply_nhwc(BnArgs a) {
    using P = BnPack<T, VEC>;
    const P *x = (const P *)a.x, *dy = (const P *)a.dy, *res = (const P *)a.res;
    P *out = (P *)a.out;
    constexpr bool BWD = MODE >= BN_APPLY_BWD;
    unsigned C = a.channels, cols = C / VEC, rows = a.count;
    NhwcTile t = nhwc_tile(cols);
    if (t.lane_row >= t.height) return;
    unsigned chunk = (rows + gridDim.x - 1) / gridDim.x;
    unsigned lo = min(rows, (gridDim.x - 1 - blockIdx.x) * chunk), hi = min(rows, lo + chunk);
    unsigned col = t.col0 + t.col;
    float mean[VEC], p[VEC], q[VEC], r[VEC], zs[VEC], shift[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        float4 k = apply_coef<MODE>(a, col * VEC + e);
        mean[e] = k.x, p[e] = k.y, q[e] = k.z, r[e] = k.w, zs[e] = 0.0f;
        shift[e] = MODE == BN_APPLY_BWD_RELU || MODE == BN_APPLY_BWD_GELU ? a.beta[col * VEC + e] : 0.0f;
        if (MODE == BN_APPLY_BWD_RELU_PROLOGUE) prologue_coef<T>(a, col * VEC + e, zs[e], shift[e]);
    }
    unsigned step = t.height;
    for (unsigned r0 = lo + t.lane_row; r0 < hi; r0 += step * BN_UNROLL) {
        P xv[BN_UNROLL], gv[BN_UNROLL], ov[BN_UNROLL], rv[BN_UNROLL];
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            unsigned row = r0 + u * step;
            if (row < hi) {
                size_t at = (size_t)row * cols + col;
                xv[u] = x[at];
                if (BWD) gv[u] = dy[at];
                if (RES) rv[u] = res[at];
                if (BWD && a.accumulate) ov[u] = out[at];
            }
        }
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            unsigned row = r0 + u * step;
            if (row >= hi) continue;
            P o;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float rf = RES ? to_float(rv[u].v[e]) : 0.0f;
                o.v[e] = from_float<T>(apply_element<T, MODE>(
                    to_float(xv[u].v[e]), BWD ? to_float(gv[u].v[e]) : 0.0f,
                    BWD && a.accumulate ? to_float(ov[u].v[e]) : 0.0f, mean[e], p[e], q[e], r[e], zs[e],
                    shift[e], a.accumulate, RES ? &rf : NULL));
            }
            out[(size_t)row * cols + col] = o;
        }
    }
}

/* BN_TRAIN_SAVED before a pool's pass, which reads the coefficients from the scratch. */
static __global__ void bn_saved_coef(BnArgs a) {
    unsigned C = a.channels;
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        a.coef[c] = saved_coef(a, c);
}

/* Eval: the coefficients from the running statistics. */
static __global__ void bn_eval_coef(BnArgs a) {
    unsigned C = a.channels;
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        double invstd = 1.0 / sqrt((double)a.eval_var[c] + (double)a.eps);
        a.coef[c] = make_float4(a.eval_mean[c], (float)(invstd * a.gamma[c]), a.beta[c], 0.0f);
    }
}

/* ---- host ------------------------------------------------------------------------- */

static void check_shape(const BatchNormShape *s) {
    size_t count = (size_t)s->n * s->h * s->w;
    if (s->n <= 0 || s->c <= 0 || s->c > 65535 || s->h <= 0 || s->w <= 0 || count > BN_MAX_COUNT)
        TC_FATAL("batchnorm: bad shape n=%d c=%d h=%d w=%d (c at most 65535, n*h*w at most 2^30)",
                 s->n, s->c, s->h, s->w);
}

/* Scratch: the partial sums [2][rows][c], then the coefficients [c] (float4),
 * then the synchronized calls' sums [3][c] (double). */
static size_t coef_offset(const BatchNormShape *s, unsigned rows) {
    return ceil_div(2 * (size_t)rows * s->c * sizeof(float), 256) * 256;
}

static size_t sums_offset(const BatchNormShape *s, unsigned rows) {
    return coef_offset(s, rows) + ceil_div((size_t)s->c * sizeof(float4), 256) * 256;
}

static size_t scratch_bytes_for(const BatchNormShape *s, DType dtype, int nhwc) {
    return sums_offset(s, bn_rows(s, dtype, nhwc)) + 3 * (size_t)s->c * sizeof(double);
}

/* Enough for every dtype: NHWC's rows depend on the vector width (4 or 8 elements). */
size_t batchnorm_cuda_scratch_bytes(const BatchNormShape *s, int nhwc) {
    check_shape(s);
    size_t f32 = scratch_bytes_for(s, DTYPE_F32, nhwc != 0);
    size_t half = scratch_bytes_for(s, DTYPE_F16, nhwc != 0);
    return f32 > half ? f32 : half;
}

void batchnorm_cuda_init_scratch(BatchNormCuda *bn, const BatchNormShape *s, DType dtype, int nhwc,
                                 void *scratch) {
    memset(bn, 0, sizeof *bn);
    check_float_dtype("batchnorm", dtype);
    check_shape(s);
    if (!scratch) TC_FATAL("batchnorm: no scratch given");
    if ((uintptr_t)scratch % 16 != 0) TC_FATAL("batchnorm: scratch must be 16-byte aligned");
    bn->shape = *s;
    bn->dtype = dtype;
    bn->nhwc = nhwc != 0;
    bn->rows = (int)bn_rows(s, dtype, bn->nhwc);
    bn->scratch_bytes = scratch_bytes_for(s, dtype, bn->nhwc);
    bn->scratch = scratch;
}

void batchnorm_cuda_init(BatchNormCuda *bn, cudnnHandle_t h, const BatchNormShape *s, DType dtype,
                         int nhwc) {
    (void)h;
    check_float_dtype("batchnorm", dtype);
    check_shape(s);
    size_t bytes = scratch_bytes_for(s, dtype, nhwc != 0);
    void *scratch = NULL;
    CUDA_CHECK(cudaMalloc(&scratch, bytes));
    batchnorm_cuda_init_scratch(bn, s, dtype, nhwc, scratch);
    bn->owns_scratch = 1;
}

void batchnorm_cuda_destroy(BatchNormCuda *bn) {
    if (bn->owns_scratch && bn->scratch) CUDA_CHECK(cudaFree(bn->scratch));
    memset(bn, 0, sizeof *bn);
}

static cudaStream_t pick_stream(cudnnHandle_t h, cudaStream_t stream) {
    if (stream || !h) return stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    return stream;
}

static BnArgs base_args(const BatchNormCuda *bn) {
    if (!bn->scratch) TC_FATAL("batchnorm: used before batchnorm_cuda_init");
    BnArgs a;
    memset(&a, 0, sizeof a);
    const BatchNormShape *s = &bn->shape;
    a.images = (unsigned)s->n;
    a.channels = (unsigned)s->c;
    a.plane = (unsigned)(s->h * s->w);
    a.count = a.images * a.plane;
    a.rows = (unsigned)bn->rows;
    char *base = (char *)bn->scratch;
    a.partials = (float *)base;
    a.coef = (float4 *)(base + coef_offset(s, a.rows));
    a.sums = (double *)(base + sums_offset(s, a.rows));
    return a;
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* Whether the 16-byte kernels fit: every data pointer aligned, and no vector
 * crossing a channel (NCHW: the plane, NHWC: the channels, a whole number of
 * vectors). NULL pointers do not count. */
template <typename T>
static bool wide_fits(const BatchNormCuda *bn, const BnArgs &a) {
    constexpr unsigned WIDE = 16 / sizeof(T);
    unsigned run = bn->nhwc ? a.channels : a.plane;
    const void *ptrs[6] = {a.x, a.dy, a.out, a.dz, a.res, a.mask};
    for (int i = 0; i < 6; i++)
        if (ptrs[i] && !aligned16(ptrs[i])) return false;
    return run % WIDE == 0;
}

/* VEC elements a load through NCHW, NHWC_VEC through NHWC. */
template <typename T, int VEC, int NHWC_VEC, int MODE>
static void launch_reduce_vec(const BatchNormCuda *bn, const BnArgs &a, cudaStream_t stream) {
    if (bn->nhwc) {
        dim3 grid(a.rows, (unsigned)ceil_div(a.channels / NHWC_VEC, BN_THREADS));
        bn_reduce_nhwc<T, NHWC_VEC, MODE><<<grid, BN_THREADS, 0, stream>>>(a);
    } else {
        dim3 grid(a.rows, a.channels);
        bn_reduce_nchw<T, VEC, MODE><<<grid, BN_THREADS, 0, stream>>>(a);
    }
    CUDA_CHECK_LAUNCH();
}

template <typename T, int VEC, int MODE, bool RES>
static void launch_apply_vec(const BatchNormCuda *bn, const BnArgs &a, cudaStream_t stream) {
    if (bn->nhwc) {
        dim3 grid(a.rows, (unsigned)ceil_div(a.channels / VEC, BN_THREADS));
        bn_apply_nhwc<T, VEC, MODE, RES><<<grid, BN_THREADS, 0, stream>>>(a);
    } else {
        dim3 grid(a.rows, a.channels);
        bn_apply_nchw<T, VEC, MODE, RES><<<grid, BN_THREADS, 0, stream>>>(a);
    }
    CUDA_CHECK_LAUNCH();
}

/* The sums, then the per-channel statistics and coefficients; with 'reduce'
 * (synchronized) from the sums over every process. */
template <typename T, int MODE>
static void launch_reduce(const BatchNormCuda *bn, const BnArgs &a, cudaStream_t stream,
                          BnAllreduce reduce, void *ctx) {
    constexpr int WIDE = 16 / sizeof(T);
    /* Channels-last, the half types' backward reads 8-byte vectors: a thread
     * keeps up to three constants and two sums per element of its vector,
     * and with 16 bytes the GELU's took 116 registers, two blocks an SM (ncu
     * on an H100: 55% of the memory roof); with 8, 64 registers. */
    constexpr int NHWC_WIDE = MODE != BN_FWD && sizeof(T) == 2 ? WIDE / 2 : WIDE;
    if (wide_fits<T>(bn, a)) launch_reduce_vec<T, WIDE, NHWC_WIDE, MODE>(bn, a, stream);
    else launch_reduce_vec<T, 1, 1, MODE>(bn, a, stream);
    if (!reduce) {
        bn_finalize<T, MODE><<<a.channels, BN_THREADS, 0, stream>>>(a, bn->nhwc);
        CUDA_CHECK_LAUNCH();
        return;
    }
    bn_finalize_local<T, MODE><<<a.channels, BN_THREADS, 0, stream>>>(a, bn->nhwc);
    CUDA_CHECK_LAUNCH();
    reduce(ctx, a.sums, 3 * (int)a.channels, stream);
    bn_sync_coef<MODE><<<(unsigned)ceil_div(a.channels, BN_THREADS), BN_THREADS, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

/* RES: forward with a residual (a.res), its own kernels so that the others keep their registers. */
template <typename T, int MODE, bool RES = false>
static void launch_apply(const BatchNormCuda *bn, const BnArgs &a, cudaStream_t stream) {
    if (wide_fits<T>(bn, a)) launch_apply_vec<T, 16 / sizeof(T), MODE, RES>(bn, a, stream);
    else launch_apply_vec<T, 1, MODE, RES>(bn, a, stream);
}

/* The apply pass of y = act(bn(x) [+ residual]). */
template <typename T>
static void launch_apply_forward(const BatchNormCuda *bn, const BnArgs &a, BatchNormAct act, cudaStream_t stream) {
    if (a.pool) return maxpool_forward_bn_cuda(a.pool, a.x, (const float *)a.coef, act == BN_ACT_RELU, a.out, stream);
    if (a.res && act == BN_ACT_RELU) launch_apply<T, BN_APPLY_FWD_RELU, true>(bn, a, stream);
    else if (a.res && act == BN_ACT_GELU) launch_apply<T, BN_APPLY_FWD_GELU, true>(bn, a, stream);
    else if (a.res) launch_apply<T, BN_APPLY_FWD, true>(bn, a, stream);
    else if (act == BN_ACT_RELU) launch_apply<T, BN_APPLY_FWD_RELU>(bn, a, stream);
    else if (act == BN_ACT_GELU) launch_apply<T, BN_APPLY_FWD_GELU>(bn, a, stream);
    else launch_apply<T, BN_APPLY_FWD>(bn, a, stream);
}

template <typename T>
static void run_forward_train(const BatchNormCuda *bn, BnArgs a, BatchNormAct act, cudaStream_t stream,
                              BnAllreduce reduce, void *ctx) {
    BnArgs stats = a;
    stats.out = NULL; /* the reduction reads x alone; y's and the residual's alignment must not narrow it */
    stats.res = NULL;
    launch_reduce<T, BN_FWD>(bn, stats, stream, reduce, ctx);
    launch_apply_forward<T>(bn, a, act, stream);
}

template <typename T>
static void run_forward_eval(const BatchNormCuda *bn, BnArgs a, BatchNormAct act, cudaStream_t stream) {
    bn_eval_coef<<<(unsigned)ceil_div(a.channels, BN_THREADS), BN_THREADS, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
    launch_apply_forward<T>(bn, a, act, stream);
}

template <typename T>
static void run_forward_saved(const BatchNormCuda *bn, BnArgs a, BatchNormAct act, cudaStream_t stream) {
    if (a.pool) {
        bn_saved_coef<<<(unsigned)ceil_div(a.channels, BN_THREADS), BN_THREADS, 0, stream>>>(a);
        CUDA_CHECK_LAUNCH();
    } else {
        a.coef_saved = 1;
    }
    launch_apply_forward<T>(bn, a, act, stream);
}

template <typename T>
static void run_backward(const BatchNormCuda *bn, BnArgs a, BatchNormAct act, cudaStream_t stream,
                         BnAllreduce reduce, void *ctx) {
    BnArgs sums = a;
    sums.out = NULL;
    if (!a.out) reduce = NULL; /* no dx: dgamma and dbeta need only the local sums */
    if (act == BN_ACT_GELU && a.out && !a.accumulate) {
        /* dy * gelu'(z) once, into dx, where the apply pass reads it as a plain backward's dy (gelu' in one
         * pass, not both). dx's alignment joins the reduction's through dz. */
        sums.dz = a.out;
        launch_reduce<T, BN_BWD_GELU_STORE>(bn, sums, stream, reduce, ctx);
        BnArgs apply = a;
        apply.dy = a.out;
        launch_apply<T, BN_APPLY_BWD>(bn, apply, stream);
        return;
    }
    if (act == BN_ACT_ADD_RELU) {
        /* dy masked once, into dz (the add's gradient, which its other input reads too), where the apply pass
         * reads it as a plain backward's dy */
        launch_reduce<T, BN_BWD_MASK_STORE>(bn, sums, stream, reduce, ctx);
        if (!a.out) return;
        BnArgs apply = a;
        apply.dy = a.dz;
        apply.dz = NULL;
        apply.mask = NULL;
        launch_apply<T, BN_APPLY_BWD>(bn, apply, stream);
        return;
    }
    if (act == BN_ACT_RELU && a.relu_coef) launch_reduce<T, BN_BWD_RELU_PROLOGUE>(bn, sums, stream, reduce, ctx);
    else if (act == BN_ACT_RELU) launch_reduce<T, BN_BWD_RELU>(bn, sums, stream, reduce, ctx);
    else if (act == BN_ACT_GELU) launch_reduce<T, BN_BWD_GELU>(bn, sums, stream, reduce, ctx);
    else launch_reduce<T, BN_BWD>(bn, sums, stream, reduce, ctx);
    if (!a.out) return;
    if (act == BN_ACT_RELU && a.relu_coef) launch_apply<T, BN_APPLY_BWD_RELU_PROLOGUE>(bn, a, stream);
    else if (act == BN_ACT_RELU) launch_apply<T, BN_APPLY_BWD_RELU>(bn, a, stream);
    else if (act == BN_ACT_GELU) launch_apply<T, BN_APPLY_BWD_GELU>(bn, a, stream);
    else launch_apply<T, BN_APPLY_BWD>(bn, a, stream);
}

/* What every forward's apply pass reads and writes. */
static BnArgs forward_args(const BatchNormCuda *bn, const void *x, void *y, const void *residual,
                           const MaxPoolCuda *pool, const float *gamma, const float *beta) {
    /* whether the pool's kernels take it, maxpool_forward_bn_cuda checks */
    if (pool && (residual || !bn->nhwc || pool->dtype != bn->dtype))
        TC_FATAL("batchnorm: a max-pool in the norm's pass needs channels-last data in the norm's dtype and no "
                 "residual");
    BnArgs a = base_args(bn);
    a.x = x;
    a.out = y;
    a.res = residual;
    a.pool = pool;
    a.gamma = gamma;
    a.beta = beta;
    return a;
}

static void forward_train(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                          const float *gamma, const float *beta, float momentum, float eps,
                          float *running_mean, float *running_var, float *save_mean,
                          float *save_invstd, void *y, const void *residual, const MaxPoolCuda *pool,
                          cudaStream_t stream, BatchNormAct act, BnAllreduce reduce, void *ctx) {
    BnArgs a = forward_args(bn, x, y, residual, pool, gamma, beta);
    /* Synchronized, the global count must be 2 or more; only the device knows it. */
    if (a.count < 2 && !reduce) TC_FATAL("batchnorm: training needs more than one value per channel");
    a.momentum = momentum;
    a.eps = eps;
    a.running_mean = running_mean;
    a.running_var = running_var;
    a.save_mean = save_mean;
    a.save_invstd = save_invstd;
    DISPATCH_FLOAT_DTYPE(bn->dtype, run_forward_train, bn, a, act, pick_stream(h, stream), reduce, ctx);
}

static void forward_eval(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                         const float *gamma, const float *beta, const float *running_mean,
                         const float *running_var, float eps, void *y, const void *residual,
                         const MaxPoolCuda *pool, cudaStream_t stream, BatchNormAct act) {
    BnArgs a = forward_args(bn, x, y, residual, pool, gamma, beta);
    a.eval_mean = running_mean;
    a.eval_var = running_var;
    a.eps = eps;
    DISPATCH_FLOAT_DTYPE(bn->dtype, run_forward_eval, bn, a, act, pick_stream(h, stream));
}

/* beta: read for BN_ACT_RELU and BN_ACT_GELU only (their input recomputed); y and dy_masked: for
 * BN_ACT_ADD_RELU only; relu_coef (NULL: none): BN_ACT_RELU's mask from a prologue's scale and bias. */
static void backward(const BatchNormCuda *bn, cudnnHandle_t h, const void *x, const void *y, const void *dy,
                     void *dy_masked, const float *gamma, const float *beta, const void *relu_coef,
                     const float *save_mean, const float *save_invstd, void *dx, int accumulate_dx, void *dgamma,
                     void *dbeta, DType grad_dtype, cudaStream_t stream, BatchNormAct act, BnAllreduce reduce,
                     void *ctx) {
    if (dgamma || dbeta) check_float_dtype("batchnorm (parameter gradients)", grad_dtype);
    if ((act == BN_ACT_RELU || act == BN_ACT_GELU) && !beta)
        TC_FATAL("batchnorm+%s backward: beta is needed", act == BN_ACT_RELU ? "relu" : "gelu");
    if (relu_coef && act != BN_ACT_RELU) TC_FATAL("batchnorm backward: a prologue's scale and bias need BN_ACT_RELU");
    if (act == BN_ACT_ADD_RELU && (!y || !dy_masked))
        TC_FATAL("batchnorm+add+relu backward: the add's output and the masked dy's buffer are needed");
    BnArgs a = base_args(bn);
    a.x = x;
    a.dy = dy;
    if (act == BN_ACT_ADD_RELU) a.mask = y, a.dz = dy_masked;
    a.out = dx;
    a.gamma = gamma;
    a.beta = beta;
    a.relu_coef = relu_coef;
    a.mean_in = save_mean;
    a.invstd_in = save_invstd;
    a.dgamma = dgamma;
    a.dbeta = dbeta;
    a.grad_dtype = (int)grad_dtype;
    a.accumulate = accumulate_dx != 0;
    DISPATCH_FLOAT_DTYPE(bn->dtype, run_backward, bn, a, act, pick_stream(h, stream), reduce, ctx);
}

void batchnorm_forward_train_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                                  const float *gamma, const float *beta, float momentum, float eps,
                                  float *running_mean, float *running_var, float *save_mean,
                                  float *save_invstd, void *y, cudaStream_t stream) {
    forward_train(bn, h, x, gamma, beta, momentum, eps, running_mean, running_var, save_mean,
                  save_invstd, y, NULL, NULL, stream, BN_ACT_NONE, NULL, NULL);
}

void batchnorm_act_forward_train_cuda(const BatchNormCuda *bn, cudnnHandle_t h, BatchNormAct act,
                                      const void *x, const float *gamma, const float *beta,
                                      float momentum, float eps, float *running_mean,
                                      float *running_var, float *save_mean, float *save_invstd,
                                      void *y, const void *residual, const MaxPoolCuda *pool,
                                      cudaStream_t stream) {
    forward_train(bn, h, x, gamma, beta, momentum, eps, running_mean, running_var, save_mean,
                  save_invstd, y, residual, pool, stream, act, NULL, NULL);
}

void batchnorm_forward_eval_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                                 const float *gamma, const float *beta, const float *running_mean,
                                 const float *running_var, float eps, void *y, cudaStream_t stream) {
    forward_eval(bn, h, x, gamma, beta, running_mean, running_var, eps, y, NULL, NULL, stream, BN_ACT_NONE);
}

void batchnorm_act_forward_eval_cuda(const BatchNormCuda *bn, cudnnHandle_t h, BatchNormAct act,
                                     const void *x, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var,
                                     float eps, void *y, const void *residual, const MaxPoolCuda *pool,
                                     cudaStream_t stream) {
    forward_eval(bn, h, x, gamma, beta, running_mean, running_var, eps, y, residual, pool, stream, act);
}

void batchnorm_act_forward_saved_cuda(const BatchNormCuda *bn, cudnnHandle_t h, BatchNormAct act,
                                      const void *x, const float *gamma, const float *beta,
                                      const float *save_mean, const float *save_invstd, void *y,
                                      const void *residual, const MaxPoolCuda *pool, cudaStream_t stream) {
    BnArgs a = forward_args(bn, x, y, residual, pool, gamma, beta);
    a.mean_in = save_mean;
    a.invstd_in = save_invstd;
    DISPATCH_FLOAT_DTYPE(bn->dtype, run_forward_saved, bn, a, act, pick_stream(h, stream));
}

void batchnorm_backward_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                             const void *dy, const float *gamma, const float *save_mean,
                             const float *save_invstd, void *dx, int accumulate_dx, void *dgamma,
                             void *dbeta, DType grad_dtype, cudaStream_t stream) {
    backward(bn, h, x, NULL, dy, NULL, gamma, NULL, NULL, save_mean, save_invstd, dx, accumulate_dx, dgamma,
             dbeta, grad_dtype, stream, BN_ACT_NONE, NULL, NULL);
}

void batchnorm_act_backward_cuda(const BatchNormCuda *bn, cudnnHandle_t h, BatchNormAct act,
                                 const void *x, const void *y, const void *dy, void *dy_masked,
                                 const float *gamma, const float *beta, const void *relu_coef,
                                 const float *save_mean, const float *save_invstd, void *dx, int accumulate_dx,
                                 void *dgamma, void *dbeta, DType grad_dtype, cudaStream_t stream) {
    backward(bn, h, x, y, dy, dy_masked, gamma, beta, relu_coef, save_mean, save_invstd, dx, accumulate_dx,
             dgamma, dbeta, grad_dtype, stream, act, NULL, NULL);
}

void batchnorm_forward_train_sync_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                                       const float *gamma, const float *beta, float momentum,
                                       float eps, float *running_mean, float *running_var,
                                       float *save_mean, float *save_invstd, void *y,
                                       const void *residual, const MaxPoolCuda *pool, cudaStream_t stream,
                                       BnAllreduce reduce, void *ctx, BatchNormAct act) {
    if (!reduce) TC_FATAL("batchnorm sync forward: no reduce given");
    forward_train(bn, h, x, gamma, beta, momentum, eps, running_mean, running_var, save_mean,
                  save_invstd, y, residual, pool, stream, act, reduce, ctx);
}

void batchnorm_backward_sync_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                                  const void *y, const void *dy, void *dy_masked, const float *gamma,
                                  const float *beta, const float *save_mean,
                                  const float *save_invstd, void *dx, int accumulate_dx,
                                  void *dgamma, void *dbeta, DType grad_dtype, cudaStream_t stream,
                                  BnAllreduce reduce, void *ctx, BatchNormAct act) {
    if (!reduce) TC_FATAL("batchnorm sync backward: no reduce given");
    backward(bn, h, x, y, dy, dy_masked, gamma, beta, NULL, save_mean, save_invstd, dx, accumulate_dx, dgamma,
             dbeta, grad_dtype, stream, act, reduce, ctx);
}
