/* trainc profile's diagnosis (profile_findings, profile_report.c) on GPU
 * figures given by hand, so that it is checked without a GPU:
 * - configs/baseline.ini's profile (SimpleNet 224 px, batch 32, fp32, no
 *   workers, pageable memory, a sync after each step and the loss read each
 *   step; a 26 ms step with data wait 9%, a synchronous input copy 9%,
 *   backward 57%) finds what the lab finds: data loading, host syncs and a
 *   small batch, each with its switch (data.workers, train.sync_after_step,
 *   train.batch), and the input copy (data.async_copy, data.pinned);
 * - configs/final.ini's (batch 256, fp16, NHWC, fused, asynchronous loading;
 *   convolutions 11.5 of the 15.1 ms step) finds compute-bound convolutions first,
 *   with the longest convolution's place on the roofline against the
 *   measured peaks, and suggests no switch that final.ini has on;
 * - with CUPTI's figures: the utilisation line gives the kernel-active share
 *   and NVML's "not measured" for a negative one; copies not overlapped come
 *   from CUPTI; communication not hidden appears only with world > 1;
 * - convolution passes (conv2d's own ops, not the fused bias and activation
 *   beside them) over 1.25x their start-up timings are a finding of their
 *   own (airbench before its filters were aligned), those within it, run
 *   twice a step (memory.checkpoint's recompute) or fused (another op than
 *   init timed) are not;
 * - NVML's power line: mean draw, energy per step, and "power-bound" once the
 *   power limit held the clocks down PROFILE_FINDING_MIN_SHARE of the window
 *   or more; what NVML did not give is called not measured, and a window
 *   under GPU_MONITOR_POWER_MIN_S says how many steps would do;
 * - every finding is at least PROFILE_FINDING_MIN_SHARE of the step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"
#include "tools/trainer/profile.h"

static ProfileLayer layers[8];

/* A layer whose backward is twice its forward's FLOPs and bytes. */
static ProfileLayer layer(const char *name, double gflop, double mb, double fwd_ms, double bwd_ms) {
    ProfileLayer l = {0};
    snprintf(l.name, sizeof l.name, "%s", name);
    snprintf(l.ops, sizeof l.ops, "x_forward,x_backward");
    l.forward_flops = 1e9 * gflop, l.backward_flops = 2e9 * gflop;
    l.forward_bytes = 1e6 * mb, l.backward_bytes = 2e6 * mb;
    l.forward_ms = fwd_ms, l.backward_ms = bwd_ms;
    return l;
}

/* An H100's measured peaks: 700 TFLOP/s fp16 GEMM (60 float32, 350 TF32), 2.6 TB/s copy (read + write):
 * ridge 269 in half precision, 23 in float32. */
static ProfileReport report(double step, double wait, double input, double fwd, double bwd, double opt) {
    ProfileReport r;
    memset(&r, 0, sizeof r);
    r.gpu = 1, r.world = 1, r.first = 11, r.last = 30;
    r.summary.step_ms = step, r.summary.gpu_util = 71;
    r.summary.phase_data_wait_ms = wait, r.summary.phase_input_ms = input, r.summary.phase_forward_ms = fwd;
    r.summary.phase_backward_ms = bwd, r.summary.phase_optimizer_ms = opt, r.summary.phase_graph_ms = NAN;
    r.peaks = (ProfilePeaks){.flops_per_s = 700e12, .flops_f32_per_s = 60e12, .flops_tf32_per_s = 350e12,
                             .bytes_per_s = 2.6e12, .device = "NVIDIA H100 80GB HBM3 (GPU-test)", .from_cache = 1};
    r.layers = layers;
    r.kernels.available = 0;
    snprintf(r.kernels.why_not, sizeof r.kernels.why_not, "not loaded in this test");
    return r;
}

static const ProfileFinding *find(const ProfileFinding *fs, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (!strcmp(fs[i].what, what)) return &fs[i];
    return NULL;
}

static char *print(ProfileReport *r) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    profile_print(r, f);
    fclose(f);
    return text;
}

static void check_found(const ProfileFinding *fs, int n, const char *what, const char *switch_) {
    const ProfileFinding *f = find(fs, n, what);
    CHECK_MSG(f != NULL, "no finding '%s'", what);
    if (f) CHECK_MSG(strstr(f->switches, switch_) != NULL, "%s: switches %s, not %s", what, f->switches, switch_);
    for (int i = 0; i < n; i++) CHECK(fs[i].share >= PROFILE_FINDING_MIN_SHARE);
}

