#include "tools/trainer/summary.h"

#include <stdlib.h>
#include <string.h>

#include "models/layers.h"
#include "runtime/check.h"
#include "tools/trainer/settings.h"

/* "1,234,567" */
static const char *grouped(double v, char *buf, size_t n) {
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", v);
    size_t len = strlen(digits), k = 0;
    for (size_t i = 0; i < len && k + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[k++] = ',';
        buf[k++] = digits[i];
    }
    buf[k] = '\0';
    return buf;
}

void summary_print(const Model *m, const char *title, FILE *f) {
    const Activation *in = &m->acts[0];
    char p[32], fl[32], shape[32];
    double flops = 0;
    fprintf(f, "%s: input %dx%dx%d, %d classes\n", title, in->c_real, in->h, in->w, m->num_classes);
    fprintf(f, "%-28s %-10s %-16s %14s %16s %5s\n", "layer", "kind", "output", "params", "FLOPs", "block");
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const Activation *y = &m->acts[l->out];
        double layer_flops = model_layer_flops(m, i) / m->batch;
        flops += layer_flops;
        snprintf(shape, sizeof shape, "%dx%dx%d", y->c, y->h, y->w);
        char block[16] = "";
        if (l->block >= 0) snprintf(block, sizeof block, "%d", l->block);
        fprintf(f, "%-28s %-10s %-16s %14s %16s %5s\n", l->module[0] ? l->module : l->name, layer_kinds[l->kind].name,
                shape, grouped((double)(l->w_count + l->b_count), p, sizeof p), grouped(layer_flops, fl, sizeof fl),
                block);
    }
    size_t params = model_param_count(m);
    fprintf(f, "total: %d layers, %s parameters (%.2f MiB in fp32), %s FLOPs a forward per image (%.3g G), "
            "%d checkpoint blocks\n", m->n_layers, grouped((double)params, p, sizeof p),
            (double)params * 4 / (1 << 20), grouped(flops, fl, sizeof fl), flops / 1e9, m->n_blocks);
}

int summary_main(const Config *cfg) {
    TrainSettings s;
    settings_fill(cfg, &s);
    if (s.model.net_and_name) settings_fail(&s, "model.net", "and model.name both name the net: set one of them");
    if (!s.model.num_classes) s.model.num_classes = 10;
    Model *m = calloc(1, sizeof *m);
    if (!m) TC_FATAL("out of host memory: a model");
    char err[4600];
    if (settings_build_net(&s, m, 1, 0, NULL, err, sizeof err) != 0)
        settings_fail(&s, s.model.net ? "model.net" : "model.name", "%s", err);
    char title[4200];
    snprintf(title, sizeof title, "%s%s%s", s.model.name, s.model.net ? " from " : "", s.model.net ? s.model.net : "");
    summary_print(m, title, stdout);
    free(m);
    return 0;
}
