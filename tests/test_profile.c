/* trainc profile on the CPU: SimpleNet at 16x16 on synthetic data, batch 4,
 * steps 3..5 timed op by op (host time).
 * - Every layer is listed, with forward and backward times >= 0, and both
 *   its forward and its backward op seen.
 * - The layers' and the other ops' times together are at most the measured
 *   step: on the CPU the ops run one after another on the training thread,
 *   each timed inside the trainer's timed window on the same clock
 *   (now_seconds, CLOCK_MONOTONIC), and step_ms is that window over its
 *   steps. So the bound is exact, up to rounding (1e-6 ms).
 * - conv 0's FLOPs are 2*N*K*C*R*S*OH*OW forward and twice that backward.
 * - The diagnosis' phases line names the largest of the trainer's phases;
 *   its findings come ranked, each printed as its "finding N:" line; the
 *   roofline is against measured peaks (the CPU's, cached in the build tree:
 *   $TRAINC_CACHE_DIR).
 * - The trace parses (cJSON) with a process name ("rank 0"), 3 thread names,
 *   a span per step, a span per host phase (data wait, input, forward,
 *   backward, optimizer: one of each per step) and a span per op: each
 *   layer's ops 2 per step (one forward face, one backward face on the CPU),
 *   and the ops outside the layers the same number each step.
 * - The kernels section (CUPTI) is not available on the CPU: the report
 *   says so in one line, and the trace holds no GPU tracks.
 * - A bad --steps: one message naming it, exit status 2; --graph on the CPU,
 *   before step 3, or without `profile`: one message each, status 1, 2, 2.
 * With a GPU (the lead's run) the same on cuda, with perf.overlap_wgrad on in
 * the config: the eager run forces it off (each op timed alone) and notes the
 * config's setting, --graph keeps it. Timed by events there, the ops' device
 * intervals lie one after another on the compute stream between the window's
 * first and last event, so the bound adds only the events' resolution (about
 * 0.5 us each, 1 us allowed per op); each layer's ops come the same number of
 * times each step. The kernels section there: available, kernels every step,
 * the kernel-active time within the window (both unions of the same
 * integer-ns records, divided alike), the compute stream among the streams,
 * and an "X" event in the trace per kernel of the window on a stream track.
 * And profile --graph on cuda: no op timed, the CUPTI kernels of the window
 * launched by fewer calls than half their number (one graph launch a step,
 * where the eager run launches each), a kernel event per kernel and a "graph"
 * phase span per step in the trace, and the convolutions' and linear layers'
 * FLOPs the eager run's to the bit.
 * - No --steps: the window's choice from a step time (the default, longer up
 *   to the span NVML wants, the cap); a CPU run keeps 11..30 and says why, a
 *   GPU run spans NVML's second of steps (or the cap). */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "runtime/config.h"
#include "runtime/gpu_monitor.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/profile.h"

enum { BATCH = 4, SIZE = 16, FIRST = 3, LAST = 5, STEPS = LAST - FIRST + 1 };