/* fp32 SimpleNet at batch 32: the layers are about 19 of the 26 ms. */
static void check_baseline(void) {
    ProfileReport r = report(26.0, 2.37, 2.39, 4.6, 14.8, 0.35);
    r.settings = (ProfileSettings){.use_gpu = 1, .prefetch = 2, .batch = 32, .sync_after_step = 1,
                                   .read_loss_every = 1, .bucket_mb = 25};
    layers[0] = layer("conv 0", 5.5, 60, 0.55, 1.4);
    layers[1] = layer("relu 1", 0.1, 820, 0.45, 0.7);
    layers[2] = layer("maxpool 2", 0.03, 510, 0.5, 1.0);
    layers[3] = layer("conv 3", 59, 310, 1.2, 4.6);
    layers[4] = layer("maxpool 5", 0.01, 250, 0.3, 0.6);
    layers[5] = layer("conv 6", 59, 150, 1.1, 4.4);
    layers[6] = layer("linear 7", 6.6, 410, 0.3, 0.8);
    r.n_layers = 7, r.layers_ms = 17.9, r.outside_ms = 3.2, r.n_ops = 20 * 40;
    ProfileFinding fs[PROFILE_MAX_FINDINGS];
    int n = profile_findings(&r, fs, PROFILE_MAX_FINDINGS);
    check_found(fs, n, "data wait", "data.workers");
    check_found(fs, n, "host syncs", "train.sync_after_step=off");
    check_found(fs, n, "host syncs", "train.read_loss_every=0");
    check_found(fs, n, "small batch", "train.batch=64");
    check_found(fs, n, "copies not overlapped", "data.async_copy=on");
    check_found(fs, n, "compute-bound convolutions", "precision.amp=fp16");
    const ProfileFinding *batch = find(fs, n, "small batch");
    if (batch) CHECK_NEAR(batch->gain_ms, batch->ms / 2, 1e-12);
    char *text = print(&r); /* a window of 0 steps: NVML's figure is of the time before it */
    CHECK(text && strstr(text, "NVML not measured: the window is 0.00 s, shorter than NVML's 1 s sample"));
    free(text);
    r.summary.timed_steps = (long)(1100 / r.summary.step_ms) + 1; /* 1.1 s */
    text = print(&r);
    CHECK(text && strstr(text, "GPU utilisation: kernel-active share not measured (CUPTI: not loaded in this test); "
                            "NVML 71%"));
    CHECK(text && strstr(text, "finding 1: backward") == NULL && strstr(text, "measured on NVIDIA H100"));
    if (getenv("TEST_DIAGNOSIS_SHOW") && text) fputs(text, stdout);
    free(text);
}

/* fp16 NHWC SimpleNet at batch 256 as final.ini runs it (the graph off while profiling). */
static void check_final(void) {
    ProfileReport r = report(15.13, 0.004, 0.23, 4.4, 9.2, 0.3);
    r.settings = (ProfileSettings){.use_gpu = 1, .workers = 8, .prefetch = 4, .pinned = 1, .async_copy = 1,
                                   .transform_on_gpu = 1, .batch = 256, .fuse = 1, .nhwc = 1, .amp = 1, .tf32 = 1,
                                   .conv_benchmark = 1, .cuda_graph = 1, .bucket_mb = 25};
    layers[0] = layer("conv 0", 59, 520, 0.4, 0.9);      /* 8 padded input channels: memory-bound */
    layers[1] = layer("conv 1", 472, 1230, 1.3, 3.1);    /* 384 FLOP/byte */
    layers[2] = layer("conv 2", 472, 616, 1.2, 2.9);     /* 766 FLOP/byte */
    layers[3] = layer("linear 3", 26, 420, 0.2, 0.5);
    r.n_layers = 4, r.layers_ms = 10.5, r.outside_ms = 2.8, r.n_ops = 20 * 30;
    ProfileFinding fs[PROFILE_MAX_FINDINGS];
    int n = profile_findings(&r, fs, PROFILE_MAX_FINDINGS);
    CHECK_MSG(n > 0 && !strcmp(fs[0].what, "compute-bound convolutions"), "first finding %s", n ? fs[0].what : "none");
    if (n > 0) {
        CHECK_MSG(strstr(fs[0].from, "conv 1 4.400 ms, 383.7 FLOP/byte, 322 of 700 TFLOP/s attainable (46%)") != NULL,
                  "%s", fs[0].from);
        CHECK_MSG(!strcmp(fs[0].switches, "none left (all on)"), "%s", fs[0].switches);
    }
    const char *on[] = {"precision.amp", "model.layout", "model.fuse", "data.async_copy", "data.pinned",
                        "data.workers=", "data.transform_on", "train.sync_after_step", "perf.conv_benchmark"};
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < sizeof on / sizeof *on; j++)
            CHECK_MSG(!strstr(fs[i].switches, on[j]), "%s suggests %s, already on", fs[i].what, on[j]);
}

