/* trainc predict: classify image files with a checkpoint, needing no config.
 * The checkpoint's meta section gives the net, the image size, the
 * normalisation and the class names; each image is decoded and prepared as
 * the test loader prepares one (a bilinear resize to image_size, or with the
 * ImageNet recipe's eval_resize the shorter side resized and the centre crop;
 * the same mean and std; NCHW fp32 into the model's input), run through the inference path
 * (models/infer.h: batch norm folded from its running statistics; fp16 NHWC
 * on the GPU) and its softmax's top-k printed by class name. */
#ifndef TRAINC_TOOLS_TRAINER_PREDICT_H
#define TRAINC_TOOLS_TRAINER_PREDICT_H

/* argv[0] is "predict"; the rest: --checkpoint FILE [--top K] [--json]
 * [--device cpu|cuda] IMAGE... Returns the exit status (0, 1 on bad input, 2
 * on a bad command line). */
int predict_main(int argc, char **argv);

#endif
