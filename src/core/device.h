// Where a tensor's bytes live. The CPU backend is the reference; CUDA slots in next to it.
#pragma once
#include <string>
#include <string_view>

namespace mt {

enum class DeviceType { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// Parses "cpu", "cuda", "cuda:N". Throws mt::Error naming `what` on a bad spelling.
Device device_parse(std::string_view s, std::string_view what = "device");

}  // namespace mt
