/* Named tensors out of trainc and back in: the checkpoint's "meta" and
 * "tensors" sections, trainc export (safetensors under PyTorch's names) and
 * run.init_from (a safetensors file into the built model).
 *
 *   meta     JSON: {"model", "num_classes", "image_size", "in_channels",
 *            "layout", "mean": [3], "std": [3], "eval_resize", "bn_eps": [1], "class_names": [...],
 *            "data_source" (data.source; absent before it was recorded)}
 *            (eval_resize: the shorter side an image is resized to before its centre
 *            crop of image_size; 0 or absent: the whole image resized to image_size)
 *   tensors  JSON: [{"name", "shape", "dtype": "F32", "section": "params" or
 *            "bn_stats", "offset" (floats, the model's layout)}, ...]
 *
 * A safetensors file: an 8-byte little-endian header length, the JSON header
 * {name: {"dtype": "F32", "shape": [...], "data_offsets": [a, b]}, ...,
 * "__metadata__": {string: string}} padded with spaces to 8 bytes, then the
 * tensors' bytes back to back (offsets from the data's start), NCHW fp32. */
#ifndef TRAINC_TOOLS_TRAINER_EXPORT_H
#define TRAINC_TOOLS_TRAINER_EXPORT_H

#include <stddef.h>

#include "data/dataset.h"
#include "models/model.h"
#include "models/tensors.h"

struct cJSON;
struct CkptFile;

/* How an image becomes the net's input, as the evaluation prepares it. */
typedef struct {
    int image_size;
    int eval_resize;       /* 0: the whole image resized to image_size */
    float mean[3], std[3];
    const char *source;    /* data.source it was trained on (meta's data_source); NULL: not recorded */
} InputPreparation;

/* The two sections' JSON text (malloc'ed) for a model whose input is
 * prepared as prep, its classes named (NULL: "class0", ...). */
char *export_meta_json(const Model *m, const char *model_name, const InputPreparation *prep,
                       char *const *class_names, int n_names);
char *export_tensors_json(const Model *m);

/* A checkpoint's section as a NUL-terminated string (malloc'ed), or NULL: absent (err ""), or unreadable
 * (err says why). */
char *checkpoint_text_section(struct CkptFile *f, const char *name, char *err, size_t errlen);
/* A section as JSON, or NULL with a message naming the file in err: absent (from a trainc before named
 * tensors), unreadable, or not JSON. */
struct cJSON *checkpoint_json_section(struct CkptFile *f, const char *name, char *err, size_t errlen);

/* A checkpoint's meta section and weights, its tensor table checked against
 * the model its meta names (built at batch 1: shapes only, nothing allocated). */
typedef struct {
    struct cJSON *meta;
    char *net_text;           /* the net file the model is built from; NULL: an older checkpoint's, by name */
    Model *model;
    ModelTensor *tensors;
    int n_tensors;
    float *params, *bn_stats; /* the checkpoint's sections, in model's layout */
} CheckpointWeights;

/* 0, or -1 with a message naming the file in err: unreadable, corrupt, of a
 * trainc before named tensors (no meta section), or another trainc's layout. */
int checkpoint_weights_read(const char *path, CheckpointWeights *w, char *err, size_t errlen);
void checkpoint_weights_free(CheckpointWeights *w);
/* The net meta names, built for batch images (not finalized, calloc'ed) from net_text, the checkpoint's
 * net file (NULL: one from before it kept it, by meta's name); nhwc -1: the layout meta names. NULL with a
 * message naming path in err. */
Model *model_of_meta(const struct cJSON *meta, const char *net_text, int batch, int nhwc, const char *path, char *err,
                     size_t errlen);
/* w's tensors into m: the same net, finalized, in either layout. */
void checkpoint_weights_put(const CheckpointWeights *w, Model *m);

/* 0 when every tensor of m in params (model layout) and bn_stats is finite (a
 * NULL array's tensors are skipped), else -1 naming path, the tensor and its
 * first non-finite element in err. */
int model_weights_check_finite(const Model *m, const float *params, const float *bn_stats, const char *path,
                               char *err, size_t errlen);

/* argv[0] is "export"; the rest: --checkpoint FILE --format safetensors --out
 * FILE. Returns the exit status (0, 1 on bad input, 2 on a bad command line). */
int export_main(int argc, char **argv);

/* Loads every tensor of m from a safetensors file into its parameters and
 * running statistics; 0, or -1 with a message naming the file (and the
 * tensor) in err: unreadable, not safetensors, a tensor missing, extra,
 * of another shape or not F32. */
int import_safetensors(Model *m, const char *path, char *err, size_t errlen);

#endif