static Config *tiny_config(const char *device) {
    static const char *sets[] = {"data.source=synthetic", "data.image_size=16",
                                 "data.synthetic_train=64", "data.synthetic_test=8", "train.batch=4",
                                 "model.name=simplenet", "run.log_every=1000"};
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    char err[512], line[64];
    snprintf(line, sizeof line, "run.device=%s", device);
    CHECK_MSG(config_set(c, line, err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        CHECK_MSG(config_set(c, sets[i], err, sizeof err) == 0, "%s", err);
    if (strcmp(device, "cuda") == 0) /* the eager run forces it off, --graph keeps it (the CPU has no second stream) */
        CHECK_MSG(config_set(c, "perf.overlap_wgrad=on", err, sizeof err) == 0, "%s", err);
    return c;
}

static void check_layers(const ProfileReport *r) {
    CHECK(r->n_layers == 12); /* SimpleNet: 3 x (conv, relu, maxpool), linear, relu, linear */
    for (int i = 0; i < r->n_layers; i++) {
        const ProfileLayer *l = &r->layers[i];
        CHECK_MSG(l->forward_ms >= 0 && l->backward_ms >= 0, "%s: %g, %g ms", l->name, l->forward_ms,
                  l->backward_ms);
        CHECK_MSG(strstr(l->ops, "forward") && strstr(l->ops, "backward"), "%s: ops %s", l->name, l->ops);
    }
    double ops_ms = r->layers_ms + r->outside_ms, resolution_ms = r->gpu ? 0.001 * r->n_ops / STEPS : 1e-6;
    CHECK_MSG(r->layers_ms > 0 && ops_ms <= r->summary.step_ms + resolution_ms, "layers %g + outside %g ms, step %g ms",
              r->layers_ms, r->outside_ms, r->summary.step_ms);
    const ProfileLayer *conv = &r->layers[0];
    CHECK(strcmp(conv->name, "conv 0") == 0);
    double flops = 2.0 * BATCH * 64 * 3 * 3 * 3 * SIZE * SIZE;
    CHECK_NEAR(conv->forward_flops, flops, 0);
    CHECK_NEAR(conv->backward_flops, 2 * flops, 0);
}

/* The largest phase by the summary's own figures. */
static const char *largest_phase(const TrainSummary *s) {
    const char *names[] = {"data wait", "input", "forward", "backward", "optimizer", "outside the phases"};
    double ms[] = {s->phase_data_wait_ms, s->phase_input_ms, s->phase_forward_ms, s->phase_backward_ms,
                   s->phase_optimizer_ms, 0};
    for (int i = 0; i < 5; i++) ms[5] += ms[i];
    ms[5] = s->step_ms - ms[5]; /* what lies between the phases */
    int best = 0;
    for (int i = 1; i < 6; i++)
        if (ms[i] > ms[best]) best = i;
    return names[best];
}

/* The findings: ranked by ms, each over the minimum share, the gain within
 * the finding's time (layers: their time less theirs at the roof), and each
 * printed as its "finding N: what | ms ms/step | ..." line. */
static void check_findings(const ProfileReport *r, const char *text) {
    ProfileFinding fs[PROFILE_MAX_FINDINGS];
    int n = profile_findings(r, fs, PROFILE_MAX_FINDINGS);
    for (int i = 0; i < n; i++) {
        CHECK_MSG(i == 0 || fs[i].ms <= fs[i - 1].ms, "finding %d: %g ms after %g", i + 1, fs[i].ms, fs[i - 1].ms);
        CHECK_MSG(fs[i].share >= PROFILE_FINDING_MIN_SHARE && fs[i].gain_ms >= 0 && fs[i].gain_ms <= fs[i].ms + 1e-9,
                  "%s: share %g, gain %g of %g ms", fs[i].what, fs[i].share, fs[i].gain_ms, fs[i].ms);
        CHECK_MSG(fs[i].switches[0] && fs[i].from[0], "%s: no switches or no source", fs[i].what);
        char line[160];
        snprintf(line, sizeof line, "finding %d: %.63s | %.4f ms/step | ", i + 1, fs[i].what, fs[i].ms);
        CHECK_MSG(strstr(text, line) != NULL, "no '%s' in:\n%s", line, text);
    }
    char past[32];
    snprintf(past, sizeof past, "finding %d: ", n + 1);
    CHECK(strstr(text, past) == NULL && (n > 0 || strstr(text, "no bottleneck over")));
}

/* profile_print's report as a string (free it), or NULL. */
static char *report_text(ProfileReport *r) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    if (!f) return NULL;
    profile_print(r, f);
    fclose(f);
    return text;
}

static void check_diagnosis(ProfileReport *r) {
    char *text = report_text(r);
    if (!text) return;
    char want[80];
    snprintf(want, sizeof want, "phases, ms per step (largest: %s)", largest_phase(&r->summary));
    CHECK_MSG(strstr(text, want) != NULL, "no '%s' in:\n%s", want, text);
    CHECK(strstr(text, "== memory") != NULL && strstr(text, "conv 6") != NULL);
    if (!r->gpu) CHECK_MSG(strstr(text, "\n== kernels: not available: ") != NULL, "%s", text);
    else CHECK_MSG(strstr(text, "== kernels: the GPU's activity") != NULL, "%s", text);
    CHECK(strstr(text, r->gpu ? "GPU utilisation: k" : "GPU utilisation: does not apply") != NULL);
    /* NVML's power line on a GPU only; its figures depend on the counters' update rate in so short a window. */
    CHECK_MSG((strstr(text, "\nGPU power: ") != NULL) == r->gpu, "%s", text);
    CHECK(r->peaks.flops_per_s > 0 && r->peaks.bytes_per_s > 0 && strstr(text, "measured on "));
    check_findings(r, text);
    free(text);
}

/* Events of process 0 whose key (name or cat) is value. */
static int count_events(const cJSON *events, const char *key, const char *value) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key), *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
        n += cJSON_IsString(v) && strcmp(v->valuestring, value) == 0 && cJSON_IsNumber(pid) && pid->valueint == 0;
    }
    return n;
}

