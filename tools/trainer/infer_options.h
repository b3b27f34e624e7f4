/* How the trainer's tools (eval, bench-infer) set up the inference path
 * (models/infer.h) from a config: on the GPU, half precision (precision.amp's
 * bf16, else fp16) in NHWC, perf.cuda_graph, and convolutions chosen as the
 * training run chooses them (perf.conv_benchmark, perf.conv_workspace_mb,
 * perf.deterministic); on the CPU fp32 NCHW. */
#ifndef TRAINC_TOOLS_TRAINER_INFER_OPTIONS_H
#define TRAINC_TOOLS_TRAINER_INFER_OPTIONS_H

#include "models/infer.h"
#include "tools/trainer/settings.h"

InferOptions infer_options_of(const TrainSettings *s, int batch);

#endif