/* CUPTI's figures: utilisation, copies, and communication under mpirun. */
static void check_kernels(void) {
    ProfileReport r = report(10.0, 0.1, 1.0, 3.0, 5.0, 0.2);
    r.settings = (ProfileSettings){.use_gpu = 1, .workers = 4, .prefetch = 2, .pinned = 1, .batch = 64,
                                   .async_copy = 1, .bucket_mb = 0};
    r.summary.gpu_util = -1;
    r.kernels.available = 1;
    r.kernels.active_ms = 7.5, r.kernels.h2d_ms = 1.2, r.kernels.copy_overlap_ms = 0.2, r.kernels.mean_kernel_us = 8;
    r.kernels.kernels = 900, r.kernels.comm_ms = 1.5, r.kernels.comm_exposed_ms = 1.1, r.kernels.sync_ms = 6;
    ProfileFinding fs[PROFILE_MAX_FINDINGS];
    int n = profile_findings(&r, fs, PROFILE_MAX_FINDINGS);
    const ProfileFinding *copies = find(fs, n, "copies not overlapped");
    CHECK(copies && fabs(copies->ms - 1.0) < 1e-12 && strstr(copies->from, "CUPTI"));
    CHECK(find(fs, n, "communication not hidden") == NULL); /* one process */
    check_found(fs, n, "launch-bound small kernels", "perf.cuda_graph=on");
    r.world = 2;
    n = profile_findings(&r, fs, PROFILE_MAX_FINDINGS);
    check_found(fs, n, "communication not hidden", "dist.bucket_mb=25");
    char *text = print(&r);
    CHECK_MSG(text && strstr(text, "GPU utilisation: kernels active 75.0% of the step (CUPTI: 7.500 of 10.000 ms); "
                                   "NVML not measured"), "%s", text ? text : "");
    free(text);
}

static void check_power_line(ProfileReport *r, const char *want, const char *not_want) {
    char *text = print(r);
    CHECK_MSG(text && strstr(text, want), "no '%s' in:\n%s", want, text ? text : "");
    if (text && not_want) CHECK_MSG(!strstr(text, not_want), "'%s' in:\n%s", not_want, text);
    free(text);
}

static void check_power(void) {
    ProfileReport r = report(5.5, 0, 0.05, 2.2, 3.0, 0.3);
    r.summary.power_w = 686, r.summary.power_limit_w = 700, r.summary.power_capped = 0.36;
    check_power_line(&r, "GPU power: mean 686 W of the 700 W limit, 3.77 J per step; power-bound: the power limit "
                         "held the clocks down 36.0% of the window (NVML)", NULL);
    r.summary.power_capped = 0.01;
    check_power_line(&r, "3.77 J per step; the power limit held the clocks down 1.0% of the window\n", "power-bound");
    r.summary.power_capped = r.summary.power_limit_w = -1, r.summary.power_w = 300;
    check_power_line(&r, "GPU power: mean 300 W, 1.65 J per step; the power limit's hold on the clocks not measured",
                     "limit,");
    r.summary.power_w = -1, r.summary.timed_steps = 200; /* 1.1 s: long enough, and NVML gave nothing */
    check_power_line(&r, "GPU power: not measured (NVML's", "GPU power: mean");
    r.summary.timed_steps = 30; /* 0.165 s: too short for NVML's counters */
    check_power_line(&r, "GPU power: not measured: NVML's counters need 1.0 s of steps, the window is 0.17 s (profile "
                         "182 steps or more)", NULL);
}

