/* cuda_runtime.h - the emulator's: the runtime API (cuda/emu/cuda_runtime_api.h). */
#include "cuda_runtime_api.h"