static void check_phases(const cJSON *events) {
    const char *phases[] = {"data wait", "input", "forward", "backward", "optimizer"};
    enum { N_PHASES = sizeof phases / sizeof *phases };
    CHECK_NEAR(count_events(events, "cat", "phase"), N_PHASES * STEPS, 0);
    for (int i = 0; i < N_PHASES; i++)
        CHECK_MSG(count_events(events, "name", phases[i]) == STEPS, "%s: %d spans, want %d", phases[i],
                  count_events(events, "name", phases[i]), STEPS);
    int host_tracks = 0; /* the GPU's tracks (tid 999 and up: CUPTI's streams and API calls) come on top */
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name"), *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, "thread_name") && cJSON_IsNumber(tid) &&
            tid->valuedouble < 999)
            host_tracks++;
    }
    CHECK_MSG(count_events(events, "name", "process_name") == 1 && host_tracks == 3, "%d host tracks", host_tracks);
}

static void check_trace(const ProfileReport *r, const char *path) {
    char *text = test_read_file(path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK_MSG(root != NULL, "%s does not parse as JSON", path);
    free(text);
    if (!root) return;
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    CHECK(cJSON_IsArray(events));
    long gpu_events = 0, kernel_events = 0; /* the kernels section's tracks (profile_kernels_trace) */
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
        if (cJSON_IsNumber(tid) && tid->valuedouble >= 999) gpu_events++;
        if (cJSON_IsString(cat) && !strcmp(cat->valuestring, "kernel")) kernel_events++;
    }
    if (!r->gpu) { /* on the GPU the phases' data wait and input may come more than once a step */
        CHECK(gpu_events == 0);
        CHECK_NEAR(cJSON_GetArraySize(events), 4 + STEPS + 5 * STEPS + r->n_ops, 0);
    } else {
        CHECK_MSG(kernel_events > 0 && kernel_events == (long)(r->kernels.kernels * STEPS + 0.5),
                  "%ld kernel events, %g kernels per step", kernel_events, r->kernels.kernels);
    }
    CHECK_NEAR(count_events(events, "cat", "step"), STEPS, 0);
    CHECK_NEAR(count_events(events, "cat", "op"), r->n_ops, 0);
    check_phases(events);
    long layer_ops = 0;
    for (int i = 0; i < r->n_layers; i++) {
        char prefix[40];
        int n = snprintf(prefix, sizeof prefix, "%s: ", r->layers[i].name), count = 0;
        cJSON_ArrayForEach(e, events) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && strncmp(name->valuestring, prefix, (size_t)n) == 0) count++;
        }
        if (r->gpu) CHECK_MSG(count >= 2 * STEPS && count % STEPS == 0, "%s: %d op events", r->layers[i].name, count);
        else CHECK_MSG(count == 2 * STEPS, "%s: %d op events, want %d", r->layers[i].name, count, 2 * STEPS);
        layer_ops += count;
    }
    CHECK_MSG(r->n_ops > layer_ops && (r->n_ops - layer_ops) % STEPS == 0, "%ld ops, %ld of them the layers'",
              r->n_ops, layer_ops);
    cJSON_Delete(root);
}

