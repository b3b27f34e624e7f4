/* trainc profile --html (profile.h): one self-contained page of a filled
 * ProfileReport. Inline SVG with a <title> on each box for its name and
 * figures; no script, and a Content-Security-Policy that lets the page fetch
 * nothing, so a stray reference fails loudly in a browser. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/files.h"
#include "runtime/json_out.h"
#include "runtime/version.h"
#include "tools/trainer/profile.h"

#define SVG_W 1100
#define LANE_H 18
#define LABEL_W 170

/* text, escaped for HTML's text and attributes */
static void esc(FILE *f, const char *text) {
    for (const char *c = text; *c; c++) {
        switch (*c) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*c, f);
        }
    }
}

/* A box with its name and figures as a tooltip. */
static void svg_box(FILE *f, double x, double y, double w, double h, const char *fill, const char *title) {
    fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>", x, y, fmax(w, 0.5),
            h, fill);
    esc(f, title);
    fputs("</title></rect>\n", f);
}

static void svg_text(FILE *f, double x, double y, const char *anchor, const char *text) {
    fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"%s\">", x, y, anchor);
    esc(f, text);
    fputs("</text>\n", f);
}

/* A kernel's long name to something readable: no "void ", no template or
 * argument list; a name of cuDNN's or CUTLASS's (tokens joined by '_') to its
 * first four tokens, its family, and its tile ("tilesize128x128x64" or
 * "128x128_32x3"); at most 63 characters. */
static void short_name(const char *name, char *out, size_t len) {
    if (strncmp(name, "void ", 5) == 0) name += 5;
    char base[256];
    snprintf(base, sizeof base, "%.*s", (int)strcspn(name, "(<"), name);
    if (strlen(base) <= 48 || !strchr(base, '_')) {
        snprintf(out, len, "%.48s", base);
        return;
    }
    const char *tile = strstr(base, "tilesize");
    if (tile) tile += strlen("tilesize");
    for (const char *c = base; !tile && *c; c++) /* a token "AxB": digits, 'x', digits */
        if ((c == base || c[-1] == '_') && c[0] >= '0' && c[0] <= '9' && strchr(c, 'x') &&
            strspn(c, "0123456789") == (size_t)(strchr(c, 'x') - c))
            tile = c;
    int family = 0, tokens = 0;
    while (base[family] && tokens < 4) tokens += base[family++] == '_';
    if (tokens == 4) family--;
    if (tile) snprintf(out, len, "%.*s tile %.*s", family, base, (int)strcspn(tile, "_"), tile);
    else snprintf(out, len, "%.*s", family, base);
}

/* ---- the timeline ------------------------------------------------------------- */

#define MAX_LANES 128
/* Streams drawn a lane each: the compute stream and the busiest others in the window. The rest (a library's
 * own, such as nvJPEG's decoder's, a few dozen under data.decode = gpu) share one lane, "other streams". */
#define STREAM_ROWS 8

typedef struct {
    int pid, tid;
    char name[64];
    double busy_us;       /* its boxes' time in the window */
    int row;              /* where it is drawn */
} Lane;

/* The lane of (pid, tid), or -1 past MAX_LANES (drawn with the other streams). */
static int lane_of(Lane *lanes, int *n, int pid, int tid) {
    for (int i = 0; i < *n; i++)
        if (lanes[i].pid == pid && lanes[i].tid == tid) return i;
    if (*n == MAX_LANES) return -1;
    lanes[*n] = (Lane){pid, tid, "", 0, 0};
    snprintf(lanes[*n].name, sizeof lanes[*n].name, "track %d", tid);
    return (*n)++;
}

static int is_stream(const Lane *l) { return !strncmp(l->name, "stream ", 7); }

static int stream_rank(const void *a, const void *b) {
    const Lane *x = *(const Lane *const *)a, *y = *(const Lane *const *)b;
    int cx = strstr(x->name, "(compute)") != NULL, cy = strstr(y->name, "(compute)") != NULL;
    if (cx != cy) return cy - cx;
    return (x->busy_us < y->busy_us) - (x->busy_us > y->busy_us);
}

