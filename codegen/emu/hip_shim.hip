// A HIP runtime for the host half of a generated module, compiled for the CPU: every kernel
// launch the shipped launcher makes goes to the AMD ISA emulator (codegen/emu), and its device
// queries are answered for the emulated device. Only what the launchers call is here; the
// declarations come from the HIP headers, so the compiler checks every signature.
#include <hip/hip_runtime.h>

namespace {

constexpr int kMaxKernels = 64, kMaxDevices = 8;
const void* g_stubs[kMaxKernels];   // host stub -> device symbol, from the module's registration
const char* g_names[kMaxKernels];
int g_kernels = 0;
struct Device { int cus, lds_per_block; };
Device g_devices[kMaxDevices] = {};
int g_current = 0;
hipError_t g_last_error = hipSuccess;
dim3 g_grid, g_block;               // the <<<>>> configuration being launched
size_t g_shmem = 0;
hipStream_t g_stream = nullptr;

using LaunchFn = int (*)(const char* name, const unsigned* grid, const unsigned* block,
                         void** args, size_t shmem);
using OccupancyFn = int (*)(const char* name, int block, size_t shmem);
LaunchFn g_launch = nullptr;
OccupancyFn g_occupancy = nullptr;

const char* name_of(const void* stub) {
  for (int i = 0; i < g_kernels; ++i)
    if (g_stubs[i] == stub) return g_names[i];
  return nullptr;
}

hipError_t fail(hipError_t err) { return g_last_error = err; }

}  // namespace

extern "C" {

// The bytes clang's host pass registers (-fuse-cuid=none gives them this name); the emulator loads the
// device code object itself.
extern const char __hip_fatbin[16] = {};

void** __hipRegisterFatBinary(const void*) {
  static void* handle = nullptr;
  return &handle;
}
void __hipUnregisterFatBinary(void**) {}
void __hipRegisterFunction(void**, const void* stub, char*, const char* name, unsigned int,
                           uint3*, uint3*, dim3*, dim3*, int*) {
  if (g_kernels < kMaxKernels) g_stubs[g_kernels] = stub, g_names[g_kernels++] = name;
}

// The emulator side: its two callbacks, and the devices it models (the index hipGetDevice
// answers). Several devices keep the launchers' per-device caches apart.
void cg_emu_set_callbacks(LaunchFn launch, OccupancyFn occupancy) {
  g_launch = launch, g_occupancy = occupancy;
}
int cg_emu_set_device(int device, int cus, int lds_per_block) {
  if (device < 0 || device >= kMaxDevices) return hipErrorInvalidDevice;
  g_devices[device] = Device{cus, lds_per_block};
  g_current = device;
  return hipSuccess;
}

}  // extern "C"

hipError_t __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shmem, hipStream_t stream) {
  g_grid = grid, g_block = block, g_shmem = shmem, g_stream = stream;
  return hipSuccess;
}
hipError_t __hipPopCallConfiguration(dim3* grid, dim3* block, size_t* shmem,
                                     hipStream_t* stream) {
  *grid = g_grid, *block = g_block, *shmem = g_shmem, *stream = g_stream;
  return hipSuccess;
}

hipError_t hipLaunchKernel(const void* stub, dim3 grid, dim3 block, void** args, size_t shmem,
                           hipStream_t) {
  const char* name = name_of(stub);
  if (!name) return fail(hipErrorInvalidDeviceFunction);
  if (!g_launch) return fail(hipErrorLaunchFailure);
  const unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
  return g_launch(name, g, b, args, shmem) ? fail(hipErrorLaunchFailure) : hipSuccess;
}

hipError_t hipGetLastError() {
  const hipError_t err = g_last_error;
  g_last_error = hipSuccess;
  return err;
}

hipError_t hipGetDevice(int* device) {
  *device = g_current;
  return hipSuccess;
}

hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device) {
  if (device < 0 || device >= kMaxDevices) return fail(hipErrorInvalidDevice);
  const Device& d = g_devices[device];
  switch (attr) {
    case hipDeviceAttributeMultiprocessorCount: *value = d.cus; return hipSuccess;
    case hipDeviceAttributeSharedMemPerBlockOptin:
    case hipDeviceAttributeMaxSharedMemoryPerBlock: *value = d.lds_per_block; return hipSuccess;
    default: *value = 0; return fail(hipErrorInvalidValue);
  }
}

hipError_t hipFuncSetAttribute(const void* stub, hipFuncAttribute, int) {
  return name_of(stub) ? hipSuccess : fail(hipErrorInvalidDeviceFunction);
}

hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* stub,
                                                        int block, size_t shmem) {
  const char* name = name_of(stub);
  if (!name || !g_occupancy) return fail(hipErrorInvalidDeviceFunction);
  *blocks = g_occupancy(name, block, shmem);
  return hipSuccess;
}