static void check_kernels(const ProfileReport *r) {
    const ProfileKernels *k = &r->kernels;
    if (!r->gpu) {
        CHECK_MSG(!k->available && k->why_not[0], "CPU: available %d, why_not '%s'", k->available, k->why_not);
        return;
    }
    CHECK_MSG(k->available, "kernels not available: %s", k->why_not);
    if (!k->available) return;
    CHECK_MSG(k->kernels > 0 && k->kernel_ms > 0 && k->longest[0].name[0], "%g kernels, %g ms", k->kernels,
              k->kernel_ms);
    CHECK_MSG(k->active_ms > 0 && k->active_ms <= k->window_ms && k->active_ms <= k->kernel_ms + 1e-9,
              "active %g ms, window %g ms, kernels %g ms", k->active_ms, k->window_ms, k->kernel_ms);
    int compute = 0;
    for (int i = 0; i < k->n_streams; i++) compute += k->streams[i].compute;
    CHECK_MSG(compute == 1 && k->streams[0].compute, "%d of %d streams marked compute", compute, k->n_streams);
    CHECK(k->launches > 0 && k->launch_ms > 0 && k->idle_ms >= 0 && k->longest_idle_ms >= 0);
    /* idle: no record on any stream, so never while a kernel ran */
    CHECK_MSG(k->idle_ms + k->active_ms <= k->window_ms + 1e-6, "idle %g + kernel-active %g ms, window %g ms",
              k->idle_ms, k->active_ms, k->window_ms);
}

/* trainc ARGS (the binary): its exit status is want_status and its output holds want. */
static void check_trainc_fails(const char *args, int want_status, const char *want) {
    const char *build = getenv("TRAINC_BUILD_DIR");
    char cmd[1200], out[4096] = "";
    snprintf(cmd, sizeof cmd, "%s/trainc %s 2>&1", build ? build : "build", args);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int status = pclose(p);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == want_status, "trainc %s: exit status %d, want %d:\n%s",
              args, status, want_status, out);
    CHECK_MSG(strstr(out, want) != NULL, "trainc %s: no '%s' in:\n%s", args, want, out);
}

