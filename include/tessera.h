/*
 * tessera.h — the whole public API of libtessera.
 */
#ifndef TESSERA_H
#define TESSERA_H

#include "tessera/core.h"
#include "tessera/tensor.h"
#include "tessera/ops.h"

#endif
