/* Net files (models/netfile.h): each shipped net against the figures of the C
 * builder it was written from (the same layers with their kinds, shapes and
 * arguments, blocks, parameter layout, tensor names, and params_crc after
 * model_finalize from the same seed); the nets no builder had against PyTorch's
 * parameter counts, and a few CPU steps of each; a net with adds by name and
 * repeats; and every error of the reader with its file:line text. CPU only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/model.h"
#include "tests/model_checks.h"
#include "models/netfile.h"
#include "models/tensors.h"
#include "models/zoo.h"
#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "runtime/files.h"
#include "tests/harness.h"
#include "tools/trainer/export.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/settings.h"
#include "tools/trainer/summary.h"
#include "tools/trainer/train.h"

static Model *new_model(void) {
    Model *m = calloc(1, sizeof *m);
    if (!m) abort();
    return m;
}

static uint32_t params_crc(const Model *m) { return ckpt_crc32(0, m->params, m->n_params * sizeof(float)); }

/* The tensors' names and sizes in order, "name count\n" each. */
static uint32_t names_crc(const Model *m) {
    enum { MAX = 512 };
    static ModelTensor ts[MAX];
    char err[256], line[96];
    int n = model_tensors(m, ts, MAX, err, sizeof err);
    CHECK_MSG(n > 0 && n <= MAX, "%d tensors: %s", n, n < 0 ? err : "");
    uint32_t crc = 0;
    for (int i = 0; i < n && i < MAX; i++) {
        int len = snprintf(line, sizeof line, "%s %zu\n", ts[i].name, ts[i].count);
        crc = ckpt_crc32(crc, line, (size_t)len);
    }
    return crc;
}

/* What describes each layer (kind, inputs, output, block, parameter offsets and counts, fan-in, the conv's,
 * pool's and linear's shapes, scale, statistics' offset, whitening, Dirac, module name) and each activation
 * (its shape, real channels, the storage it shares, the block it is internal to), as integers. */
static uint32_t layout_crc(const Model *m) {
    uint32_t crc = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const Conv2dShape *c = &l->conv.shape;
        const Pool2dShape *p = &l->pool.shape;
        uint32_t scale_bits;
        memcpy(&scale_bits, &l->scale, sizeof scale_bits);
        long long v[] = {l->kind, l->in, l->out, l->in2, l->block, (long long)l->w_off, (long long)l->b_off,
                         (long long)l->w_count, (long long)l->b_count, (long long)l->fan_in, c->n, c->c, c->h,
                         c->w, c->k, c->r, c->s, c->pad, c->stride, c->groups, p->n, p->c, p->h, p->w, p->k,
                         p->stride, p->pad, l->linear.n, l->linear.in, l->linear.out, scale_bits,
                         (long long)l->stat_off, l->whitening, l->dirac};
        crc = ckpt_crc32(crc, v, sizeof v);
        crc = ckpt_crc32(crc, l->module, strlen(l->module) + 1);
    }
    for (int a = 0; a < m->n_acts; a++) {
        const Activation *x = &m->acts[a];
        int v[] = {x->c, x->h, x->w, x->c_real, x->shares_with, x->internal_to};
        crc = ckpt_crc32(crc, v, sizeof v);
    }
    return crc;
}

/* Each shipped net as its C builder (models/simplenet.c, resnet.c and airbench.c, gone since) gave it, and
 * the nets no builder had as their files first gave them: layers, activations, checkpoint blocks, parameters
 * (model_param_count: under NHWC the input's channels padded to 8), names_crc and layout_crc above, and
 * params_crc after model_finalize from seed 1234 (NCHW, the CPU's layout; 0: not finalized). */
typedef struct {
    const char *name;
    int image, nhwc, batch;
    int n_layers, n_acts, n_blocks;
    size_t params;
    uint32_t names_crc, layout_crc, params_crc;
} ShippedFigures;

