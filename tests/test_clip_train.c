/* optim.clip_norm in the trainer: a tiny clip holds each step's gradient to
 * that norm, so the weights move no further than the clip allows (far less
 * than unclipped); a huge clip changes nothing, bit for bit; the norm is of the
 * true gradient, so k accumulated micro-batches see the norm of the whole
 * batch. CPU runs; on a GPU also fp32, a CUDA graph and fp16 AMP. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "models/zoo.h"
#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

enum { SEED = 3, STEPS = 4, MAX_LOGGED = 16 };
static const float LR = 0.05f, MOMENTUM = 0.9f;

static const char *tmpdir;
static int runs;

static void set(Config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set(Config *c, const char *fmt, ...) {
    char line[600], err[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (config_set(c, line, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        CHECK(0);
    }
}

/* Nesterov SGD without weight decay, so that only the gradient moves the weights. */
static Config *small_run(const char *device, int batch, int accumulate, double clip) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    const char *sets[] = {"data.source=synthetic", "data.image_size=32", "data.synthetic_train=512",
                          "data.synthetic_test=32", "run.epochs=1", "run.eval=off", "run.warmup_steps=0",
                          "optim.nesterov=on", "optim.weight_decay=0", "run.log_every=1"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) set(c, "%s", sets[i]);
    set(c, "run.seed=%d", SEED);
    set(c, "run.max_steps=%d", STEPS);
    set(c, "optim.lr=%g", LR);
    set(c, "optim.momentum=%g", MOMENTUM);
    set(c, "run.device=%s", device);
    set(c, "train.batch=%d", batch);
    set(c, "memory.accumulate=%d", accumulate);
    set(c, "optim.clip_norm=%.9g", clip);
    return c;
}

typedef struct {
    float *params;
    uint32_t crc;
    int n_norms;
    double norms[MAX_LOGGED]; /* grad_norm of steps 1, 2, ... from the metrics file */
} Run;

/* Runs c (and frees it), with a metrics file of its own. */
static Run run(Config *c) {
    Run r = {0};
    char path[700];
    snprintf(path, sizeof path, "%s/metrics-%d.jsonl", tmpdir, runs++);
    set(c, "run.metrics_file=%s", path);
    TrainSummary s;
    train_run_keep_params(c, &s, &r.params);
    CHECK(s.steps == STEPS && s.skipped_steps == 0);
    r.crc = s.params_crc;
    config_free(c);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "\"grad_norm\": ");
        if (at && strstr(line, "\"loss\"") && r.n_norms < MAX_LOGGED)
            r.norms[r.n_norms++] = strtod(at + strlen("\"grad_norm\": "), NULL);
    }
    if (f) fclose(f);
    return r;
}

static size_t n_params;
static float *initial;

/* The trainer's starting weights: the same model and seed. */
static void initial_params(void) {
    Model m;
    char err[256];
    CHECK(model_build(&m, "simplenet", 32, 32, 10, 0, err, sizeof err) == 0);
    model_finalize(&m, NULL, SEED);
    n_params = m.n_params;
    initial = malloc(n_params * sizeof(float));
    model_get_params(&m, initial);
    model_destroy(&m);
}

/* ||params - initial|| */
static double moved(const float *params) {
    double sum = 0;
    for (size_t i = 0; i < n_params; i++) {
        double d = (double)params[i] - initial[i];
        sum += d * d;
    }
    return sqrt(sum);
}

/* How far STEPS Nesterov steps can move the weights when no step's gradient is
 * longer than clip: sum over t of lr * (1 + momentum * sum_{j<=t} momentum^j) * clip. */
static double clipped_reach(double clip) {
    double reach = 0, geometric = 0, power = 1;
    for (int t = 0; t < STEPS; t++) {
        geometric += power;
        power *= MOMENTUM;
        reach += LR * (1 + MOMENTUM * geometric) * clip;
    }
    return reach;
}

static double min_norm(const Run *r) {
    double m = INFINITY;
    for (int i = 0; i < r->n_norms; i++) m = fmin(m, r->norms[i]);
    return m;
}

static void free_run(Run *r) { free(r->params); }

/* amp: "off", "fp16" or "bf16"; graph: perf.cuda_graph. */
static Config *device_run(const char *device, const char *amp, int graph, int batch, int accumulate, double clip) {
    Config *c = small_run(device, batch, accumulate, clip);
    if (strcmp(device, "cuda") == 0) {
        set(c, "precision.amp=%s", amp);
        set(c, "precision.loss_scale=1024"); /* no overflow in the first steps */
        set(c, "perf.cuda_graph=%s", graph ? "on" : "off");
        set(c, "perf.deterministic=on");
    }
    return c;
}