/* Each lane's row, in the order the lanes came, up to STREAM_ROWS streams a row of their own; returns the rows
 * of their own, the other streams' (*others of them) all on the row after those. */
static int assign_rows(Lane *lanes, int n, int *others) {
    const Lane *streams[MAX_LANES];
    int n_streams = 0, rows = 0;
    for (int i = 0; i < n; i++)
        if (is_stream(&lanes[i])) streams[n_streams++] = &lanes[i];
    qsort(streams, (size_t)n_streams, sizeof *streams, stream_rank);
    *others = 0;
    for (int i = 0; i < n; i++) {
        int own = !is_stream(&lanes[i]) || n_streams <= STREAM_ROWS;
        for (int k = 0; !own && k < STREAM_ROWS; k++) own = streams[k] == &lanes[i];
        lanes[i].row = own ? rows++ : -1;
        *others += !own;
    }
    for (int i = 0; i < n; i++)
        if (lanes[i].row < 0) lanes[i].row = rows;
    return rows;
}

static double num(const cJSON *e, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *str(const cJSON *e, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The first one or two steps of the window, as the host ran them and (GPU) as the compute stream did: [t0, t1)
 * in us. */
static void timeline_window(const cJSON *events, double *t0, double *t1) {
    int host_steps = 0, gpu_steps = 0;
    *t0 = INFINITY, *t1 = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        int host = !strcmp(str(e, "cat"), "step"), gpu = !strcmp(str(e, "cat"), "gpu_step");
        if ((!host || host_steps == 2) && (!gpu || gpu_steps == 2)) continue;
        host_steps += host, gpu_steps += gpu;
        *t0 = fmin(*t0, num(e, "ts"));
        *t1 = fmax(*t1, num(e, "ts") + num(e, "dur"));
    }
    if (!host_steps && !gpu_steps) *t0 = 0;
}

static const char *lane_colour(const char *cat) {
    if (!strcmp(cat, "step") || !strcmp(cat, "gpu_step")) return "#9aa5b1";
    if (!strcmp(cat, "phase")) return "#7fb3d5";
    if (!strcmp(cat, "op")) return "#82c99a";
    if (strstr(cat, "memcpy") || strstr(cat, "copy")) return "#f5b041";
    if (strstr(cat, "memset")) return "#c39bd3";
    if (strstr(cat, "api")) return "#d98880";
    return "#5d8aa8";
}

static void print_timeline(const ProfileReport *r, FILE *f) {
    fputs("<section id=\"timeline\"><h2>Timeline</h2>\n", f);
    const cJSON *events = r->timeline, *e;
    double t0, t1;
    timeline_window(events, &t0, &t1);
    Lane lanes[MAX_LANES];
    int n = 0, overflow = 0;
    cJSON_ArrayForEach(e, events) {
        int i = lane_of(lanes, &n, (int)num(e, "pid"), (int)num(e, "tid"));
        overflow |= i < 0;
        if (i >= 0 && !strcmp(str(e, "ph"), "M") && !strcmp(str(e, "name"), "thread_name"))
            snprintf(lanes[i].name, sizeof lanes[i].name, "%s",
                     str(cJSON_GetObjectItemCaseSensitive(e, "args"), "name"));
        if (i >= 0 && !strcmp(str(e, "ph"), "X"))
            lanes[i].busy_us += fmax(0, fmin(num(e, "ts") + num(e, "dur"), t1) - fmax(num(e, "ts"), t0));
    }
    int others, own_rows = assign_rows(lanes, n, &others);
    int shared_row = others || overflow ? own_rows : -1, rows = own_rows + (shared_row >= 0);
    double span = t1 > t0 ? t1 - t0 : 1, scale = (SVG_W - LABEL_W - 10) / span;
    fprintf(f, "<p>The window's first %s: %.3f ms; a lane per track (up to %d streams: the compute stream and "
            "the busiest, the rest in one lane), gaps are time with nothing on it. Hover a box for its name and "
            "duration.</p>\n", "steps", span / 1000, STREAM_ROWS);
    fprintf(f, "<svg class=\"timeline\" width=\"%d\" height=\"%d\">\n", SVG_W, rows * LANE_H + 24);
    for (int i = 0; i < n; i++)
        if (lanes[i].row != shared_row) svg_text(f, 2, lanes[i].row * LANE_H + 13, "start", lanes[i].name);
    if (shared_row >= 0) {
        char label[64];
        snprintf(label, sizeof label, overflow ? "other streams and tracks" : "other streams (%d)", others);
        svg_text(f, 2, shared_row * LANE_H + 13, "start", label);
    }
    cJSON_ArrayForEach(e, events) {
        if (strcmp(str(e, "ph"), "X") != 0) continue;
        double ts = num(e, "ts"), dur = num(e, "dur");
        if (ts + dur < t0 || ts > t1) continue;
        int i = lane_of(lanes, &n, (int)num(e, "pid"), (int)num(e, "tid")), row = i >= 0 ? lanes[i].row : shared_row;
        int shared = row == shared_row;
        char name[64], title[700];
        short_name(str(e, "name"), name, sizeof name);
        snprintf(title, sizeof title, "%s%s%s: %.2f us%s%s", shared && i >= 0 ? lanes[i].name : "",
                 shared && i >= 0 ? ": " : "", name, dur, strcmp(name, str(e, "name")) ? "\n" : "",
                 strcmp(name, str(e, "name")) ? str(e, "name") : "");
        double x0 = LABEL_W + (fmax(ts, t0) - t0) * scale, x1 = LABEL_W + (fmin(ts + dur, t1) - t0) * scale;
        svg_box(f, x0, row * LANE_H + 2, x1 - x0, LANE_H - 4, lane_colour(str(e, "cat")), title);
    }
    char axis[48];
    snprintf(axis, sizeof axis, "%.3f ms", span / 1000);
    svg_text(f, SVG_W - 10, rows * LANE_H + 16, "end", axis);
    svg_text(f, LABEL_W, rows * LANE_H + 16, "start", "0");
    fputs("</svg>\n", f);
    if (!r->kernels.available)
        fprintf(f, "<p class=\"na\">Kernels, copies and memsets by stream: %s.</p>\n",
                r->gpu ? "not measured (CUPTI not available)" : "not measured on the CPU");
    fputs("</section>\n", f);
}

/* ---- per layer and the roofline --------------------------------------------------- */

static void print_layers(const ProfileReport *r, FILE *f) {
    fputs("<section id=\"layers\"><h2>Per layer</h2>\n", f);
    if (r->graph || !r->n_layers) {
        fputs("<p class=\"na\">Not timed (--graph: no op is timed inside a replayed graph).</p></section>\n", f);
        return;
    }
    double most = 1e-12;
    for (int i = 0; i < r->n_layers; i++) most = fmax(most, r->layers[i].forward_ms + r->layers[i].backward_ms);
    double bar_w = 560 / most;
    fprintf(f, "<svg class=\"layers\" width=\"%d\" height=\"%d\">\n", SVG_W,
            r->n_layers * LANE_H + 4);
    for (int i = 0; i < r->n_layers; i++) {
        const ProfileLayer *l = &r->layers[i];
        ProfileRoofline roof = profile_roofline(r, l);
        double y = i * LANE_H, ms = l->forward_ms + l->backward_ms;
        char title[160], note[96];
        svg_text(f, 2, y + 13, "start", l->name);
        snprintf(title, sizeof title, "%s forward: %.4f ms", l->name, l->forward_ms);
        svg_box(f, LABEL_W, y + 2, l->forward_ms * bar_w, LANE_H - 4, "#5d8aa8", title);
        snprintf(title, sizeof title, "%s backward: %.4f ms", l->name, l->backward_ms);
        svg_box(f, LABEL_W + l->forward_ms * bar_w, y + 2, l->backward_ms * bar_w, LANE_H - 4, "#e59866", title);
        snprintf(note, sizeof note, "%.4f ms, %.1f%% of the layers, %s-bound, %.1f%% of roof", ms,
                 100 * ms / fmax(r->layers_ms, 1e-12), roof.compute_bound ? "compute" : "memory",
                 100 * roof.roof_share);
        svg_text(f, LABEL_W + 570, y + 13, "start", note);
    }
    fputs("</svg>\n<p>Blue: forward, orange: backward, per step.</p></section>\n", f);
}

/* log10 axes: intensity 1e-2..1e4 FLOP/byte, rate 1e6..1e16 FLOP/s */
static double roof_x(double intensity) { return 60 + (log10(fmax(intensity, 1e-2)) + 2) / 6 * 600; }
static double roof_y(double rate) { return 320 - (log10(fmax(rate, 1e6)) - 6) / 10 * 300; }

static void print_roofline(const ProfileReport *r, FILE *f) {
    fputs("<section id=\"roofline\"><h2>Roofline</h2>\n", f);
    ProfileLayer probe = {.forward_flops = 1e12, .forward_bytes = 1, .forward_ms = 1};
    double peak = profile_roofline(r, &probe).attainable; /* the compute roof: intensity far past the ridge */
    probe.forward_bytes = 1e12;
    double bw = profile_roofline(r, &probe).attainable;    /* intensity 1: the bandwidth roof's rate */
    fprintf(f, "<p>Roofs: %.4g TFLOP/s compute, %.4g GB/s memory (%s). Each layer is a point at its FLOPs per "
            "byte and achieved FLOP/s.</p>\n", peak / 1e12, bw / 1e9, r->peaks.bytes_per_s > 0 ? "measured" :
            "nominal");
    fputs("<svg class=\"roofline\" width=\"700\" height=\"350\">\n", f);
    fputs("<rect x=\"60\" y=\"20\" width=\"600\" height=\"300\" fill=\"none\" stroke=\"#888\"/>\n", f);
    double ridge = peak / bw;
    fprintf(f, "<polyline class=\"roof\" fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2\" points=\"%.2f,%.2f "
            "%.2f,%.2f %.2f,%.2f\"><title>roofs</title></polyline>\n", roof_x(1e-2), roof_y(1e-2 * bw),
            roof_x(ridge), roof_y(peak), roof_x(1e4), roof_y(peak));
    for (int i = 0; i < r->n_layers && !r->graph; i++) {
        ProfileRoofline p = profile_roofline(r, &r->layers[i]);
        if (p.intensity <= 0 || p.achieved <= 0) continue;
        char title[160];
        snprintf(title, sizeof title, "%s: %.3g FLOP/byte, %.4g GFLOP/s, %.1f%% of roof", r->layers[i].name,
                 p.intensity, p.achieved / 1e9, 100 * p.roof_share);
        fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"#2874a6\"><title>", roof_x(p.intensity),
                roof_y(p.achieved));
        esc(f, title);
        fputs("</title></circle>\n", f);
    }
    svg_text(f, 360, 345, "middle", "FLOPs per byte (log, 0.01 to 10^4)");
    svg_text(f, 10, 15, "start", "FLOP/s (log, 10^6 to 10^16)");
    fputs("</svg></section>\n", f);
}