static const ShippedFigures shipped[] = {
    {"simplenet", 32, 0, 2, 12, 13, 3, 2473610, 0xcf2f1ffd, 0xcdab7996, 0x3dab2afc},
    {"simplenet", 64, 1, 2, 12, 13, 3, 8767946, 0x0ce5897f, 0x5af6d112, 0},
    {"airbench", 32, 0, 2, 26, 27, 0, 1972792, 0x86a3e378, 0xc18d41e2, 0x8c4299c1},
    {"airbench", 32, 1, 2, 26, 27, 0, 1973272, 0x86a3e378, 0xf15c21bf, 0},
    {"resnet18", 32, 0, 2, 67, 68, 8, 11173962, 0xad7eb4a4, 0xed2895f5, 0x94e7df0b},
    {"resnet18", 128, 1, 1, 68, 69, 8, 11197322, 0x0ec40b15, 0x663bbc36, 0},
    {"resnet34", 32, 0, 1, 123, 124, 16, 21282122, 0xf28ba617, 0xef378486, 0x3b03266b},
    {"resnet50", 32, 1, 1, 173, 174, 16, 23523722, 0xb2b081b0, 0xe62c7728, 0},
    {"resnet50", 224, 0, 1, 174, 175, 16, 23528522, 0x9d71c293, 0x6c8fa9c0, 0x6d47473e},
    {"vgg", 32, 0, 2, 45, 46, 13, 14724042, 0x88b620ba, 0x7402da7b, 0x00da245c},
    {"vgg", 64, 1, 1, 45, 46, 13, 14726922, 0x88b620ba, 0x7cb24e2f, 0},
    {"mobilenetv2", 32, 0, 2, 151, 152, 17, 2236682, 0x0f08a11e, 0xba91e3d0, 0x7b144f99},
    {"mobilenetv2", 16, 1, 1, 151, 152, 17, 2238122, 0x0f08a11e, 0x1b9c071f, 0},
};

