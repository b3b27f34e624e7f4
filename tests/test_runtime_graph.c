/* gpu_graph_fills_as_kernels: graphs of memset nodes (1-, 2- and 4-byte
 * elements, rows with a pitch, overlapping, chains longer than one kernel
 * takes, branches, a large memset and a copy among them) rewritten, replayed,
 * and every byte of the buffer compared with the same operations done on the
 * host in order; then memsets captured from a stream through gpu_capture_end,
 * a graph that allocates, which is left as it is, and one with a driver
 * stream memory operation among its memsets. */
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/gpu_graph.h"
#include "tests/harness.h"

enum { BUFFER = 1 << 18, BEFORE = 0xA5 };

static unsigned char *dev_buf;
static unsigned char host_buf[BUFFER];

static size_t uniform_size(uint64_t *state, size_t lo, size_t hi) {
    size_t v = lo + (size_t)test_uniform(state, 0, (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

/* A memset's parameters, random inside the buffer: es-byte elements, 1 to 3
 * rows of up to max_row elements. */
static struct cudaMemsetParams random_memset(uint64_t *state, unsigned es, size_t max_row) {
    struct cudaMemsetParams p;
    memset(&p, 0, sizeof p);
    p.elementSize = es;
    p.width = uniform_size(state, 1, max_row);
    p.height = uniform_size(state, 1, 3);
    p.pitch = (p.width + uniform_size(state, 0, 40)) * es;
    size_t span = p.pitch * (p.height - 1) + p.width * es;
    size_t offset = uniform_size(state, 0, (BUFFER - span) / es) * es;
    p.dst = dev_buf + offset;
    p.value = (unsigned)uniform_size(state, 0, 0xFFFFFFFFu >> 8) * 257u;
    return p;
}

static void host_memset(const struct cudaMemsetParams *p) {
    size_t offset = (size_t)((unsigned char *)p->dst - dev_buf);
    for (size_t row = 0; row < p->height; row++)
        for (size_t i = 0; i < p->width; i++) {
            unsigned char *at = host_buf + offset + row * p->pitch + i * p->elementSize;
            for (unsigned b = 0; b < p->elementSize; b++) at[b] = (unsigned char)(p->value >> (8 * b));
        }
}

static size_t memset_bytes(const struct cudaMemsetParams *p) { return p->width * p->height * p->elementSize; }

/* A memset node after 'dep' (none when NULL), done on the host mirror too. */
static cudaGraphNode_t add_memset(cudaGraph_t g, cudaGraphNode_t dep, const struct cudaMemsetParams *p, int *small) {
    cudaGraphNode_t node;
    CUDA_CHECK(cudaGraphAddMemsetNode(&node, g, dep ? &dep : NULL, dep ? 1 : 0, p));
    host_memset(p);
    *small += memset_bytes(p) <= GPU_GRAPH_FILL_MAX_BYTES;
    return node;
}

static int count_nodes(cudaGraph_t g, enum cudaGraphNodeType want, int small_memsets_only) {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(g, NULL, &n));
    cudaGraphNode_t *nodes = malloc((n + 1) * sizeof *nodes);
    CUDA_CHECK(cudaGraphGetNodes(g, nodes, &n));
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        enum cudaGraphNodeType type;
        CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
        if (type != want) continue;
        if (small_memsets_only) {
            struct cudaMemsetParams p;
            CUDA_CHECK(cudaGraphMemsetNodeGetParams(nodes[i], &p));
            if (memset_bytes(&p) > GPU_GRAPH_FILL_MAX_BYTES) continue;
        }
        count++;
    }
    free(nodes);
    return count;
}

/* The device buffer back to BEFORE, finished before anything is launched: cudaMemset runs on the legacy default
 * stream, which the test's non-blocking streams do not wait for (a GPU shared with other processes once let a
 * graph's writes land before it, and read back as unwritten). */
static void reset_device_buffer(void) {
    CUDA_CHECK(cudaMemset(dev_buf, BEFORE, BUFFER));
    CUDA_CHECK(cudaDeviceSynchronize());
}

static void reset_buffers(void) {
    memset(host_buf, BEFORE, BUFFER);
    reset_device_buffer();
}

static void check_buffer(const char *what) {
    static unsigned char got[BUFFER];
    CUDA_CHECK(cudaMemcpy(got, dev_buf, BUFFER, cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < BUFFER; i++)
        if (got[i] != host_buf[i] && bad++ == 0) first = i;
    CHECK_MSG(bad == 0, "%s: %zu bytes differ, the first at %zu: 0x%02x, want 0x%02x", what, bad, first,
              got[first], host_buf[first]);
}

/* root -> a chain of 19 memsets of every element size with a copy and a
 * large memset among them -> two branches of 3 each -> one memset after both. */
static void test_built_graph(uint64_t *state, cudaStream_t stream) {
    reset_buffers();
    cudaGraph_t g;
    CUDA_CHECK(cudaGraphCreate(&g, 0));
    int small = 0;
    struct cudaMemsetParams p = random_memset(state, 1, 300), before;
    cudaGraphNode_t at = add_memset(g, NULL, &p, &small), branch_root;
    for (int i = 0; i < 19; i++) {
        if (i == 9) { /* a copy: what the memsets before it wrote, read in order */
            size_t bytes = 4096, from = 0, to = BUFFER / 2;
            cudaGraphNode_t copy;
            CUDA_CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &at, 1, dev_buf + to, dev_buf + from, bytes,
                                                cudaMemcpyDeviceToDevice));
            memmove(host_buf + to, host_buf + from, bytes);
            at = copy;
        }
        unsigned es = 1u << (i % 3);
        before = p;
        p = random_memset(state, es, 4000 / es);
        if (i == 14) { /* over the limit: it stays a memset */
            p.elementSize = 4;
            p.height = 1;
            p.width = GPU_GRAPH_FILL_MAX_BYTES / 4 + uniform_size(state, 1, 1000);
            p.dst = dev_buf + 4 * uniform_size(state, 0, (BUFFER / 4 - p.width));
        }
        if (i == 3) { /* bytes over the start of the one before (4-byte elements) */
            size_t from = (size_t)((unsigned char *)before.dst - dev_buf) + 1;
            p.height = 1;
            p.dst = dev_buf + (from + p.width > BUFFER ? BUFFER - p.width : from);
        }
        at = add_memset(g, at, &p, &small);
    }
    branch_root = at;
    /* Two branches on disjoint halves of the buffer, then one memset after both. */
    cudaGraphNode_t ends[2];
    for (int b = 0; b < 2; b++) {
        at = branch_root;
        for (int i = 0; i < 3; i++) {
            p = random_memset(state, 1, 200);
            p.height = 1;
            p.dst = dev_buf + b * (BUFFER / 2) + uniform_size(state, 0, BUFFER / 2 - 200);
            at = add_memset(g, at, &p, &small);
        }
        ends[b] = at;
    }
    p = random_memset(state, 2, 500);
    cudaGraphNode_t join;
    CUDA_CHECK(cudaGraphAddMemsetNode(&join, g, ends, 2, &p));
    host_memset(&p);
    small++;

    int memsets = count_nodes(g, cudaGraphNodeTypeMemset, 0);
    int replaced = gpu_graph_fills_as_kernels(g);
    CHECK_MSG(replaced == small, "%d of %d small memsets replaced", replaced, small);
    CHECK(count_nodes(g, cudaGraphNodeTypeMemset, 1) == 0);
    CHECK(count_nodes(g, cudaGraphNodeTypeMemset, 0) == memsets - small); /* the large one stays */
    CHECK(count_nodes(g, cudaGraphNodeTypeMemcpy, 0) == 1);
    /* One kernel per chain of at most 8: the first 10 (8 and 2), 5 up to the
     * large memset, 4 after it, each branch's 3, the one after both. */
    CHECK_MSG(count_nodes(g, cudaGraphNodeTypeKernel, 0) == 7, "%d kernels", count_nodes(g, cudaGraphNodeTypeKernel, 0));
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int replay = 0; replay < 2; replay++) {
        reset_device_buffer();
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        check_buffer(replay ? "built graph, replayed again" : "built graph");
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(g));
}

