#include "kernels/cuda/gpu_energy.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <map>
#include <mutex>

namespace mt::cuda {

namespace {

// The three NVML entry points used, by their C signatures (nvml.h: nvmlReturn_t is an int enum, NVML_SUCCESS 0;
// nvmlDevice_t an opaque pointer).
using NvmlDevice = void*;
using InitFn = int (*)();
using HandleByBusIdFn = int (*)(const char*, NvmlDevice*);
using EnergyFn = int (*)(NvmlDevice, unsigned long long*);

struct Nvml {
  HandleByBusIdFn handle_by_bus_id = nullptr;
  EnergyFn energy = nullptr;
  std::map<int, NvmlDevice> devices;  // CUDA index -> NVML handle (matched by PCI bus id: the orders may differ)
  bool ok = false;
};

Nvml& nvml() {
  static Nvml n = [] {
    Nvml r;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return r;  // kept loaded for the process's lifetime
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    r.handle_by_bus_id = reinterpret_cast<HandleByBusIdFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    r.energy = reinterpret_cast<EnergyFn>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    r.ok = init && r.handle_by_bus_id && r.energy && init() == 0;
    return r;
  }();
  return n;
}

std::mutex g_mutex;

}  // namespace

std::optional<double> gpu_energy_joules(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Nvml& n = nvml();
  if (!n.ok) return std::nullopt;
  auto it = n.devices.find(device);
  if (it == n.devices.end()) {
    char bus[64] = {};
    NvmlDevice h = nullptr;
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
      cudaGetLastError();  // the query's "invalid device" must not surface at the next CUDA call
      return std::nullopt;
    }
    if (n.handle_by_bus_id(bus, &h) != 0) return std::nullopt;
    it = n.devices.emplace(device, h).first;
  }
  unsigned long long mj = 0;
  if (n.energy(it->second, &mj) != 0) return std::nullopt;
  return static_cast<double>(mj) / 1000.0;
}

}  // namespace mt::cuda