/* ---- over the run, the findings, what was measured ----------------------------------- */

/* A horizontal bar of share in [0, 1], or "not measured" */
static void share_bar(FILE *f, int row, const char *what, double share, const char *figure) {
    double y = row * 22;
    svg_text(f, 2, y + 14, "start", what);
    svg_box(f, 200, y + 3, 400, 14, "#eee", what);
    if (share >= 0) svg_box(f, 200, y + 3, 400 * fmin(share, 1), 14, "#5d8aa8", figure);
    svg_text(f, 610, y + 14, "start", figure);
}

/* The NVML samples of run.metrics_file ({"gpu_sample": T, "util": .., ...} lines), at most MAX_SAMPLES. */
#define MAX_SAMPLES 4096
enum { SAMPLE_UTIL, SAMPLE_MEM, SAMPLE_POWER, SAMPLE_CLOCK, SAMPLE_TEMP, SAMPLE_KINDS };
static const char *const sample_keys[SAMPLE_KINDS] = {"util", "mem_bytes", "power_w", "sm_mhz", "temp_c"};
static const char *const sample_names[SAMPLE_KINDS] = {"utilisation %", "memory MiB", "power W", "SM clock MHz",
                                                       "temperature C"};

static int read_samples(const char *path, double *t, double (*v)[SAMPLE_KINDS]) {
    FILE *f = path[0] ? fopen(path, "r") : NULL;
    if (!f) return 0;
    char line[1024];
    int n = 0;
    while (n < MAX_SAMPLES && fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"gpu_sample\"")) continue;
        cJSON *o = cJSON_Parse(line);
        if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "gpu_sample"))) {
            t[n] = num(o, "gpu_sample");
            for (int k = 0; k < SAMPLE_KINDS; k++) {
                const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, sample_keys[k]);
                v[n][k] = cJSON_IsNumber(x) ? x->valuedouble / (k == SAMPLE_MEM ? 1048576.0 : 1) : -1;
            }
            n++;
        }
        cJSON_Delete(o);
    }
    fclose(f);
    return n;
}

