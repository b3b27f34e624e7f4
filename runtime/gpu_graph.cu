#include "runtime/gpu_graph.h"

#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/gpu.h"

/* A longer chain becomes several kernels, one after another. */
#define FILL_MAX_REGIONS 8
#define FILL_THREADS 256

/* A memset node's parameters: height rows of width elements, pitch bytes apart. */
typedef struct {
    char *dst;
    size_t pitch, width, height;
    unsigned value, element_size;
} FillRegion;

typedef struct {
    FillRegion region[FILL_MAX_REGIONS];
    int n;
} FillList;

/* One block writes the regions in the chain's order: where two overlap, the
 * later one's bytes stay, as after the memsets. */
static __global__ void graph_fill_kernel(FillList list) {
    for (int k = 0; k < list.n; k++) {
        const FillRegion r = list.region[k];
        size_t n = r.width * r.height;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
            char *at = r.dst + (i / r.width) * r.pitch + (i % r.width) * r.element_size;
            if (r.element_size == 4) *(unsigned *)at = r.value;
            else if (r.element_size == 2) *(unsigned short *)at = (unsigned short)r.value;
            else *(unsigned char *)at = (unsigned char)r.value;
        }
        __syncthreads();
    }
}

typedef CUresult (*node_type_fn)(CUgraphNode, CUgraphNodeType *);

/* The driver's type of a node: the runtime's cudaGraphNodeGetType has none
 * for the driver's batch memory operations (the copy engines' peer link
 * captures them) and answers cudaErrorUnknown. */
static CUgraphNodeType node_type(cudaGraphNode_t node) {
    static node_type_fn get_type;
    if (!get_type && !gpu_driver_entry("cuGraphNodeGetType", (void **)&get_type))
        TC_FATAL("the CUDA driver has no cuGraphNodeGetType");
    CUgraphNodeType type;
    CUresult r = get_type((CUgraphNode)node, &type);
    if (r != CUDA_SUCCESS) TC_FATAL("cuGraphNodeGetType failed: CUresult %d", (int)r);
    return type;
}

static int is_small_memset(cudaGraphNode_t node) {
    if (node_type(node) != CU_GRAPH_NODE_TYPE_MEMSET) return 0;
    struct cudaMemsetParams p;
    CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &p));
    return p.width * p.height * p.elementSize <= GPU_GRAPH_FILL_MAX_BYTES;
}

/* A node's edges in (its dependencies) or out (its dependents), with their data. */
typedef struct {
    cudaGraphNode_t *node;
    cudaGraphEdgeData *data;
    size_t n;
} Edges;

static Edges edges_of(cudaGraphNode_t node, int in) {
    Edges e = {NULL, NULL, 0};
    if (in) CUDA_CHECK(cudaGraphNodeGetDependencies(node, NULL, NULL, &e.n));
    else CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, NULL, NULL, &e.n));
    e.node = (cudaGraphNode_t *)malloc((e.n + 1) * sizeof *e.node);
    e.data = (cudaGraphEdgeData *)calloc(e.n + 1, sizeof *e.data);
    if (!e.node || !e.data) TC_FATAL("out of host memory rewriting a CUDA graph");
    if (e.n == 0) return e; /* a query for none is refused */
    if (in) CUDA_CHECK(cudaGraphNodeGetDependencies(node, e.node, e.data, &e.n));
    else CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, e.node, e.data, &e.n));
    return e;
}

static void edges_free(Edges *e) {
    free(e->node);
    free(e->data);
}

static int default_edge(const cudaGraphEdgeData *d) {
    static const cudaGraphEdgeData zero = {0};
    return memcmp(d, &zero, sizeof zero) == 0;
}

/* The next node of a chain after 'from': its only dependent, a small memset
 * waiting on nothing else; NULL when the chain ends at 'from'. */
static cudaGraphNode_t chain_next(cudaGraphNode_t from) {
    Edges out = edges_of(from, 0);
    cudaGraphNode_t next = NULL;
    if (out.n == 1 && default_edge(&out.data[0]) && is_small_memset(out.node[0])) {
        Edges in = edges_of(out.node[0], 1);
        if (in.n == 1) next = out.node[0];
        edges_free(&in);
    }
    edges_free(&out);
    return next;
}