static void check_device(const char *device) {
    printf("%s\n", device);
    Run plain = run(device_run(device, "off", 0, 32, 1, 0));
    Run huge = run(device_run(device, "off", 0, 32, 1, 1e9));
    /* c = 1 multiplies by exactly 1: the unclipped run's bits */
    CHECK_MSG(huge.crc == plain.crc && !memcmp(huge.params, plain.params, n_params * sizeof(float)),
              "%s: clip_norm 1e9 crc %u, unclipped %u", device, (unsigned)huge.crc, (unsigned)plain.crc);
    CHECK(plain.n_norms == 0); /* clipping off: no norm logged */
    CHECK_MSG(huge.n_norms == STEPS && min_norm(&huge) > 0 && isfinite(min_norm(&huge)), "%s: %d norms logged",
              device, huge.n_norms);

    const double tiny = 1e-3;
    Run clipped = run(device_run(device, "off", 0, 32, 1, tiny));
    double reach = clipped_reach(tiny), d_plain = moved(plain.params), d_clipped = moved(clipped.params);
    printf("  moved: unclipped %.4g, clip_norm %g %.4g (at most %.4g); step-1 norm %.6g\n", d_plain, tiny, d_clipped,
           reach, huge.norms[0]);
    CHECK_MSG(d_clipped > 0 && d_clipped <= reach * 1.001, "%s: clip_norm %g moved the weights %.6g, at most %.6g",
              device, tiny, d_clipped, reach);
    CHECK_MSG(d_plain > 20 * d_clipped, "%s: unclipped moved %.6g, clipped %.6g", device, d_plain, d_clipped);
    /* the logged norm is the one before clipping: the first step's is the unclipped run's */
    CHECK_MSG(clipped.n_norms == STEPS && clipped.norms[0] == huge.norms[0], "%s: step-1 norm %.9g, unclipped %.9g",
              device, clipped.norms[0], huge.norms[0]);

    /* 2 x 16 accumulated: the norm of the batch of 32's mean gradient, and the
     * same clipped steps, with a clip that clips every step */
    double clip = 0.25 * min_norm(&huge);
    Run whole = run(device_run(device, "off", 0, 32, 1, clip));
    Run micro = run(device_run(device, "off", 0, 16, 2, clip));
    CHECK_MSG(micro.n_norms == STEPS && whole.n_norms == STEPS && fabs(micro.norms[0] - whole.norms[0]) <= 1e-5 * whole.norms[0],
              "%s: step-1 norm accumulated %.9g, whole batch %.9g", device, micro.norms[0], whole.norms[0]);
    CHECK_MSG(min_norm(&whole) > clip && min_norm(&micro) > clip, "%s: a step went unclipped (clip %g)", device, clip);
    float *dw = malloc(n_params * sizeof(float)), *dm = malloc(n_params * sizeof(float));
    for (size_t i = 0; i < n_params; i++) {
        dw[i] = whole.params[i] - initial[i];
        dm[i] = micro.params[i] - initial[i];
    }
    double e = test_rel_error(dm, dw, n_params);
    printf("  clip_norm %.4g: 2 x 16 accumulated vs 32 at once, rel error of the weights' change %.3g\n", clip, e);
    CHECK_MSG(e < 1e-2, "%s: accumulated clipped steps differ from the whole batch's: rel %.3g", device, e);
    CHECK_MSG(moved(whole.params) <= clipped_reach(clip) * 1.001, "%s: clip %g moved %.6g", device, clip,
              moved(whole.params));
    free(dw), free(dm);
    Run *all[] = {&plain, &huge, &clipped, &whole, &micro};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free_run(all[i]);
}

/* The clip inside a captured step, and under AMP's loss scale. */
static void check_gpu_extras(void) {
    Run huge = run(device_run("cuda", "off", 0, 16, 2, 1e9));
    double clip = 0.25 * min_norm(&huge);
    Run eager = run(device_run("cuda", "off", 0, 16, 2, clip));
    Run graph = run(device_run("cuda", "off", 1, 16, 2, clip));
    CHECK_MSG(graph.crc == eager.crc, "clip_norm %g: CUDA graph run crc %u, eager %u", clip, (unsigned)graph.crc,
              (unsigned)eager.crc);
    const char *amps[] = {"fp16", "bf16"};
    for (int a = 0; a < 2; a++) {
        Run half = run(device_run("cuda", amps[a], 1, 16, 2, clip));
        printf("  %s: step-1 norm %.6g (fp32 %.6g), moved %.4g (at most %.4g)\n", amps[a], half.norms[0],
               eager.norms[0], moved(half.params), clipped_reach(clip));
        /* the norm of the unscaled gradient, whatever the loss scale */
        CHECK_MSG(fabs(half.norms[0] - eager.norms[0]) <= 2e-2 * eager.norms[0], "%s step-1 norm %.6g, fp32 %.6g",
                  amps[a], half.norms[0], eager.norms[0]);
        CHECK_MSG(moved(half.params) <= clipped_reach(clip) * 1.001, "%s: clip %g moved %.6g", amps[a], clip,
                  moved(half.params));
        free_run(&half);
    }
    free_run(&huge), free_run(&eager), free_run(&graph);
}

int main(void) {
    tmpdir = test_tmpdir("clip-train");
    initial_params();
    check_device("cpu");
    if (test_have_gpu()) {
        check_device("cuda");
        check_gpu_extras();
    } else {
        printf("no GPU: GPU checks skipped\n");
    }
    free(initial);
    return test_finish("test_clip_train");
}