static void check_bad_steps(void) {
    char err[256];
    long a, b;
    const char *bad[] = {"1:3", "5:4", "3", "a:b", "3:", ":5", "3:5x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(profile_parse_steps(bad[i], &a, &b, err, sizeof err) != 0, "--steps %s accepted", bad[i]);
    CHECK(profile_parse_steps("11:30", &a, &b, err, sizeof err) == 0 && a == 11 && b == 30);
    check_trainc_fails("profile --config configs/cpu.ini --steps 9:2", 2, "trainc: error: --steps 9:2");
    check_trainc_fails("profile --config configs/cpu.ini --graph --steps 2:5", 2,
                       "trainc: error: --graph: step 1 runs eagerly and step 2 captures the CUDA graph");
    check_trainc_fails("--config configs/cpu.ini --graph", 2,
                       "trainc: error: --steps, --trace, --html and --graph belong to trainc profile");
    check_trainc_fails("profile --config configs/cpu.ini --device cpu --graph", 1,
                       "profile --graph: the step's CUDA graph needs the GPU");
}

/* No --steps: the window's length. The choice alone on made-up step times;
 * a run on the CPU keeps the default 11..30 and says why; on the GPU (where
 * there is one) the window spans NVML's second of steps or the cap. */
static void check_window_choice(void) {
    char why[256];
    CHECK(profile_window_steps(0, 1.25, 20, 1000, why, sizeof why) == 20 && strstr(why, "no warm-up step"));
    CHECK(profile_window_steps(NAN, 1.25, 20, 1000, why, sizeof why) == 20 && strstr(why, "no warm-up step"));
    CHECK_MSG(profile_window_steps(0.1, 1.25, 20, 1000, why, sizeof why) == 20 && strstr(why, "the default 20"), "%s",
              why);
    CHECK_MSG(profile_window_steps(0.009, 1.25, 20, 1000, why, sizeof why) == 139 && strstr(why, "139 steps:"), "%s",
              why);
    CHECK_MSG(profile_window_steps(1e-4, 1.25, 20, 1000, why, sizeof why) == 1000 && strstr(why, "the most it takes"),
              "%s", why);
    const char *devices[] = {"cpu", "cuda"};
    for (int d = 0; d < (test_have_gpu() ? 2 : 1); d++) {
        Config *c = tiny_config(devices[d]);
        ProfileReport r;
        profile_run(c, PROFILE_DEFAULT_FIRST, PROFILE_AUTO_LAST, NULL, 0, &r);
        long steps = r.last - r.first + 1;
        double window_s = r.summary.timed_steps * r.summary.step_ms / 1000;
        CHECK_MSG(r.first == PROFILE_DEFAULT_FIRST && r.summary.timed_steps == steps && strstr(r.window_note, "--steps"),
                  "%s: steps %ld..%ld, %ld timed: %s", devices[d], r.first, r.last, r.summary.timed_steps,
                  r.window_note);
        if (d == 0) CHECK_MSG(r.last == PROFILE_DEFAULT_LAST && strstr(r.window_note, "the CPU"), "%s", r.window_note);
        else CHECK_MSG(steps >= 20 && (window_s >= GPU_MONITOR_UTIL_MIN_S || steps == PROFILE_AUTO_MAX_STEPS),
                       "cuda: %ld steps, %.3f s: %s", steps, window_s, r.window_note);
        profile_report_free(&r);
        config_free(c);
    }
}

/* profile --graph on cuda (see the top); eager_flops: the eager run's product_flops. */
static void check_graph(double eager_flops) {
    char trace[700];
    snprintf(trace, sizeof trace, "%s/trace.json", test_tmpdir("profile-graph"));
    Config *c = tiny_config("cuda");
    ProfileReport r;
    profile_run(c, FIRST, LAST, trace, 1, &r);
    CHECK_MSG(config_bool(c, "perf.overlap_wgrad") == 1 && r.settings.overlap_wgrad == 1,
              "profile --graph: perf.overlap_wgrad %d in the run, %d noted", config_bool(c, "perf.overlap_wgrad"),
              r.settings.overlap_wgrad);
    config_free(c);
    const ProfileKernels *k = &r.kernels;
    CHECK(r.graph && r.gpu && r.summary.timed_steps == STEPS && r.n_ops == 0 && r.summary.phase_graph_ms > 0);
    CHECK_MSG(r.product_flops == eager_flops, "FLOPs %.17g under --graph, %.17g eager", r.product_flops, eager_flops);
    CHECK_MSG(k->available && k->kernels > 0 && k->launches < k->kernels / 2,
              "kernels %s: %g per step, %g launch calls per step", k->available ? "available" : k->why_not,
              k->kernels, k->launches);
    char *text = test_read_file(trace);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(root != NULL, "%s does not parse as JSON", trace);
    if (root) {
        const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
        CHECK_NEAR(count_events(events, "cat", "op"), 0, 0);
        CHECK_NEAR(count_events(events, "cat", "step"), STEPS, 0);
        CHECK_NEAR(count_events(events, "name", "graph"), STEPS, 0);
        CHECK_NEAR(count_events(events, "cat", "kernel"), (long)(k->kernels * STEPS + 0.5), 0);
        cJSON_Delete(root);
    }
    profile_report_free(&r);
}

/* A config with perf.overlap_wgrad on is profiled with it off; the report says so. */
static void check_overlap_note(ProfileReport *r) {
    const char *note = "; so was perf.overlap_wgrad (each op timed alone)";
    int noted = r->settings.overlap_wgrad;
    for (int on = 0; on <= 1; on++) {
        r->settings.overlap_wgrad = on;
        char *text = report_text(r);
        if (!text) break;
        CHECK_MSG((strstr(text, note) != NULL) == on, "overlap_wgrad %d:\n%s", on, text);
        free(text);
    }
    r->settings.overlap_wgrad = noted;
}

/* --html's timeline with the compute stream and 12 others inside the first step (tid 100 + k, busy k
 * thirteenths of the step, the compute stream half of one): the compute stream and the 7 busiest (k = 6..12)
 * drawn a lane each, the 5 least busy in one lane, their boxes named by stream. */
static void check_stream_lanes(ProfileReport *r, const char *dir) {
    double t0 = INFINITY, step = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, r->timeline) {
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
        double ts = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "ts"));
        if (!cJSON_IsString(cat) || strcmp(cat->valuestring, "step") != 0 || ts >= t0) continue;
        t0 = ts, step = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "dur"));
    }
    CHECK_MSG(step > 0, "no steps in the timeline");
    for (int k = 0; k <= 12; k++) {
        char name[32];
        snprintf(name, sizeof name, k ? "stream %d" : "stream %d (compute)", k);
        cJSON *meta = cJSON_CreateObject(), *args = cJSON_CreateObject(), *box = cJSON_CreateObject();
        cJSON_AddStringToObject(meta, "name", "thread_name");
        cJSON_AddStringToObject(meta, "ph", "M");
        cJSON_AddNumberToObject(meta, "tid", 100 + k);
        cJSON_AddStringToObject(args, "name", name);
        cJSON_AddItemToObject(meta, "args", args);
        cJSON_AddItemToArray(r->timeline, meta);
        cJSON_AddStringToObject(box, "name", k ? "a_kernel" : "compute_kernel");
        cJSON_AddStringToObject(box, "ph", "X");
        cJSON_AddStringToObject(box, "cat", "kernel");
        cJSON_AddNumberToObject(box, "tid", 100 + k);
        cJSON_AddNumberToObject(box, "ts", t0);
        cJSON_AddNumberToObject(box, "dur", (k ? k : 0.5) * step / 13);
        cJSON_AddItemToArray(r->timeline, box);
    }
    char path[800];
    snprintf(path, sizeof path, "%s/streams.html", dir);
    profile_html_write(r, path);
    char *page = test_read_file(path);
    CHECK_MSG(page && strstr(page, ">stream 0 (compute)</text>") && strstr(page, ">other streams (5)</text>"),
              "the compute stream's lane or the others' lane is missing");
    for (int k = 1; page && k <= 12; k++) {
        char label[48], title[48];
        snprintf(label, sizeof label, ">stream %d</text>", k);
        snprintf(title, sizeof title, "<title>stream %d: a_kernel", k);
        CHECK_MSG(k >= 6 ? strstr(page, label) && !strstr(page, title) : !strstr(page, label) && strstr(page, title),
                  "stream %d (busy %d of 12): %s", k, k, k >= 6 ? "no lane of its own" : "not in the others' lane");
    }
    free(page);
}

