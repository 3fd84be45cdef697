#include "core/device.h"

#include <charconv>

#include "core/error.h"

namespace mt {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device device_parse(std::string_view s, std::string_view what) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.substr(0, 5) == "cuda:") {
    std::string_view n = s.substr(5);
    int idx = -1;
    auto [p, ec] = std::from_chars(n.data(), n.data() + n.size(), idx);
    if (ec == std::errc() && p == n.data() + n.size() && idx >= 0 && idx < 64) return Device::cuda(idx);
  }
  fail("{}: bad device '{}' (valid: cpu, cuda, cuda:N)", what, s);
}

}  // namespace mt
