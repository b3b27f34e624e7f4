/* trainc eval: a checkpoint's accuracy on the test split. The net is rebuilt
 * from the checkpoint (its net section; an older one's by meta's name), its
 * input size, classes, layout and normalisation taken from it
 * (checkpoint_config.h: a config beside it gives the data and may not
 * contradict it), and its weights loaded through the resume path, whose
 * refusals name --checkpoint; the test loader's
 * batches (the same as the end-of-epoch evaluation's) go through the
 * inference path the weights compile to (models/infer.h; on the GPU half
 * precision, whose accuracy stays within 0.1 point of the training path's).
 * Under mpirun each rank takes its shard of the test set and the counts are
 * summed. */
#ifndef TRAINC_TOOLS_TRAINER_EVAL_H
#define TRAINC_TOOLS_TRAINER_EVAL_H

#include <stdio.h>

#include "dist/dist.h"
#include "runtime/config.h"

typedef struct {
    char checkpoint[4200];
    char model[32];
    char device[16];
    long step;             /* the checkpoint's optimizer step */
    int classes;           /* model.num_classes: logits per image */
    long n;                /* test images evaluated, all ranks together */
    long top1, top5;       /* images whose label is the argmax (first on ties); among the 5 largest */
    double loss_sum;       /* cross-entropy (no label smoothing), summed over the images */
    long *confusion;       /* [true class][predicted class], classes x classes */
    char (*names)[64];     /* the test split's class names (the data set's), or NULL where it gives none */
} EvalReport;

/* Sets in cfg what the checkpoint fixes (and turns off what a run writes),
 * then evaluates on every rank; every rank gets the whole report. Bad input (a
 * missing or corrupt checkpoint, a config contradicting it, no test split)
 * ends the process with a message naming the file or key. */
void eval_run(Config *cfg, Dist *dist, const char *checkpoint, EvalReport *r);
/* top-1, top-5 (more than 5 classes), loss, per-class accuracy and the
 * confusion matrix (up to EVAL_MATRIX_TEXT_MAX classes) as text. */
#define EVAL_MATRIX_TEXT_MAX 32
void eval_print(const EvalReport *r, FILE *f);
/* Per-class accuracy and the confusion matrix as one CSV table (through
 * files_open_output: never over an input or a checkpoint); 0, or -1 with the
 * reason in err. */
int eval_write_csv(const EvalReport *r, const char *path, char *err, size_t errlen);
/* One JSON line: checkpoint, step, n, classes, top1, top5 (null with 5 classes or fewer), loss. */
void eval_print_json(const EvalReport *r, FILE *f);
void eval_report_free(EvalReport *r);

static inline double eval_top1(const EvalReport *r) { return r->n ? (double)r->top1 / (double)r->n : 0; }

#endif
