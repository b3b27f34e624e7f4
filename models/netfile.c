/* The net reader: a net file's text, through the INI lexer, to builder calls
 * (models/model.h). It reads the file into sections first, then builds the
 * [net] section line by line; a block's use builds its section's lines with
 * its parameters bound, its names under the use's name. */
#include "models/netfile.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "models/layers.h"
#include "runtime/check.h"
#include "runtime/ini.h"

#define NET_MAX_TOKENS 32
#define NET_MAX_VARS 64
#define NET_MAX_DEPTH 8 /* blocks used inside blocks */

typedef struct {
    int line;
    const char *name;  /* the key: the layer's or the block use's name; NULL: unnamed */
    const char *value; /* kind and arguments */
} NetLine;

typedef struct NetBlock {
    const char *name;   /* [block NAME]; "net" for [net] */
    int line;
    const char *params; /* "width stride=1": the parameters, in order, with their defaults */
    int checkpoint;     /* each use is one checkpoint block (model_block_begin/end) */
    NetLine *lines;
    int n_lines;
} NetBlock;

typedef struct {
    const char *name;
    const char *value;
} NetVar;

typedef struct {
    const char *path;
    char *text;
    NetBlock net;
    int net_line; /* where [net] starts; 0: no [net] yet */
    NetBlock *blocks;
    int n_blocks;
    NetVar vars[NET_MAX_VARS]; /* {image}, {classes} and [vars] */
    int n_vars;
    char *owned[NET_MAX_VARS]; /* the [vars] values after substitution */
    int n_owned;
} NetFile;

/* A kind's or a block's arguments, bound to its parameters. */
typedef struct {
    NetVar list[NET_MAX_TOKENS]; /* in the parameters' order, each given or its default */
    int n;
    const char *rest[NET_MAX_TOKENS]; /* a "name..." parameter: the positional arguments past the others */
    int n_rest;
} NetArgs;

typedef struct {
    char *name;
    int act;
    int line;
} NetName;

/* The names the lines of one section see. */
typedef struct {
    const char *prefix;    /* "layer1.0.": the block use's name; "" in [net] */
    int input;             /* what "input" reads: the use's input, or the image */
    const NetArgs *params; /* the block's parameters; NULL in [net] */
    const struct NetBlock *block;
} NetScope;

typedef struct NetBuild {
    Model *m;
    const NetScope *scope; /* the line's, for kinds that read earlier layers by name */
    NetFile *f;
    NetName *names;
    int n_names, cap_names;
    int layer_line[MODEL_MAX_LAYERS];
    char layer_label[MODEL_MAX_LAYERS][80];
    char *err;
    size_t errlen;
    int failed;
    int line;             /* the line being built */
    char label[80];       /* "layer layer2.0.conv1" or "unnamed relu" */
    char used_at[160];    /* " (block basic, used at x.net:30)" inside a block */
    int depth, in_checkpoint;
} NetBuild;

typedef struct {
    const char *name;
    const char *args; /* positional order; "name=default" optional, "name..." the rest */
    int (*build)(NetBuild *b, int in, const NetArgs *a); /* the output's id, or -1 (net_fail) */
} NetKind;

static int net_fail(NetBuild *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int net_fail(NetBuild *b, const char *fmt, ...) {
    if (b->failed) return -1;
    b->failed = 1;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (b->label[0]) snprintf(b->err, b->errlen, "%s:%d: %s%s: %s", b->f->path, b->line, b->label, b->used_at, what);
    else snprintf(b->err, b->errlen, "%s:%d: %s", b->f->path, b->line, what);
    return -1;
}

static char *xstrdup(const char *s) {
    char *d = strdup(s);
    if (!d) TC_FATAL("netfile: out of memory");
    return d;
}

/* ---- arguments ------------------------------------------------------------- */

static const char *arg_text(const NetArgs *a, const char *key) {
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->list[i].name, key) == 0) return a->list[i].value;
    TC_FATAL("netfile: no argument '%s' in the kind's table entry", key);
}

static int arg_int(NetBuild *b, const NetArgs *a, const char *key) {
    const char *text = arg_text(a, key);
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < INT_MIN || v > INT_MAX)
        return net_fail(b, "%s = '%s' is not an integer", key, text), 0;
    return (int)v;
}

/* A number, or a fraction "1/9". */
static float arg_float(NetBuild *b, const NetArgs *a, const char *key) {
    const char *text = arg_text(a, key);
    char *end;
    double v = strtod(text, &end);
    if (end != text && *end == '/') {
        const char *den = end + 1;
        double d = strtod(den, &end);
        v = end != den && d != 0 ? v / d : NAN;
    }
    if (end == text || *end || !isfinite(v) || fabs(v) > 3e38)
        return net_fail(b, "%s = '%s' is not a finite number", key, text), 0.0f;
    return (float)v;
}