/* A graph per reading over the run's time. */
static void print_samples(const ProfileReport *r, FILE *f) {
    static double t[MAX_SAMPLES], v[MAX_SAMPLES][SAMPLE_KINDS];
    int n = read_samples(r->settings.metrics_file, t, v);
    if (n < 2) {
        fprintf(f, "<p class=\"na\">NVML's samples over time: %s.</p>\n", !r->gpu ? "not measured on the CPU" :
                "none (set run.metrics_file and monitor.sample_every_s to graph them)");
        return;
    }
    double span = fmax(t[n - 1] - t[0], 1e-9);
    for (int k = 0; k < SAMPLE_KINDS; k++) {
        double top = 1e-9;
        for (int i = 0; i < n; i++) top = fmax(top, v[i][k]);
        char label[96];
        snprintf(label, sizeof label, "%s (0 to %.4g) over %.1f s", sample_names[k], top, span);
        fprintf(f, "<svg class=\"samples\" width=\"540\" height=\"110\"><rect x=\"40\" y=\"16\" width=\"480\" "
                "height=\"80\" fill=\"none\" stroke=\"#888\"/>\n");
        svg_text(f, 40, 12, "start", label);
        fputs("<polyline fill=\"none\" stroke=\"#2874a6\" points=\"", f);
        for (int i = 0; i < n; i++)
            if (v[i][k] >= 0) fprintf(f, "%.1f,%.1f ", 40 + 480 * (t[i] - t[0]) / span, 96 - 80 * v[i][k] / top);
        fprintf(f, "\"><title>%s</title></polyline></svg>\n", sample_names[k]);
    }
}

