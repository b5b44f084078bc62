// Per-vendor primitives: every kernel includes this and nothing vendor-specific besides.
#pragma once
#if defined(__HIPCC__) || defined(__HIP__)
#include "codegen/arch_hip.h"
#else
#include "codegen/arch_cuda.cuh"
#endif
