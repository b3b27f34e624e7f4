#include "tools/trainer/infer_options.h"

InferOptions infer_options_of(const TrainSettings *s, int batch) {
    InferOptions o = {0};
    o.batch = batch;
    o.dtype = !s->run.use_gpu ? DTYPE_F32 : s->precision.amp == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F16;
    o.nhwc = s->run.use_gpu;
    o.graph = s->run.use_gpu && s->perf.cuda_graph;
    o.conv_policy.workspace_limit = s->perf.conv_workspace_bytes;
    o.conv_policy.allow_tf32 = 1;
    o.conv_policy.deterministic = s->perf.deterministic;
    o.conv_policy.benchmark = s->perf.conv_benchmark;
    return o;
}
