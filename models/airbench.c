/* airbench94's net (K. Jordan, arXiv 2404.00498; tools/torch_airbench.py is
 * the PyTorch reference, whose module names the layers carry): a 2x2
 * whitening convolution 3 -> 24 with a bias, GELU; three blocks of
 * conv3x3 (no bias) -> 2x2 max-pool -> BN -> GELU -> conv3x3 (no bias) -> BN
 * -> GELU, widths 64, 256, 256 in the recipe (32 -> 31, then 15, 7, 3); the max over the
 * last 3x3 map, a linear layer without bias, the logits times 1/9. The
 * whitening weights are set from the data (models/whiten.h) and never trained;
 * the blocks' convolutions start with their first filters as the identity
 * (the recipe's --dirac). */
#include "models/zoo.h"

void airbench_build(Model *m, const int widths[3]) {
    int x = model_input(m, 3, 32, 32);
    x = model_conv(m, x, 24, 2, 0, 1);
    model_name_last(m, "whiten");
    model_mark_whitening(m);
    x = model_gelu(m, x);
    for (int block = 0; block < 3; block++) {
        x = model_conv_no_bias(m, x, widths[block], 3, 1, 1);
        model_name_last(m, "blocks.%d.conv1", block);
        model_dirac_last(m);
        x = model_maxpool2(m, x);
        x = model_batchnorm(m, x);
        model_name_last(m, "blocks.%d.norm1", block);
        x = model_gelu(m, x);
        x = model_conv_no_bias(m, x, widths[block], 3, 1, 1);
        model_name_last(m, "blocks.%d.conv2", block);
        model_dirac_last(m);
        x = model_batchnorm(m, x);
        model_name_last(m, "blocks.%d.norm2", block);
        x = model_gelu(m, x);
    }
    x = model_global_maxpool(m, x);
    x = model_linear_no_bias(m, x, m->num_classes);
    model_name_last(m, "head");
    model_scale(m, x, 1.0f / 9.0f);
}