static int arg_bool(NetBuild *b, const NetArgs *a, const char *key) {
    static const char *truths[] = {"yes", "on", "true", "1"}, *falsehoods[] = {"no", "off", "false", "0"};
    const char *text = arg_text(a, key);
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(text, truths[i]) == 0) return 1;
        if (strcasecmp(text, falsehoods[i]) == 0) return 0;
    }
    return net_fail(b, "%s = '%s' is not yes or no", key, text), 0;
}

/* Binds tokens ("64", "stride=2") to the parameters of spec ("out k stride=1"): positional ones fill the
 * parameters in order, named ones their parameter; what is left gets its default. An argument given twice
 * is an error, except that tokens from overrides on (a repeat's "then") replace earlier ones. what names
 * the kind or block in messages. */
static int bind_args(NetBuild *b, const char *what, const char *spec, char **tokens, int n_tokens, int overrides,
                     NetArgs *a, char *spec_copy) {
    *a = (NetArgs){0};
    const char *variadic = NULL;
    strcpy(spec_copy, spec);
    for (char *save = NULL, *p = strtok_r(spec_copy, " ", &save); p; p = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(p, '=');
        size_t len = strlen(p);
        if (len > 3 && strcmp(p + len - 3, "...") == 0) {
            p[len - 3] = '\0';
            variadic = p;
            continue;
        }
        if (eq) *eq = '\0';
        if (a->n == NET_MAX_TOKENS) return net_fail(b, "%s has more than %d parameters", what, NET_MAX_TOKENS);
        a->list[a->n++] = (NetVar){p, eq ? eq + 1 : NULL};
    }
    int given[NET_MAX_TOKENS] = {0}, next_positional = 0;
    for (int t = 0; t < n_tokens; t++) {
        char *eq = strchr(tokens[t], '=');
        int k = -1;
        if (eq) {
            *eq = '\0';
            for (int i = 0; i < a->n && k < 0; i++)
                if (strcmp(a->list[i].name, tokens[t]) == 0) k = i;
            if (k < 0) {
                char known[256] = "";
                for (int i = 0; i < a->n; i++)
                    snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                             a->list[i].name);
                int rc = net_fail(b, "%s has no argument '%s' (it takes: %s)", what, tokens[t],
                                  a->n ? known : "none");
                *eq = '=';
                return rc;
            }
            *eq = '=';
        } else {
            while (next_positional < a->n && given[next_positional]) next_positional++;
            if (next_positional == a->n) {
                if (variadic && a->n_rest < NET_MAX_TOKENS) {
                    a->rest[a->n_rest++] = tokens[t];
                    continue;
                }
                return net_fail(b, "%s takes %d positional argument%s (%s), and '%s' is one more", what, a->n,
                                a->n == 1 ? "" : "s", spec[0] ? spec : "none", tokens[t]);
            }
            k = next_positional;
        }
        if (given[k] && t < overrides) return net_fail(b, "%s: '%s' is given twice", what, a->list[k].name);
        given[k] = 1;
        a->list[k].value = eq ? eq + 1 : tokens[t];
    }
    for (int i = 0; i < a->n; i++)
        if (!a->list[i].value) return net_fail(b, "%s needs its argument '%s' (%s)", what, a->list[i].name, spec);
    return 0;
}

/* ---- the layer kinds ---------------------------------------------------------- */

static int resolve_name(NetBuild *b, const NetScope *s, const char *name);

/* A builder's answer: its failure's message, or its output. */
static int built(NetBuild *b, int out) {
    if (out < 0) return net_fail(b, "%s", b->m->build_err_text);
    return out;
}

/* groups = depthwise: one group a channel of the input. */
static int build_conv(NetBuild *b, int in, const NetArgs *a) {
    int out = arg_int(b, a, "out"), k = arg_int(b, a, "k"), stride = arg_int(b, a, "stride");
    int pad = strcmp(arg_text(a, "pad"), "auto") == 0 ? k / 2 : arg_int(b, a, "pad");
    int groups = strcmp(arg_text(a, "groups"), "depthwise") == 0 ? b->m->acts[in].c : arg_int(b, a, "groups");
    int bias = arg_bool(b, a, "bias"), dirac = arg_bool(b, a, "dirac"), whiten = arg_bool(b, a, "whiten");
    if (b->failed) return -1;
    int y = built(b, model_conv_groups(b->m, in, out, k, pad, stride, groups, bias));
    if (y >= 0 && whiten && model_mark_whitening(b->m) < 0) return built(b, -1);
    if (y >= 0 && dirac && model_dirac_last(b->m) < 0) return built(b, -1);
    return y;
}

static int build_linear(NetBuild *b, int in, const NetArgs *a) {
    int out = arg_int(b, a, "out"), bias = arg_bool(b, a, "bias");
    if (b->failed) return -1;
    return built(b, (bias ? model_linear : model_linear_no_bias)(b->m, in, out));
}