/* cudaMemsetAsync on a stream, some overlapping, with a second stream's work
 * forked and joined, captured through gpu_capture_end and replayed. */
static void test_captured(uint64_t *state, cudaStream_t stream) {
    cudaStream_t side;
    cudaEvent_t fork, join;
    CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    reset_buffers();
    gpu_capture_begin(stream);
    for (int i = 0; i < 12; i++) {
        size_t bytes = uniform_size(state, 1, 3000), offset = uniform_size(state, 0, BUFFER / 2 - bytes);
        int value = (int)uniform_size(state, 0, 255);
        CUDA_CHECK(cudaMemsetAsync(dev_buf + offset, value, bytes, stream));
        memset(host_buf + offset, value, bytes);
        if (i == 5) { /* the side stream writes the buffer's second half meanwhile */
            CUDA_CHECK(cudaEventRecord(fork, stream));
            CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
            for (int k = 0; k < 3; k++) {
                size_t o = BUFFER / 2 + uniform_size(state, 0, BUFFER / 2 - 1000);
                CUDA_CHECK(cudaMemsetAsync(dev_buf + o, 0x3C + k, 1000, side));
                memset(host_buf + o, 0x3C + k, 1000);
            }
            CUDA_CHECK(cudaEventRecord(join, side));
        }
    }
    CUDA_CHECK(cudaStreamWaitEvent(stream, join, 0));
    cudaGraphExec_t exec = gpu_capture_end(stream, 0);
    for (int replay = 0; replay < 2; replay++) {
        reset_device_buffer();
        gpu_graph_launch(exec, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        check_buffer("captured stream");
    }
    gpu_graph_destroy(exec);
    CUDA_CHECK(cudaEventDestroy(fork));
    CUDA_CHECK(cudaEventDestroy(join));
    CUDA_CHECK(cudaStreamDestroy(side));
}

/* g instantiated, replayed once and checked, then destroyed. */
static void replay_once(cudaGraph_t g, cudaStream_t stream, const char *what) {
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    check_buffer(what);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(g));
}

