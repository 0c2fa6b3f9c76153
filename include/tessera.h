/*
 * tessera.h — the whole public API of libtessera.
 */
#ifndef TESSERA_H
#define TESSERA_H

#include "tessera/core.h"
#include "tessera/env.h"
#include "tessera/tensor.h"
#include "tessera/dlpack.h"
#include "tessera/ops.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/data.h"
#include "tessera/pipeline.h"
#include "tessera/ckpt.h"
#include "tessera/safetensors.h"
#include "tessera/dist.h"
#include "tessera/launch.h"
#include "tessera/ddp.h"
#include "tessera/parallel.h"
#include "tessera/train.h"
#include "tessera/run.h"
#include "tessera/export.h"

#endif