/* A pool's window: k, stride (k unless given), pad; avgpool counts the padding in the average. */
static int build_pool(NetBuild *b, int in, const NetArgs *a, int (*pool)(Model *, int, int, int, int)) {
    int k = arg_int(b, a, "k");
    int stride = strcmp(arg_text(a, "stride"), "k") == 0 ? k : arg_int(b, a, "stride");
    int pad = arg_int(b, a, "pad");
    if (b->failed) return -1;
    return built(b, pool(b->m, in, k, stride, pad));
}

static int build_maxpool(NetBuild *b, int in, const NetArgs *a) { return build_pool(b, in, a, model_maxpool); }
static int build_avgpool(NetBuild *b, int in, const NetArgs *a) { return build_pool(b, in, a, model_avgpool2d); }

static int build_dropout(NetBuild *b, int in, const NetArgs *a) {
    float p = arg_float(b, a, "p");
    if (b->failed) return -1;
    return built(b, model_dropout(b->m, in, p));
}

/* concat X [Y ...]: the previous output (or from='s) and X, Y, ... along the channels. */
static int build_concat(NetBuild *b, int in, const NetArgs *a) {
    int ids[NET_MAX_TOKENS + 2], n = 0;
    ids[n++] = in;
    ids[n++] = resolve_name(b, b->scope, arg_text(a, "a"));
    for (int i = 0; i < a->n_rest; i++) ids[n++] = resolve_name(b, b->scope, a->rest[i]);
    if (b->failed) return -1;
    return built(b, model_concat_list(b->m, ids, n));
}

static int build_scale(NetBuild *b, int in, const NetArgs *a) {
    float factor = arg_float(b, a, "factor");
    if (b->failed) return -1;
    return built(b, model_scale(b->m, in, factor));
}

/* The kinds without arguments. */
static int build_batchnorm(NetBuild *b, int in, const NetArgs *a) { return built(b, model_batchnorm(b->m, in)); }
static int build_relu(NetBuild *b, int in, const NetArgs *a) { return built(b, model_relu(b->m, in)); }
static int build_gelu(NetBuild *b, int in, const NetArgs *a) { return built(b, model_gelu(b->m, in)); }
static int build_silu(NetBuild *b, int in, const NetArgs *a) { return built(b, model_silu(b->m, in)); }
static int build_flatten(NetBuild *b, int in, const NetArgs *a) { return built(b, model_flatten(b->m, in)); }
static int build_global_avgpool(NetBuild *b, int in, const NetArgs *a) { return built(b, model_avgpool(b->m, in)); }
static int build_global_maxpool(NetBuild *b, int in, const NetArgs *a) {
    return built(b, model_global_maxpool(b->m, in));
}

/* add X: the previous output + X; add X Y: X + Y. */
static int build_add(NetBuild *b, int in, const NetArgs *a) {
    const char *second = arg_text(a, "b");
    int x = strcmp(second, "-") == 0 ? in : resolve_name(b, b->scope, arg_text(a, "a"));
    int y = resolve_name(b, b->scope, strcmp(second, "-") == 0 ? arg_text(a, "a") : second);
    if (b->failed) return -1;
    return built(b, model_add(b->m, x, y));
}

/* Each kind a net file names: its arguments and its builder. A new kind is one entry. */
static const NetKind net_kinds[] = {
    {"conv", "out k stride=1 pad=auto groups=1 bias=yes dirac=no whiten=no", build_conv},
    {"linear", "out bias=yes", build_linear},
    {"batchnorm", "", build_batchnorm},
    {"relu", "", build_relu},
    {"gelu", "", build_gelu},
    {"silu", "", build_silu},
    {"dropout", "p", build_dropout},
    {"flatten", "", build_flatten},
    {"avgpool", "k stride=k pad=0", build_avgpool},
    {"concat", "a rest...", build_concat},
    {"maxpool", "k stride=k pad=0", build_maxpool},
    {"global_maxpool", "", build_global_maxpool},
    {"global_avgpool", "", build_global_avgpool},
    {"scale", "factor", build_scale},
    {"add", "a b=-", build_add},
};
#define NET_N_KINDS ((int)(sizeof net_kinds / sizeof net_kinds[0]))

static const NetKind *find_kind(const char *name) {
    for (int i = 0; i < NET_N_KINDS; i++)
        if (strcmp(net_kinds[i].name, name) == 0) return &net_kinds[i];
    return NULL;
}

static const NetBlock *find_block(const NetFile *f, const char *name) {
    for (int i = 0; i < f->n_blocks; i++)
        if (strcmp(f->blocks[i].name, name) == 0) return &f->blocks[i];
    return NULL;
}

/* ---- names --------------------------------------------------------------------- */

static const NetName *find_name(const NetBuild *b, const char *full) {
    for (int i = 0; i < b->n_names; i++)
        if (strcmp(b->names[i].name, full) == 0) return &b->names[i];
    return NULL;
}