/* A captured cudaMallocAsync keeps CUDA from removing any node of its graph:
 * the rewrite leaves such a graph as it is, and it still replays right. */
static void test_allocating_graph(uint64_t *state, cudaStream_t stream) {
    reset_buffers();
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    void *scratch;
    CUDA_CHECK(cudaMallocAsync(&scratch, 4096, stream));
    for (int i = 0; i < 3; i++) {
        size_t bytes = uniform_size(state, 1, 3000), offset = uniform_size(state, 0, BUFFER - bytes);
        CUDA_CHECK(cudaMemsetAsync(dev_buf + offset, 0x11 * (i + 1), bytes, stream));
        memset(host_buf + offset, 0x11 * (i + 1), bytes);
    }
    CUDA_CHECK(cudaFreeAsync(scratch, stream));
    CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    int memsets = count_nodes(g, cudaGraphNodeTypeMemset, 0);
    CHECK(gpu_graph_fills_as_kernels(g) == -1);
    CHECK(count_nodes(g, cudaGraphNodeTypeMemset, 0) == memsets && memsets == 3);
    CHECK(cudaGetLastError() == cudaSuccess);
    replay_once(g, stream, "allocating graph");
}

/* A driver stream memory operation (as the copy engines' peer link captures)
 * between memsets: the runtime has no type for its node; the rewrite still
 * replaces the memsets around it. */
typedef CUresult (*write_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

static void test_memop_graph(uint64_t *state, cudaStream_t stream) {
    write_value_fn write_value;
    if (!gpu_driver_entry("cuStreamWriteValue32", (void **)&write_value)) {
        CHECK_MSG(0, "the driver has no cuStreamWriteValue32");
        return;
    }
    reset_buffers();
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 5; i++) {
        size_t bytes = uniform_size(state, 1, 3000), offset = uniform_size(state, 0, BUFFER - bytes);
        CUDA_CHECK(cudaMemsetAsync(dev_buf + offset, 0x21 * (i + 1), bytes, stream));
        memset(host_buf + offset, 0x21 * (i + 1), bytes);
        if (i == 1) {
            size_t at = 4 * uniform_size(state, 0, BUFFER / 4 - 1);
            uint32_t value = (uint32_t)uniform_size(state, 0, 0xFFFFFF) * 251u;
            CHECK(write_value((CUstream)stream, (CUdeviceptr)(uintptr_t)(dev_buf + at), value, 0) == CUDA_SUCCESS);
            for (int b = 0; b < 4; b++) host_buf[at + b] = (unsigned char)(value >> (8 * b));
        }
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    CHECK_MSG(gpu_graph_fills_as_kernels(g) == 5, "the memsets beside a stream memory operation not replaced");
    CHECK(cudaGetLastError() == cudaSuccess);
    replay_once(g, stream, "graph with a stream memory operation");
}

int main(void) {
    test_require_gpu();
    uint64_t state = test_seed();
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaMalloc((void **)&dev_buf, BUFFER));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int round = 0; round < 4; round++) test_built_graph(&state, stream);
    for (int round = 0; round < 4; round++) test_captured(&state, stream);
    test_allocating_graph(&state, stream);
    test_memop_graph(&state, stream);
    CUDA_CHECK(cudaStreamDestroy(stream));
    CUDA_CHECK(cudaFree(dev_buf));
    return test_finish("test_runtime_graph");
}