static void print_run(const ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    fputs("<section id=\"run\"><h2>Over the run</h2>\n", f);
    fputs("<svg class=\"run\" width=\"900\" height=\"92\">\n", f);
    char figure[96];
    double wait = s->step_ms > 0 ? s->phase_data_wait_ms / s->step_ms : 0;
    snprintf(figure, sizeof figure, "%.1f%% of the step (%.4f ms)", 100 * wait, s->phase_data_wait_ms);
    share_bar(f, 0, "data wait", wait, figure);
    if (!r->gpu) {
        share_bar(f, 1, "GPU utilisation", -1, "not measured on the CPU");
        share_bar(f, 2, "GPU power", -1, "not measured on the CPU");
        share_bar(f, 3, "GPU memory", -1, "not measured on the CPU");
    } else {
        double active = r->kernels.available ? r->kernels.active_ms / s->step_ms : s->gpu_util / 100;
        snprintf(figure, sizeof figure, active >= 0 ? "%.1f%%" : "not measured", 100 * active);
        share_bar(f, 1, r->kernels.available ? "kernels active" : "GPU utilisation (NVML)", active, figure);
        double power = s->power_w >= 0 && s->power_limit_w > 0 ? s->power_w / s->power_limit_w : -1;
        snprintf(figure, sizeof figure, power >= 0 ? "%.0f W of %.0f W" : "not measured", s->power_w,
                 s->power_limit_w);
        share_bar(f, 2, "GPU power", power, figure);
        snprintf(figure, sizeof figure, "%.1f MiB (the arenas' peak)", s->peak_mem_bytes / 1048576.0);
        share_bar(f, 3, "GPU memory", -1, figure);
    }
    fputs("</svg>\n<p class=\"na\">The bars: means over the profiled window. The graphs: the monitor's NVML samples "
          "over the whole run.</p>\n", f);
    print_samples(r, f);
    fputs("</section>\n", f);
}