static void check_shipped(const ShippedFigures *f) {
    char what[64], err[512];
    snprintf(what, sizeof what, "%s at %d%s", f->name, f->image, f->nhwc ? " nhwc" : "");
    Model *m = new_model();
    int rc = model_build(m, f->name, f->batch, f->image, 10, f->nhwc, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", what, err);
    if (rc != 0) return free(m);
    CHECK_MSG(m->n_layers == f->n_layers && m->n_acts == f->n_acts && m->n_blocks == f->n_blocks,
              "%s: %d layers, %d activations, %d blocks; the builder's %d, %d, %d", what, m->n_layers, m->n_acts,
              m->n_blocks, f->n_layers, f->n_acts, f->n_blocks);
    CHECK_MSG(model_param_count(m) == f->params, "%s: %zu parameters, the builder's %zu", what,
              model_param_count(m), f->params);
    CHECK_MSG(names_crc(m) == f->names_crc, "%s: names_crc %08x, the builder's %08x", what, names_crc(m),
              f->names_crc);
    CHECK_MSG(layout_crc(m) == f->layout_crc, "%s: layout_crc %08x, the builder's %08x", what, layout_crc(m),
              f->layout_crc);
    if (f->params_crc) {
        model_finalize(m, NULL, 1234);
        CHECK_MSG(params_crc(m) == f->params_crc, "%s: params_crc %08x, the builder's %08x", what, params_crc(m),
                  f->params_crc);
        model_destroy(m);
    }
    free(m);
}

/* A shipped net no C builder had: its parameter count at 32 px against PyTorch's (torchvision's layers,
 * counted by hand in the comments at its check), its NHWC build, and a few CPU steps at a small image that
 * fit one batch. */
static void check_new_net(const char *name, size_t torch_params, int image, int steps, float lr, uint64_t *rng) {
    char err[512];
    Model *m = new_model();
    CHECK_MSG(model_build(m, name, 2, 32, 10, 1, err, sizeof err) == 0, "%s nhwc: %s", name, err);
    free(m);
    m = new_model();
    int rc = model_build(m, name, 2, 32, 10, 0, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", name, err);
    if (rc != 0) return free(m);
    CHECK_MSG(model_param_count(m) == torch_params, "%s: %zu parameters, PyTorch's %zu", name, model_param_count(m),
              torch_params);
    free(m);
    m = new_model();
    rc = model_build(m, name, 4, image, 10, 0, err, sizeof err);
    CHECK_MSG(rc == 0, "%s at %d: %s", name, image, err);
    if (rc != 0) return free(m);
    model_finalize(m, NULL, 99);
    char what[64];
    snprintf(what, sizeof what, "%s at %d px", name, image);
    check_fits_batch(m, what, steps, lr, rng);
    model_destroy(m);
    free(m);
}

/* Builds text as the file "t.net" (16x16 images, 10 classes); returns its error ("" when it built). */
static const char *build_text(Model *m, const char *text) {
    static char err[1024];
    NetShape shape = {2, 16, 10, 0};
    err[0] = '\0';
    if (netfile_build(m, "t.net", text, &shape, err, sizeof err) == 0) err[0] = '\0';
    else if (!err[0]) snprintf(err, sizeof err, "(failed without a message)");
    return err;
}

static void expect_error(const char *text, const char *expected) {
    Model *m = new_model();
    const char *err = build_text(m, text);
    CHECK_MSG(strstr(err, expected) == err, "\n%s\ngave  '%s'\nnot   '%s...'", text, err, expected);
    free(m);
}

#define HEAD "[net]\n"
#define TAIL "global_avgpool\nfc = linear {classes}\n"

static void check_errors(void) {
    expect_error(HEAD "c1 = cnv 8 3\n" TAIL, "t.net:2: layer c1: unknown kind 'cnv' (kinds: conv, linear,");
    expect_error(HEAD "c1 = conv 8 3 strid=2\n" TAIL,
                 "t.net:2: layer c1: conv has no argument 'strid' (it takes: out, k, stride, pad, groups, bias, "
                 "dirac, whiten)");
    expect_error(HEAD "c1 = conv 8 3\nc2 = conv 8 3 stride=2\nj = concat c1\n" TAIL,
                 "t.net:4: layer j: concat of 8x8x8 and 8x16x16 (channels x height x width): the height and width "
                 "differ");
    expect_error(HEAD "c1 = conv 6 3 groups=4\n" TAIL, "t.net:2: layer c1: a convolution of 3 input channels to 6 "
                 "in 4 groups");
    expect_error(HEAD "c1 = conv 8 3\nd = dropout 1.5\n" TAIL, "t.net:3: layer d: dropout p = 1.5, not in [0, 1)");
    {   /* every kind the other layers' issue added: a depthwise-separable block with a concat */
        Model *m = new_model();
        const char *err = build_text(m, "[net]\nstem = conv 8 3 bias=no\nbatchnorm\nsilu\n"
                                        "dw = conv 8 3 groups=depthwise bias=no\npw = conv 16 1\nsilu\n"
                                        "j = concat stem\ndropout 0.1\navgpool 3 stride=2 pad=1\nflatten\n"
                                        "fc = linear {classes}\n");
        CHECK_MSG(err[0] == '\0', "the net of new kinds: %s", err);
        int dw = -1;
        for (int i = 0; i < m->n_layers; i++)
            if (!strcmp(m->layers[i].module, "dw")) dw = i;
        CHECK(dw >= 0 && m->layers[dw].conv.shape.groups == 8 && m->layers[dw].w_count == 8 * 9);
        CHECK(m->n_layers > 0 && m->acts[m->layers[m->n_layers - 2].out].c == 24 * 8 * 8);
        free(m);
    }
    expect_error(HEAD "c1 = conv 8 three\n" TAIL, "t.net:2: layer c1: k = 'three' is not an integer");
    expect_error(HEAD "c1 = conv 8 3 bias=maybe\n" TAIL, "t.net:2: layer c1: bias = 'maybe' is not yes or no");
    expect_error(HEAD "c1 = conv 8\n" TAIL, "t.net:2: layer c1: conv needs its argument 'k'");
    expect_error(HEAD "relu 4\n" TAIL, "t.net:2: unnamed relu: relu takes 0 positional arguments (none), and '4' "
                 "is one more");
    expect_error(HEAD "c1 = conv 0 3\n" TAIL, "t.net:2: layer c1: a convolution of 0 channels, kernel 3");
    expect_error(HEAD "c1 = conv 8 33 pad=0\n" TAIL,
                 "t.net:2: layer c1: a 33x33 convolution (pad 0) does not fit a 16x16 input");
    expect_error(HEAD "c1 = conv 8 3 stride=2\nadd input\n" TAIL,
                 "t.net:3: unnamed add: add of 8x8x8 and 3x16x16 (channels x height x width): the shapes differ");
    expect_error(HEAD "c1 = conv 8 3\nadd c2\nc2 = conv 8 3\n" TAIL,
                 "t.net:3: unnamed add: c2 is read before it is defined (line 4)");
    expect_error(HEAD "c1 = conv 8 3\nadd nowhere\n" TAIL, "t.net:3: unnamed add: no layer before this one is named "
                 "nowhere");
    expect_error(HEAD "c1 = conv 8 3\nc1 = conv 8 3\n" TAIL, "t.net:3: layer c1: the name c1 is taken (line 2)");
    expect_error(HEAD "c1 = conv {width} 3\n" TAIL, "t.net:2: layer c1: unknown variable {width}");
    expect_error(HEAD "c1 = conv 8 3 whiten=yes\nc2 = conv 8 3 whiten=yes\n" TAIL,
                 "t.net:3: layer c2: a whitening layer is an ungrouped convolution over the input image");
    expect_error(HEAD "c1 = conv 8 2 dirac=yes\n" TAIL,
                 "t.net:2: layer c1: a Dirac start needs an ungrouped convolution with an odd square kernel");
    expect_error(HEAD "c1 = conv 8 3\nrelu\nc2 = conv 8 3 from=c1\n" TAIL,
                 "t.net:3: unnamed relu: a ReLU works in place, so its input may feed no other layer, and line 4's");
    expect_error(HEAD "fc = linear 0\n", "t.net:2: layer fc: a linear layer of 0 outputs");
    expect_error(HEAD "c1 = conv 8 3\n", "t.net:2: the net ends in 8x16x16, not in {classes} = 10 logits");
    expect_error("[block b]\nc = conv 8 3 stride=4\nadd input\n" HEAD "x = b\n" TAIL,
                 "t.net:3: unnamed add (block b, used at t.net:5): add of 8x4x4 and 3x16x16");
    expect_error("[block b]\nparams = w\nc = conv {w} 3\n" HEAD "x = b w=8 v=2\n" TAIL,
                 "t.net:5: layer x: block b has no argument 'v' (it takes: w)");
    expect_error("[block b]\nc = conv 8 3\n" HEAD "b\nrepeat 2 b\n" TAIL,
                 "t.net:5: unnamed repeat: a repeat needs a name");
    expect_error("[block b]\ncheckpoint = yes\nc = conv 8 3\n[block a]\ncheckpoint = yes\nb\n" HEAD "x = a\n" TAIL,
                 "t.net:6: unnamed b (block a, used at t.net:8): block b is a checkpoint block inside another one");
    expect_error("[block b]\nb\n" HEAD "x = b\n" TAIL, "t.net:2: unnamed b (block b, used at t.net:2): blocks nested");
    expect_error(HEAD "c1 = conv 8 3 if 3 ~ 4\n" TAIL, "t.net:2: layer c1: expected 'if A OP B'");
    expect_error("[net\n", "t.net:1: unterminated section header '[net' (no ']')");
    expect_error("[nett]\n", "t.net:1: unknown section [nett] (sections: [net], [vars], [block NAME])");
    expect_error("c = conv 8 3\n", "t.net:1: a line outside any section (start with [net])");
    expect_error("[vars]\nw = 8\n", "t.net:2: no [net] section");
    expect_error("[block conv]\n" HEAD TAIL, "t.net:1: block conv: the name is taken by a layer kind");
    expect_error(HEAD TAIL HEAD, "t.net:4: a second [net] section (the first is at line 1)");
    expect_error("[vars]\nw = 8\nw = 9\n" HEAD TAIL, "t.net:3: variable w is set twice");
    expect_error(HEAD "c1 = conv 8 3 k=5\n" TAIL, "t.net:2: layer c1: conv: 'k' is given twice");
    expect_error("[block b]\nparams = w\nc = conv {w} 3\n" HEAD "x = repeat 2 b 8 w=4\n" TAIL,
                 "t.net:5: layer x: block b: 'w' is given twice");
    expect_error("[block a b]\n" HEAD TAIL, "t.net:1: [block a b]: a block's name is one word");
    expect_error(HEAD "c1 = conv 8 3 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1\n" TAIL,
                 "t.net:2: layer c1: more than 32 words on the line");
    Model *m = new_model();
    char err[256];
    NetShape shape = {2, 16, 10, 0};
    CHECK(netfile_build(m, "/nonexistent/x.net", NULL, &shape, err, sizeof err) == -1 &&
          strcmp(err, "/nonexistent/x.net: cannot open: No such file or directory") == 0);
    free(m);
}

/* Adds by name, repeat with "then", variables with arithmetic, a condition and checkpoint blocks. */
static void check_good_net(void) {
    const char *text =
        "# a residual net\n"
        "[vars]\n"
        "width = 8\n"
        "[block res]\n"
        "params = w stride=1\n"
        "checkpoint = yes\n"
        "a = conv {w} 3 stride={stride} bias=no\n"
        "an = batchnorm\n"
        "relu\n"
        "b = conv {w} 3 bias=no\n"
        "bn = batchnorm\n"
        "short = conv {w} 1 stride={stride} bias=no from=input   if {stride} != 1\n"
        "add bn short   if {stride} != 1\n"
        "add input      if {stride} == 1\n"
        "relu\n"
        "[net]\n"
        "stem = conv {width} 3\n"
        "stage = repeat 3 res {2*width} 2 then stride=1\n"
        "tail = res {2*width}\n"
        "sum = add stage.0 from=tail\n"
        "global_avgpool\n"
        "fc = linear {classes} bias=no\n";
    Model *m = new_model();
    const char *err = build_text(m, text);
    CHECK_MSG(!err[0], "%s", err);
    if (err[0]) {
        free(m);
        return;
    }
    /* stem; res with its shortcut (8 layers), 2 without (7 each), tail (7); add, pool, fc */
    CHECK_MSG(m->n_layers == 1 + 8 + 7 + 7 + 7 + 3, "%d layers", m->n_layers);
    CHECK(m->n_blocks == 4);
    int stage0 = -1, tail = -1, sum = -1, short_conv = -1;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (strcmp(l->module, "stage.0.short") == 0) short_conv = i;
        if (strcmp(l->module, "sum") == 0) sum = i;
        if (strcmp(l->module, "tail.b") == 0) tail = i;
        if (l->block == 0) stage0 = i; /* stage.0's last layer */
    }
    CHECK(short_conv > 0 && m->layers[short_conv].conv.shape.stride == 2 && m->layers[short_conv].in == 1);
    CHECK(sum > 0 && m->layers[sum].kind == LAYER_ADD && m->layers[sum].in == m->layers[sum - 1].out &&
          m->layers[sum].in2 == m->layers[stage0].out);
    CHECK(tail > 0 && m->layers[tail].conv.shape.k == 16 && m->acts[m->layers[sum].out].h == 8);
    CHECK(strcmp(m->layers[0].module, "stem") == 0 && m->layers[m->n_layers - 1].b_count == 0);
    model_finalize(m, NULL, 5);
    model_forward(m);
    model_destroy(m);
    free(m);
}

static const char tiny_net[] = "[net]\nc1 = conv 8 3 stride=2\nrelu\nglobal_avgpool\nfc = linear {classes}\n";

static Config *config_of(const char *path) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    char err[512];
    CHECK_MSG(config_load_file(c, path, err, sizeof err) == 0, "%s", err);
    return c;
}