/* Whether a small memset starts a chain (no small memset before it links to it). */
static int chain_head(cudaGraphNode_t node) {
    if (!is_small_memset(node)) return 0;
    Edges in = edges_of(node, 1);
    int head = !(in.n == 1 && is_small_memset(in.node[0]) && chain_next(in.node[0]) == node);
    edges_free(&in);
    return head;
}

/* Bytes and halves written as 32-bit words where the whole region allows it. */
static FillRegion fill_region(cudaGraphNode_t node) {
    struct cudaMemsetParams p;
    CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &p));
    FillRegion r = {(char *)p.dst, p.pitch, p.width, p.height, p.value, p.elementSize};
    size_t row_bytes = r.width * r.element_size;
    int aligned = (uintptr_t)r.dst % 4 == 0 && row_bytes % 4 == 0 && (r.height == 1 || r.pitch % 4 == 0);
    if (r.element_size < 4 && aligned) {
        unsigned v = r.element_size == 1 ? (r.value & 0xFFu) * 0x01010101u : (r.value & 0xFFFFu) * 0x00010001u;
        r = (FillRegion){r.dst, r.pitch, row_bytes / 4, r.height, v, 4};
    }
    return r;
}

/* Nodes [0, n) of a chain (n <= FILL_MAX_REGIONS) replaced by one kernel node
 * with the first's dependencies and the last's dependents. */
static void replace_with_kernel(cudaGraph_t graph, cudaGraphNode_t *chain, int n) {
    FillList list;
    memset(&list, 0, sizeof list);
    for (int i = 0; i < n; i++) list.region[i] = fill_region(chain[i]);
    list.n = n;
    void *args[] = {&list};
    struct cudaKernelNodeParams kp;
    memset(&kp, 0, sizeof kp);
    kp.func = (void *)graph_fill_kernel;
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(FILL_THREADS);
    kp.kernelParams = args;
    cudaGraphNode_t fill;
    CUDA_CHECK(cudaGraphAddKernelNode(&fill, graph, NULL, 0, &kp));
    /* Full dependencies (no edge data): the kernel starts after what came
     * before has finished, and what came after waits for it to finish. */
    Edges in = edges_of(chain[0], 1), out = edges_of(chain[n - 1], 0);
    for (size_t i = 0; i < in.n; i++) CUDA_CHECK(cudaGraphAddDependencies(graph, &in.node[i], &fill, NULL, 1));
    for (size_t i = 0; i < out.n; i++) CUDA_CHECK(cudaGraphAddDependencies(graph, &fill, &out.node[i], NULL, 1));
    edges_free(&in);
    edges_free(&out);
    for (int i = 0; i < n; i++) CUDA_CHECK(cudaGraphDestroyNode(chain[i]));
}

/* CUDA lets no node be removed from a graph that allocates or frees memory. */
static int allocates(cudaGraphNode_t node) {
    CUgraphNodeType type = node_type(node);
    return type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || type == CU_GRAPH_NODE_TYPE_MEM_FREE;
}

int gpu_graph_fills_as_kernels(cudaGraph_t graph) {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &n));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc((n + 1) * sizeof *nodes);
    if (!nodes) TC_FATAL("out of host memory rewriting a CUDA graph");
    if (n > 0) CUDA_CHECK(cudaGraphGetNodes(graph, nodes, &n));
    for (size_t i = 0; i < n; i++)
        if (allocates(nodes[i])) {
            free(nodes);
            return -1;
        }
    /* The heads first: replacing a chain changes no other chain's links. */
    size_t n_heads = 0;
    for (size_t i = 0; i < n; i++)
        if (chain_head(nodes[i])) nodes[n_heads++] = nodes[i];
    int replaced = 0;
    for (size_t h = 0; h < n_heads; h++) {
        cudaGraphNode_t chain[FILL_MAX_REGIONS];
        cudaGraphNode_t at = nodes[h];
        while (at) {
            int k = 0;
            for (; at && k < FILL_MAX_REGIONS; at = chain_next(at)) chain[k++] = at;
            replace_with_kernel(graph, chain, k);
            replaced += k;
        }
    }
    free(nodes);
    return replaced;
}
