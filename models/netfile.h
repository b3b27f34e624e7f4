/* Nets written as text (docs/nets.md): an INI file (runtime/ini.h) whose
 * [net] section lists the layers in order, one a line,
 *
 *     conv1 = conv 64 7 stride=2 pad=3 bias=no    # name = kind, arguments
 *     relu                                        # a layer no one names
 *     layer1 = repeat 2 basic 64                  # a [block basic] used twice: layer1.0, layer1.1
 *
 * and whose [block NAME] sections are templates with parameters. Each layer
 * reads the one before (from=NAME: an earlier one); names become the module
 * names of the tensors (models/tensors.h). The shape inference is the
 * builders' (models/model.h): their failures come back as errors naming the
 * file, the line and the layer. Adding a layer kind is one entry in
 * netfile.c's net_kinds. */
#ifndef TRAINC_MODELS_NETFILE_H
#define TRAINC_MODELS_NETFILE_H

#include <stddef.h>

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The variables every net sees: {image} (the input's height and width) and {classes}. */
typedef struct {
    int batch, image_size, num_classes, nhwc;
} NetShape;

/* Builds the net in the file path (text NULL: read from it; else its text, path only naming it in
 * messages) into m, which it model_init's; returns 0, or -1 with a message in err
 * ("nets/x.net:12: layer conv1: ..."). */
int netfile_build(Model *m, const char *path, const char *text, const NetShape *shape, char *err, size_t errlen);

/* The text of the shipped net name (nets/NAME.net, embedded at build time), or NULL. */
const char *netfile_shipped(const char *name);
/* The shipped nets' names, ", " between them ("airbench, resnet18, ..."). */
const char *netfile_shipped_names(void);

#ifdef __cplusplus
}
#endif
#endif
