// The GPU's energy counter: NVML's total energy since the driver loaded (nvmlDeviceGetTotalEnergyConsumption,
// millijoules), read through libnvidia-ml loaded at run time — no link dependency, so machines without the NVIDIA
// driver (CI) still run mixtune. Benches take differences over a timed region: joules per training step or per
// kernel call. The step runs at the H200's power cap (bench/NOTES.md 46–47), so joules, not cycles, set its time.
#pragma once
#include <optional>

namespace mt::cuda {

// Joules that CUDA device `device` has used since the driver loaded; nullopt where NVML, the device or the counter
// is unavailable (no driver, an old GPU, a virtualised one that hides it).
std::optional<double> gpu_energy_joules(int device);

}  // namespace mt::cuda