static void read_settings(void *cfg) {
    TrainSettings s;
    settings_read(cfg, 1, &s);
}

/* model.net against the config's folder, the net it builds and its summary; model.net with model.name. */
static void check_config(void) {
    const char *dir = test_tmpdir("netfile");
    char sub[512], path[600], nets[600];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    snprintf(nets, sizeof nets, "%s/sub/nets", dir);
    CHECK(files_make_dirs(nets) == 0);
    test_write_file(nets, "tiny.net", tiny_net, strlen(tiny_net));
    const char *ini = "[run]\ndevice = cpu\n[data]\nimage_size = 16\n[model]\nnum_classes = 10\nnet = nets/tiny.net\n";
    snprintf(path, sizeof path, "%s", test_write_file(sub, "a.ini", ini, strlen(ini)));
    Config *c = config_of(path);
    TrainSettings s;
    settings_read(c, 1, &s);
    char want[700], err[512];
    snprintf(want, sizeof want, "%s/tiny.net", nets);
    CHECK_MSG(s.model.net && strcmp(s.model.net, want) == 0 && strcmp(s.model.name, "tiny") == 0,
              "model.net resolved to %s (name %s), not %s", s.model.net ? s.model.net : "NULL", s.model.name, want);
    Model *m = new_model();
    char *text = NULL;
    CHECK_MSG(settings_build_net(&s, m, 2, 0, &text, err, sizeof err) == 0, "%s", err);
    CHECK(text && strcmp(text, tiny_net) == 0);
    free(text);
    CHECK(m->n_layers == 4 && strcmp(m->layers[0].module, "c1") == 0 && m->acts[m->layers[0].out].h == 8);
    char *table = NULL;
    size_t table_len = 0;
    FILE *f = open_memstream(&table, &table_len);
    summary_print(m, "tiny", f);
    fclose(f);
    /* conv 3 -> 8 3x3 at 8x8: 2 * 8*3*9 * 64 FLOPs, 216 + 8 parameters; fc 8 -> 10 */
    CHECK_MSG(strstr(table, "c1") && strstr(table, "8x8x8") && strstr(table, "224") && strstr(table, "27,648") &&
              strstr(table, "total: 4 layers, 314 parameters"), "summary:\n%s", table);
    free(table);
    free(m);
    config_free(c);

    const char *both = "[run]\ndevice = cpu\n[model]\nname = resnet18\nnet = nets/tiny.net\n";
    snprintf(path, sizeof path, "%s", test_write_file(sub, "b.ini", both, strlen(both)));
    c = config_of(path);
    int status = 0;
    char *out = test_child_stderr("netfile", read_settings, c, &status);
    CHECK_MSG(status == 1 && strstr(out, "b.ini:5: model.net = nets/tiny.net: and model.name both name the net"),
              "exit %d: %s", status, out);
    free(out);
    config_free(c);
}

