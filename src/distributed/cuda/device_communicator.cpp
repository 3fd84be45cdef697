#include "distributed/cuda/device_communicator.h"

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/cuda/host_staged_communicator.h"
#include "distributed/cuda/nccl_communicator.h"

namespace mt {

DeviceCollectives device_collectives_parse(const std::string& s, const char* what) {
  if (s == "nccl") return DeviceCollectives::nccl;
  if (s == "host") return DeviceCollectives::host;
  fail("{}: '{}' is not nccl or host", what, s);
}

std::unique_ptr<DeviceCommunicator> device_communicator_create(DeviceCollectives kind, Communicator& host, int device,
                                                               std::chrono::milliseconds timeout,
                                                               const std::vector<std::vector<int>>& groups,
                                                               const std::string& name) {
  if (kind == DeviceCollectives::nccl) return NcclCommunicator::create_group(host, device, timeout, groups, name);
  for (const auto& g : groups)
    for (int r : g)
      if (r == host.rank()) return std::make_unique<HostStagedCommunicator>(host, g, device, name);
  fail("{}: rank {} is in none of the groups", name, host.rank());
}

std::unique_ptr<DeviceCommunicator> device_communicator_create(DeviceCollectives kind, Communicator& host, int device,
                                                               std::chrono::milliseconds timeout) {
  std::vector<int> all(static_cast<size_t>(host.size()));
  for (int r = 0; r < host.size(); ++r) all[static_cast<size_t>(r)] = r;
  return device_communicator_create(kind, host, device, timeout, {all},
                                    kind == DeviceCollectives::nccl ? "NCCL" : "host-staged collectives");
}

}  // namespace mt
