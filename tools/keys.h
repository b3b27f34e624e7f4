/* Every config key trainc knows, with its type, default and help. */
#ifndef TRAINC_TOOLS_KEYS_H
#define TRAINC_TOOLS_KEYS_H

#include "runtime/config.h"

extern const CfgKeySpec trainc_keys[];
extern const int trainc_n_keys;

#endif