static int define_name(NetBuild *b, const char *full, int act) {
    const NetName *old = find_name(b, full);
    if (old) return net_fail(b, "the name %s is taken (line %d)", full, old->line);
    if (strcmp(full, "input") == 0) return net_fail(b, "'input' names the input; a layer cannot take it");
    if (b->n_names == b->cap_names) {
        b->cap_names = b->cap_names ? 2 * b->cap_names : 64;
        b->names = realloc(b->names, (size_t)b->cap_names * sizeof *b->names);
        if (!b->names) TC_FATAL("netfile: out of memory");
    }
    b->names[b->n_names++] = (NetName){xstrdup(full), act, b->line};
    return 0;
}

/* The line of the section that defines name, later than the current one, or 0. */
static int defined_later(const NetBuild *b, const NetScope *s, const char *name) {
    for (int i = 0; i < s->block->n_lines; i++)
        if (s->block->lines[i].line > b->line && s->block->lines[i].name &&
            strcmp(s->block->lines[i].name, name) == 0) return s->block->lines[i].line;
    return 0;
}

static int resolve_name(NetBuild *b, const NetScope *s, const char *name) {
    if (strcmp(name, "input") == 0) return s->input;
    char full[256];
    snprintf(full, sizeof full, "%s%s", s->prefix, name);
    const NetName *n = find_name(b, full);
    if (n) return n->act;
    int later = defined_later(b, s, name);
    if (later) return net_fail(b, "%s is read before it is defined (line %d)", name, later);
    return net_fail(b, "no layer before this one is named %s", name);
}

/* ---- variables ------------------------------------------------------------------ */

static const char *find_var(const NetFile *f, const NetScope *s, const char *name, size_t len) {
    for (int i = 0; s->params && i < s->params->n; i++)
        if (strlen(s->params->list[i].name) == len && strncmp(s->params->list[i].name, name, len) == 0)
            return s->params->list[i].value;
    for (int i = f->n_vars - 1; i >= 0; i--)
        if (strlen(f->vars[i].name) == len && strncmp(f->vars[i].name, name, len) == 0) return f->vars[i].value;
    return NULL;
}

static int is_ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* One integer term of an expression: a number or a variable holding one. */
static int eval_atom(NetBuild *b, const NetScope *s, const char **p, long *v) {
    while (**p == ' ') (*p)++;
    const char *start = *p;
    while (is_ident_char(**p)) (*p)++;
    if (*p == start) return net_fail(b, "expected a number or a variable at '%s'", start);
    const char *text = start;
    size_t len = (size_t)(*p - start);
    char buf[64];
    if (!(start[0] >= '0' && start[0] <= '9')) {
        text = find_var(b->f, s, start, len);
        if (!text) return net_fail(b, "unknown variable {%.*s}", (int)len, start);
        len = strlen(text);
    }
    snprintf(buf, sizeof buf, "%.*s", (int)len, text);
    char *end;
    *v = strtol(buf, &end, 10);
    if (end == buf || *end) return net_fail(b, "{%.*s} = '%s' is not an integer", (int)(*p - start), start, buf);
    while (**p == ' ') (*p)++;
    return 0;
}

/* Integer arithmetic inside braces: + - * / (whole division), * and / first. */
static int eval_expr(NetBuild *b, const NetScope *s, const char *expr, long *out) {
    const char *p = expr;
    long sum = 0, term;
    int sign = 1;
    if (eval_atom(b, s, &p, &term) != 0) return -1;
    for (;;) {
        if (*p == '*' || *p == '/') {
            char op = *p++;
            long v;
            if (eval_atom(b, s, &p, &v) != 0) return -1;
            if (op == '/' && v == 0) return net_fail(b, "{%s} divides by zero", expr);
            term = op == '*' ? term * v : term / v;
            continue;
        }
        sum += sign * term;
        if (*p != '+' && *p != '-') break;
        sign = *p++ == '+' ? 1 : -1;
        if (eval_atom(b, s, &p, &term) != 0) return -1;
    }
    if (*p) return net_fail(b, "cannot read {%s} (a variable, or integers with + - * /)", expr);
    *out = sum;
    return 0;
}

/* text with each {expr} replaced; NULL after net_fail. */
static char *substitute(NetBuild *b, const NetScope *s, const char *text) {
    size_t cap = strlen(text) + 256, n = 0;
    char *out = malloc(cap);
    if (!out) TC_FATAL("netfile: out of memory");
    for (const char *p = text; *p;) {
        char piece[128];
        const char *add = piece;
        size_t add_len;
        if (*p == '{') {
            const char *close = strchr(p, '}');
            if (!close) return free(out), net_fail(b, "'{' without '}' in '%s'", text), NULL;
            char expr[96];
            snprintf(expr, sizeof expr, "%.*s", (int)(close - p - 1), p + 1);
            const char *var = find_var(b->f, s, expr, strlen(expr));
            long v = 0;
            if (var) add = var;
            else if (eval_expr(b, s, expr, &v) != 0) return free(out), NULL;
            else snprintf(piece, sizeof piece, "%ld", v);
            add_len = strlen(add);
            p = close + 1;
        } else {
            add = p++;
            add_len = 1;
        }
        if (n + add_len + 1 > cap) {
            cap = 2 * (n + add_len + 1);
            out = realloc(out, cap);
            if (!out) TC_FATAL("netfile: out of memory");
        }
        memcpy(out + n, add, add_len);
        n += add_len;
    }
    out[n] = '\0';
    return out;
}