static const char residual_net[] =
    "[net]\nstem = conv 8 3 bias=no\nstem_bn = batchnorm\nr = relu\nb1 = conv 8 3\nadd r\n"
    "global_avgpool\nfc = linear {classes}\n";

/* A run of a net file writes its text into the checkpoint, and export rebuilds the net from that text even
 * once the file is gone. */
static void check_checkpoint(void) {
    char root[600], net[700], dir[700], ckpt[800], out[800], line[1000], err[4400];
    snprintf(root, sizeof root, "%s", test_tmpdir("netfile-ckpt"));
    snprintf(net, sizeof net, "%s", test_write_file(root, "res.net", residual_net, strlen(residual_net)));
    snprintf(dir, sizeof dir, "%s/ck", root);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-00000002.trc", dir);
    snprintf(out, sizeof out, "%s/res.safetensors", root);
    char ini[1200]; /* model.net = res.net: beside run.ini */
    snprintf(ini, sizeof ini, "[run]\ndevice = cpu\nepochs = 1\nmax_steps = 2\ncheckpoint_every = 2\nlog_every = 1000\n"
             "checkpoint_dir = %s\n[data]\nsource = synthetic\nimage_size = 16\nsynthetic_train = 64\n"
             "synthetic_test = 16\n[train]\nbatch = 16\n[model]\nnet = res.net\n", dir);
    Config *c = config_of(test_write_file(root, "run.ini", ini, strlen(ini)));
    TrainSummary run;
    train_run(c, &run);
    config_free(c);
    CHECK(unlink(net) == 0);
    CheckpointWeights w;
    CHECK_MSG(checkpoint_weights_read(ckpt, &w, err, sizeof err) == 0, "%s", err);
    CHECK(w.net_text && strcmp(w.net_text, residual_net) == 0);
    CHECK(w.model && w.model->n_layers == 7 && w.model->layers[4].kind == LAYER_ADD &&
          strcmp(w.model->layers[0].module, "stem") == 0);
    checkpoint_weights_free(&w);
    snprintf(line, sizeof line, "%s", ckpt);
    char *argv[] = {"export", "--checkpoint", line, "--format", "safetensors", "--out", out, NULL};
    CHECK(export_main(7, argv) == 0 && access(out, F_OK) == 0);
}