/* A conv2d layer with its start-up timings. */
static ProfileLayer timed_conv(const char *name, double gflop, double fwd_ms, double bwd_ms, double timed_fwd,
                               double timed_bwd) {
    ProfileLayer l = layer(name, gflop, 300, fwd_ms + 0.1, bwd_ms + 0.1); /* and a fused bias and activation */
    snprintf(l.ops, sizeof l.ops, "conv2d_forward,bias_relu_forward,relu_backward,conv2d_backward");
    l.conv_forward_ms = fwd_ms, l.conv_backward_ms = bwd_ms, l.conv_forward_runs = l.conv_backward_runs = 1;
    l.timed_forward_ms = timed_fwd, l.timed_backward_ms = timed_bwd;
    return l;
}

/* airbench_muon's step on an H100 before its filters were aligned: three
 * convolutions' passes far over their start-up timings, the rest within 1.25x. */
static void check_slow_convs(void) {
    ProfileReport r = report(5.543, 0, 0.05, 2.17, 2.97, 0.31);
    r.settings = (ProfileSettings){.use_gpu = 1, .batch = 2000, .fuse = 1, .nhwc = 1, .amp = 1, .conv_benchmark = 1,
                                   .cuda_graph = 1};
    layers[0] = timed_conv("conv 2", 53, 0.288, 0.326, 0.286, 0.330 + 0.322);
    layers[1] = timed_conv("conv 9", 133, 0.372, 0.511, 0.202, 0.302 + 0.217);
    layers[2] = timed_conv("conv 13", 116, 0.273, 0.446, 0.152, 0.151 + 0.172);
    layers[3] = timed_conv("conv 16", 116, 0.272, 0.441, 0.152, 0.151 + 0.172);
    layers[4] = layer("batchnorm 17", 0.1, 300, 0.08, 0.13);
    r.n_layers = 5, r.layers_ms = 3.6, r.n_ops = 31 * 100;
    ProfileFinding fs[PROFILE_MAX_FINDINGS];
    int n = profile_findings(&r, fs, PROFILE_MAX_FINDINGS);
    const ProfileFinding *slow = find(fs, n, "convolutions slower than timed");
    /* forwards of 9, 13, 16 and backwards of 13, 16; conv 2 and conv 9's backward are within 1.25x */
    double want = (0.372 - 0.202) + (0.273 - 0.152) + (0.446 - 0.323) + (0.272 - 0.152) + (0.441 - 0.323);
    CHECK_MSG(slow && fabs(slow->ms - want) < 1e-9 && fabs(slow->gain_ms - want) < 1e-9, "%s: %g ms, want %g",
              slow ? slow->what : "no finding", slow ? slow->ms : 0, want);
    if (slow)
        CHECK_MSG(strstr(slow->from, "; conv 9 forward 0.372 ms against 0.202 timed; conv 13 forward") &&
                      !strstr(slow->from, "conv 2 ") && !strstr(slow->from, "conv 9 backward"), "%s", slow->from);
    for (int i = 0; i < 4; i++) layers[i].conv_forward_ms = layers[i].timed_forward_ms * 1.2;
    for (int i = 0; i < 4; i++) layers[i].conv_backward_ms = layers[i].timed_backward_ms * 1.2;
    n = profile_findings(&r, fs, PROFILE_MAX_FINDINGS);
    CHECK(find(fs, n, "convolutions slower than timed") == NULL);
    for (int i = 0; i < 4; i++) layers[i].conv_forward_ms *= 2, layers[i].conv_forward_runs = 2; /* recomputed */
    n = profile_findings(&r, fs, PROFILE_MAX_FINDINGS);
    CHECK(find(fs, n, "convolutions slower than timed") == NULL);
    for (int i = 0; i < 4; i++) layers[i].forward_ms = 1.0, layers[i].conv_forward_ms = 0; /* conv_bias_act */
    for (int i = 0; i < 4; i++) layers[i].conv_forward_runs = 0;
    n = profile_findings(&r, fs, PROFILE_MAX_FINDINGS); /* a fused forward was not what init timed */
    CHECK(find(fs, n, "convolutions slower than timed") == NULL);
}

int main(void) {
    check_baseline();
    check_slow_convs();
    check_final();
    check_kernels();
    check_power();
    return test_finish("test_diagnosis");
}