static void print_findings(const ProfileReport *r, FILE *f) {
    fputs("<section id=\"findings\"><h2>Diagnosis</h2>\n<ol>\n", f);
    ProfileFinding fs[PROFILE_MAX_FINDINGS];
    int n = profile_findings(r, fs, PROFILE_MAX_FINDINGS);
    for (int i = 0; i < n; i++) {
        fprintf(f, "<li class=\"finding\"><b>");
        esc(f, fs[i].what);
        fprintf(f, "</b>: %.4f ms a step, %.1f%% of it, gain %.4f ms; switches: ", fs[i].ms, 100 * fs[i].share,
                fs[i].gain_ms);
        esc(f, fs[i].switches);
        fputs("<br><small>from: ", f);
        esc(f, fs[i].from);
        fputs("</small></li>\n", f);
    }
    fputs("</ol>\n", f);
    if (!n) fprintf(f, "<p>No bottleneck over %.0f%% of the step.</p>\n", 100 * PROFILE_FINDING_MIN_SHARE);
    fputs("</section>\n", f);
}

static void print_measured(const ProfileReport *r, FILE *f) {
    const ProfileSettings *s = &r->settings;
    fputs("<section id=\"measured\"><h2>What was measured</h2>\n<p>Device: ", f);
    esc(f, r->peaks.device[0] ? r->peaks.device : (r->gpu ? "GPU" : "CPU"));
    fputs("; commit ", f);
    esc(f, trainc_git_commit());
    fprintf(f, "; steps %ld..%ld.</p>\n", r->first, r->last);
    if (r->window_note[0]) {
        fputs("<p>Window: ", f);
        esc(f, r->window_note);
        fputs(".</p>\n", f);
    }
    fprintf(f, "<p>Switches: batch %d, data.workers %d, data.prefetch %d, model.fuse %d, "
            "model.nhwc %d, amp %d, tf32 %d, perf.conv_benchmark %d, perf.cuda_graph %d, perf.overlap_wgrad %d."
            "</p>\n<pre>", s->batch, s->workers, s->prefetch, s->fuse, s->nhwc, s->amp, s->tf32,
            s->conv_benchmark, s->cuda_graph, s->overlap_wgrad);
    char *versions = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&versions, &len);
    if (!m) TC_FATAL("out of host memory writing the HTML report");
    trainc_print_version(m); /* the driver, CUDA and cuDNN this trainc finds */
    fclose(m);
    esc(f, versions);
    free(versions);
    fputs("</pre></section>\n", f);
}

void profile_html_write(ProfileReport *r, const char *path) {
    char err[4400] = "cannot write it";
    FILE *f = files_open_output(path, 0, err, sizeof err);
    if (!f) TC_USER_ERROR("--html %s: %s", path, err);
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta http-equiv=\"Content-Security-"
          "Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\n<title>trainc "
          "profile</title>\n<style>body{font:13px sans-serif;margin:16px;background:#fff;color:#222}"
          "svg text{font:11px sans-serif}h2{border-bottom:1px solid #ccc}.na{color:#777}</style></head><body>\n", f);
    fprintf(f, "<h1>trainc profile: %.4f ms a step on the %s</h1>\n", r->summary.step_ms, r->gpu ? "GPU" : "CPU");
    print_timeline(r, f);
    print_layers(r, f);
    print_roofline(r, f);
    print_run(r, f);
    print_findings(r, f);
    print_measured(r, f);
    fputs("</body></html>\n", f);
    if (ferror(f) | (fclose(f) != 0)) TC_USER_ERROR("--html %s: cannot write it: %s", path, strerror(errno));
}