static double check_device(const char *device) {
    char trace[700], dir[32];
    snprintf(dir, sizeof dir, "profile-%s", device);
    snprintf(trace, sizeof trace, "%s/trace.json", test_tmpdir(dir));
    Config *c = tiny_config(device);
    ProfileReport r;
    profile_run(c, FIRST, LAST, trace, 0, &r);
    int gpu = strcmp(device, "cuda") == 0;
    CHECK_MSG(config_bool(c, "perf.overlap_wgrad") == 0 && r.settings.overlap_wgrad == gpu,
              "eager profile on %s: perf.overlap_wgrad %d in the run, %d noted", device,
              config_bool(c, "perf.overlap_wgrad"), r.settings.overlap_wgrad);
    config_free(c);
    CHECK(r.summary.timed_steps == STEPS && r.dropped == 0 && r.gpu == gpu);
    check_layers(&r);
    check_diagnosis(&r);
    check_overlap_note(&r);
    check_kernels(&r);
    check_trace(&r, trace);
    if (!gpu) check_stream_lanes(&r, test_tmpdir(dir));
    CHECK(r.product_flops > 0);
    double flops = r.product_flops;
    profile_report_free(&r);
    return flops;
}

int main(void) {
    check_device("cpu");
    if (test_have_gpu()) check_graph(check_device("cuda"));
    check_bad_steps();
    check_window_choice();
    return test_finish("test_profile");
}