/* The line's words into tokens; -1 (net_fail) past NET_MAX_TOKENS. */
static int split(NetBuild *b, char *text, char **tokens) {
    int n = 0;
    for (char *save = NULL, *t = strtok_r(text, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (n == NET_MAX_TOKENS) return net_fail(b, "more than %d words on the line", NET_MAX_TOKENS);
        tokens[n++] = t;
    }
    return n;
}

/* "if A OP B" (or "if A": a yes/no) at the line's end: 1 true, 0 false, -1 unreadable. Cuts it off the tokens. */
static int condition(NetBuild *b, char **tokens, int *n) {
    int at = -1;
    for (int i = 1; i < *n && at < 0; i++)
        if (strcmp(tokens[i], "if") == 0) at = i;
    if (at < 0) return 1;
    int n_cond = *n - at - 1;
    *n = at;
    char **c = tokens + at + 1;
    if (n_cond == 1) {
        NetArgs flag = {.list = {{"if", c[0]}}, .n = 1};
        return b->failed ? -1 : arg_bool(b, &flag, "if");
    }
    static const char *ops[] = {"<", "<=", ">", ">=", "==", "!="};
    int op = -1;
    for (int i = 0; n_cond == 3 && i < 6; i++)
        if (strcmp(c[1], ops[i]) == 0) op = i;
    if (op < 0) return net_fail(b, "expected 'if A OP B' (OP one of < <= > >= == !=) or 'if FLAG' at the line's end");
    char *end_a, *end_b;
    long a = strtol(c[0], &end_a, 10), v = strtol(c[2], &end_b, 10);
    int numbers = *c[0] && !*end_a && *c[2] && !*end_b;
    int cmp = numbers ? (a > v) - (a < v) : strcmp(c[0], c[2]);
    if (!numbers && op < 4) return net_fail(b, "if %s %s %s: < and > compare integers", c[0], c[1], c[2]);
    int truth[6] = {cmp < 0, cmp <= 0, cmp > 0, cmp >= 0, cmp == 0, cmp != 0};
    return truth[op];
}

/* ---- building ------------------------------------------------------------------- */

static int build_section(NetBuild *b, const NetScope *s, int *x);

static void set_label(NetBuild *b, const NetScope *s, const char *name, const char *kind) {
    if (name) snprintf(b->label, sizeof b->label, "layer %s%s", s->prefix, name);
    else snprintf(b->label, sizeof b->label, "unnamed %s", kind);
}

/* One use of a block: its lines built under prefix with tokens bound to its parameters. */
static int build_block_use(NetBuild *b, const NetScope *s, const NetBlock *blk, const char *full, char **tokens,
                           int n_tokens, int overrides, int *x) {
    if (b->depth >= NET_MAX_DEPTH)
        return net_fail(b, "blocks nested more than %d deep (a block that uses itself?)", NET_MAX_DEPTH);
    char spec_copy[512], what[96], prefix[256];
    NetArgs params;
    snprintf(what, sizeof what, "block %s", blk->name);
    if (strlen(blk->params) >= sizeof spec_copy) return net_fail(b, "block %s has too many parameters", blk->name);
    if (bind_args(b, what, blk->params, tokens, n_tokens, overrides, &params, spec_copy) != 0) return -1;
    if (blk->checkpoint && b->in_checkpoint)
        return net_fail(b, "block %s is a checkpoint block inside another one; they do not nest", blk->name);
    snprintf(prefix, sizeof prefix, "%s%s", full ? full : s->prefix, full ? "." : "");
    NetScope inner = {prefix, *x, &params, blk};
    char saved_used_at[sizeof b->used_at], saved_label[sizeof b->label];
    int saved_line = b->line, first_layer = b->m->n_layers;
    memcpy(saved_used_at, b->used_at, sizeof saved_used_at);
    memcpy(saved_label, b->label, sizeof saved_label);
    snprintf(b->used_at, sizeof b->used_at, " (block %s, used at %s:%d)", blk->name, b->f->path, b->line);
    b->depth++;
    if (blk->checkpoint) {
        model_block_begin(b->m);
        b->in_checkpoint = 1;
    }
    int rc = build_section(b, &inner, x);
    b->depth--;
    memcpy(b->used_at, saved_used_at, sizeof saved_used_at);
    memcpy(b->label, saved_label, sizeof saved_label);
    b->line = saved_line;
    if (rc != 0) return -1;
    if (b->m->n_layers == first_layer) return net_fail(b, "block %s adds no layer here", blk->name);
    if (blk->checkpoint) {
        model_block_end(b->m);
        b->in_checkpoint = 0;
    }
    return full ? define_name(b, full, *x) : 0;
}

/* name = repeat N BLOCK ARGS [then [BLOCK2] ARGS2]: uses name.0 .. name.N-1, the first with ARGS, the
 * others with ARGS2 (over ARGS, or BLOCK2's own). */
static int build_repeat(NetBuild *b, const NetScope *s, const char *full, char **tokens, int n_tokens, int *x) {
    char *end;
    long count = n_tokens > 1 ? strtol(tokens[1], &end, 10) : 0;
    if (n_tokens < 3 || *end || count < 1 || count > MODEL_MAX_LAYERS)
        return net_fail(b, "expected 'repeat N BLOCK arguments' with N >= 1");
    if (!full) return net_fail(b, "a repeat needs a name (its uses are NAME.0, NAME.1, ...)");
    const NetBlock *first = find_block(b->f, tokens[2]), *rest = first;
    if (!first) return net_fail(b, "repeat: no block named %s", tokens[2]);
    int then = n_tokens;
    for (int i = 3; i < n_tokens && then == n_tokens; i++)
        if (strcmp(tokens[i], "then") == 0) then = i;
    char *rest_tokens[NET_MAX_TOKENS];
    int n_rest = 0, overrides = 0; /* the others' arguments; from overrides on they replace the first's */
    if (then + 1 < n_tokens && find_block(b->f, tokens[then + 1])) {
        rest = find_block(b->f, tokens[then + 1]);
        for (int i = then + 2; i < n_tokens; i++) rest_tokens[n_rest++] = tokens[i];
        overrides = n_rest;
    } else {
        for (int i = 3; i < n_tokens; i++)
            if (i != then) rest_tokens[n_rest++] = tokens[i];
        overrides = then - 3;
    }
    for (long i = 0; i < count; i++) {
        char name[300];
        snprintf(name, sizeof name, "%s.%ld", full, i);
        int rc = i == 0 ? build_block_use(b, s, first, name, tokens + 3, then - 3, then - 3, x)
                        : build_block_use(b, s, rest, name, rest_tokens, n_rest, overrides, x);
        if (rc != 0) return -1;
    }
    return define_name(b, full, *x);
}

static int build_layer(NetBuild *b, const NetScope *s, const NetKind *kind, const char *full, char **tokens,
                       int n_tokens, int *x) {
    int in = *x, first_layer = b->m->n_layers;
    int kept = 0;
    for (int i = 1; i < n_tokens; i++) {
        if (strncmp(tokens[i], "from=", 5) == 0) in = resolve_name(b, s, tokens[i] + 5);
        else tokens[kept++] = tokens[i];
    }
    if (b->failed) return -1;
    char spec_copy[512];
    NetArgs args;
    if (bind_args(b, kind->name, kind->args, tokens, kept, kept, &args, spec_copy) != 0) return -1;
    b->scope = s;
    int out = kind->build(b, in, &args);
    if (out < 0) return -1;
    for (int l = first_layer; l < b->m->n_layers; l++) {
        b->layer_line[l] = b->line;
        snprintf(b->layer_label[l], sizeof b->layer_label[l], "%s", b->label);
    }
    if (full) {
        if (strlen(full) >= sizeof b->m->layers[0].module)
            return net_fail(b, "the name is longer than %zu characters", sizeof b->m->layers[0].module - 1);
        model_name_last(b->m, "%s", full);
        if (define_name(b, full, out) != 0) return -1;
    }
    *x = out;
    return 0;
}

static int build_line(NetBuild *b, const NetScope *s, const NetLine *ln, int *x) {
    b->line = ln->line;
    int kind_len = (int)strcspn(ln->value, " \t");
    if (ln->name) snprintf(b->label, sizeof b->label, "layer %s%s", s->prefix, ln->name);
    else snprintf(b->label, sizeof b->label, "unnamed %.*s", kind_len, ln->value);
    char *name = ln->name ? substitute(b, s, ln->name) : NULL;
    char *value = substitute(b, s, ln->value);
    char *tokens[NET_MAX_TOKENS];
    int n = value ? split(b, value, tokens) : 0, rc = -1;
    char full[256];
    if (name) snprintf(full, sizeof full, "%s%s", s->prefix, name);
    if (value && n == 0) net_fail(b, "no kind after '='");
    else if (value && n > 0) {
        set_label(b, s, name, tokens[0]);
        int truth = condition(b, tokens, &n);
        const NetKind *kind = find_kind(tokens[0]);
        const NetBlock *blk = find_block(b->f, tokens[0]);
        if (truth <= 0) rc = truth;
        else if (strcmp(tokens[0], "repeat") == 0) rc = build_repeat(b, s, name ? full : NULL, tokens, n, x);
        else if (blk) rc = build_block_use(b, s, blk, name ? full : NULL, tokens + 1, n - 1, n - 1, x);
        else if (kind) rc = build_layer(b, s, kind, name ? full : NULL, tokens, n, x);
        else {
            char known[512] = "";
            for (int i = 0; i < NET_N_KINDS; i++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", net_kinds[i].name);
            rc = net_fail(b, "unknown kind '%s' (kinds: %s; or repeat, or a [block])", tokens[0], known);
        }
    }
    free(name);
    free(value);
    return rc;
}

static int build_section(NetBuild *b, const NetScope *s, int *x) {
    for (int i = 0; i < s->block->n_lines; i++)
        if (build_line(b, s, &s->block->lines[i], x) != 0) return -1;
    return 0;
}

/* What plan_accumulation (model.c) would refuse, said with the lines: a ReLU (in place) whose input feeds
 * another layer, and an input that feeds several layers where one of them cannot add its gradient. */
static int check_fan_out(NetBuild *b) {
    const Model *m = b->m;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        int ins[2] = {l->in, l->in2};
        for (int k = 0; k < 2; k++) {
            if (ins[k] <= 0) continue;
            for (int j = i + 1; j < m->n_layers; j++) {
                const Layer *later = &m->layers[j];
                if (later->in != ins[k] && later->in2 != ins[k]) continue;
                int relu = later->kind == LAYER_RELU ? j : l->kind == LAYER_RELU ? i : -1;
                if (relu < 0 && layer_kinds[l->kind].adds_dx) continue;
                int culprit = relu >= 0 ? relu : i, other = culprit == i ? j : i;
                b->line = b->layer_line[culprit];
                snprintf(b->label, sizeof b->label, "%s", b->layer_label[culprit]);
                b->used_at[0] = '\0';
                if (relu >= 0)
                    return net_fail(b, "a ReLU works in place, so its input may feed no other layer, and line %d's "
                                    "layer reads it too", b->layer_line[other]);
                return net_fail(b, "its input feeds line %d's layer too, and a %s layer cannot add its gradient to "
                                "another's", b->layer_line[other], layer_kinds[l->kind].name);
            }
        }
    }
    return 0;
}

/* ---- reading the file -------------------------------------------------------------- */

static void add_line(NetBlock *blk, int line, const char *name, const char *value) {
    blk->lines = realloc(blk->lines, (size_t)(blk->n_lines + 1) * sizeof *blk->lines);
    if (!blk->lines) TC_FATAL("netfile: out of memory");
    blk->lines[blk->n_lines++] = (NetLine){line, name, value};
}

static int file_fail(NetBuild *b, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int file_fail(NetBuild *b, int line, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    b->line = line;
    b->label[0] = '\0';
    return net_fail(b, "%s", what);
}

static int add_var(NetBuild *b, int line, const char *name, const char *value) {
    NetFile *f = b->f;
    for (int i = 0; i < f->n_vars; i++)
        if (strcmp(f->vars[i].name, name) == 0) return file_fail(b, line, "variable %s is set twice", name);
    if (f->n_vars == NET_MAX_VARS) return file_fail(b, line, "more than %d variables", NET_MAX_VARS);
    f->vars[f->n_vars++] = (NetVar){name, value};
    return 0;
}

static int read_section(NetBuild *b, const IniItem *item, NetBlock **current, int *in_vars) {
    NetFile *f = b->f;
    *in_vars = strcmp(item->name, "vars") == 0;
    *current = NULL;
    if (*in_vars) return 0;
    if (strcmp(item->name, "net") == 0) {
        if (f->net_line)
            return file_fail(b, item->line, "a second [net] section (the first is at line %d)", f->net_line);
        f->net_line = item->line;
        *current = &f->net;
        return 0;
    }
    if (strncmp(item->name, "block ", 6) != 0)
        return file_fail(b, item->line, "unknown section [%s] (sections: [net], [vars], [block NAME])", item->name);
    const char *name = ini_trim((char *)item->name + 6);
    if (!*name || strpbrk(name, " \t{}"))
        return file_fail(b, item->line, "[block %s]: a block's name is one word", name);
    if (find_block(f, name) || find_kind(name) || strcmp(name, "repeat") == 0)
        return file_fail(b, item->line, "block %s: the name is taken by %s", name,
                         find_block(f, name) ? "another block" : "a layer kind");
    f->blocks = realloc(f->blocks, (size_t)(f->n_blocks + 1) * sizeof *f->blocks);
    if (!f->blocks) TC_FATAL("netfile: out of memory");
    *current = &f->blocks[f->n_blocks++];
    **current = (NetBlock){.name = name, .line = item->line, .params = ""};
    return 0;
}

static int read_item(NetBuild *b, const IniItem *item, NetBlock **current, int *in_vars) {
    NetFile *f = b->f;
    if (item->kind == INI_SECTION) return read_section(b, item, current, in_vars);
    if (*in_vars) {
        if (item->kind != INI_PAIR) return file_fail(b, item->line, "[vars] holds 'name = value' lines");
        NetScope none = {"", 0, NULL, &f->net};
        b->line = item->line;
        char *value = substitute(b, &none, item->value);
        if (!value) return -1;
        f->owned[f->n_owned++] = value;
        return add_var(b, item->line, item->name, value);
    }
    if (!*current) return file_fail(b, item->line, "a line outside any section (start with [net])");
    NetBlock *blk = *current;
    if (item->kind == INI_PAIR && blk != &f->net && strcmp(item->name, "params") == 0) {
        blk->params = item->value;
        return 0;
    }
    if (item->kind == INI_PAIR && blk != &f->net && strcmp(item->name, "checkpoint") == 0) {
        NetArgs flag = {.list = {{"checkpoint", item->value}}, .n = 1};
        b->line = item->line;
        blk->checkpoint = arg_bool(b, &flag, "checkpoint");
        return b->failed ? -1 : 0;
    }
    add_line(blk, item->line, item->kind == INI_PAIR ? item->name : NULL,
             item->kind == INI_PAIR ? item->value : item->name);
    return 0;
}

static int read_file(NetBuild *b, const char *text, size_t len) {
    NetFile *f = b->f;
    f->text = malloc(len + 1);
    if (!f->text) TC_FATAL("netfile: out of memory");
    memcpy(f->text, text, len);
    f->text[len] = '\0';
    f->net = (NetBlock){.name = "net", .params = ""};
    IniLexer lx;
    ini_begin(&lx, f->path, f->text, len);
    IniItem item;
    char *lex_err = NULL;
    NetBlock *current = NULL;
    int in_vars = 0, got;
    while ((got = ini_next(&lx, &item, &lex_err)) == 1)
        if (read_item(b, &item, &current, &in_vars) != 0) return -1;
    if (got < 0) {
        snprintf(b->err, b->errlen, "%s", lex_err);
        free(lex_err);
        return b->failed = -1;
    }
    if (!f->net_line) return file_fail(b, lx.line, "no [net] section");
    return 0;
}

static void netfile_free(NetFile *f, NetBuild *b) {
    for (int i = 0; i < f->n_blocks; i++) free(f->blocks[i].lines);
    free(f->blocks);
    free(f->net.lines);
    for (int i = 0; i < f->n_owned; i++) free(f->owned[i]);
    free(f->text);
    for (int i = 0; i < b->n_names; i++) free(b->names[i].name);
    free(b->names);
}

static int build_net(NetBuild *b, const NetShape *shape) {
    Model *m = b->m;
    b->line = b->f->net_line;
    int x = model_input(m, 3, shape->image_size, shape->image_size);
    NetScope top = {"", x, NULL, &b->f->net};
    if (build_section(b, &top, &x) != 0 || check_fan_out(b) != 0) return -1;
    const Activation *out = &m->acts[x];
    b->label[0] = '\0';
    if (m->n_layers == 0) return file_fail(b, b->f->net_line, "the net has no layers");
    if (out->c != shape->num_classes || out->h != 1 || out->w != 1)
        return file_fail(b, b->layer_line[m->n_layers - 1], "the net ends in %dx%dx%d, not in {classes} = %d logits "
                         "(a linear layer of {classes} outputs, say)", out->c, out->h, out->w, shape->num_classes);
    return 0;
}

int netfile_build(Model *m, const char *path, const char *text, const NetShape *shape, char *err, size_t errlen) {
    char *file_text = NULL;
    size_t len = 0;
    if (!text) {
        const char *why = NULL;
        file_text = ini_read_file(path, &len, &why);
        if (!file_text) {
            snprintf(err, errlen, "%s: cannot open: %s", path, why);
            return -1;
        }
        text = file_text;
    } else {
        len = strlen(text);
    }
    NetFile f = {.path = path};
    NetBuild *b = calloc(1, sizeof *b);
    if (!b) TC_FATAL("netfile: out of memory");
    *b = (NetBuild){.m = m, .f = &f, .err = err, .errlen = errlen};
    char image[16], classes[16];
    snprintf(image, sizeof image, "%d", shape->image_size);
    snprintf(classes, sizeof classes, "%d", shape->num_classes);
    f.vars[f.n_vars++] = (NetVar){"image", image};
    f.vars[f.n_vars++] = (NetVar){"classes", classes};
    model_init(m, shape->batch, shape->num_classes, shape->nhwc);
    m->build_err = 1;
    int rc = read_file(b, text, len) == 0 && build_net(b, shape) == 0 ? 0 : -1;
    m->build_err = 0;
    netfile_free(&f, b);
    free(b);
    free(file_text);
    return rc;
}

/* ---- the shipped nets ------------------------------------------------------------------ */

typedef struct {
    const char *name, *text;
} ShippedNet;
extern const ShippedNet netfile_shipped_nets[]; /* the build's generated shipped_nets.c: nets/NAME.net */
extern const int netfile_n_shipped;

const char *netfile_shipped(const char *name) {
    for (int i = 0; i < netfile_n_shipped; i++)
        if (strcmp(netfile_shipped_nets[i].name, name) == 0) return netfile_shipped_nets[i].text;
    return NULL;
}

const char *netfile_shipped_names(void) {
    static char names[512];
    if (!names[0])
        for (int i = 0; i < netfile_n_shipped; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     netfile_shipped_nets[i].name);
    return names;
}