int main(void) {
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) check_shipped(&shipped[i]);
    uint64_t rng = test_seed();
    /* VGG-16-BN, convolutions without bias: 3x3 weights 3*64 + 64*64 + 64*128 + 128*128 + 128*256 + 2*256*256 +
     * 256*512 + 5*512*512 = 1,634,496 filters of 9: 14,710,464; batch norms 2 * (2*64 + 2*128 + 3*256 + 6*512) =
     * 8,448; fc 512*10 + 10 = 5,130. */
    check_new_net("vgg", 14710464 + 8448 + 5130, 16, 12, 0.02f, &rng);
    /* MobileNetV2 (torchvision's mobilenet_v2(num_classes=10): 2,236,682): stem 3*32*9 + 64; the 17 blocks of
     * expand (c*6c, no expand in the first), depthwise 6c*9, project 6c*c', and their norms 2 * (6c + 6c + c'):
     * 1,779,296 + 31,488; head 320*1280 + 2*1280; fc 1280*10 + 10. */
    check_new_net("mobilenetv2", 864 + 64 + 1779296 + 31488 + 409600 + 2560 + 12810, 16, 30, 0.02f, &rng);
    check_errors();
    check_good_net();
    check_config();
    check_checkpoint();
    return test_finish("test_netfile");
}
