// GPU collectives staged through the host (distributed/cuda/device_communicator.h): each operation waits
// for its stream, copies the device data to the host, runs the exchange over the job's TCP communicator
// (distributed/communicator.h) and copies the result back. Slow, and nothing overlaps; it exists so that
// several ranks can share one GPU (NCCL refuses that), which lets the multi-GPU training paths be checked
// on a machine with one GPU (recipe parallel.gpu_collectives: host).
//
// Sums run in the group's rank order ((x_0 + x_1) + x_2 ...) in the element type (BF16 in fp32, rounded
// once), so every rank receives bitwise the same values. A peer that dies or stalls makes the TCP
// communicator throw mt::Error naming this rank, the peer and the operation within the job's timeout.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "distributed/cuda/device_communicator.h"

namespace mt {

class HostStagedCommunicator final : public DeviceCommunicator {
 public:
  // group: the job's ranks of this communicator, in its rank order (this process's rank among them).
  HostStagedCommunicator(Communicator& host, std::vector<int> group, int device, std::string name);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_.size()); }
  int device() const override { return device_; }

  using DeviceCommunicator::all_gather;
  using DeviceCommunicator::all_reduce_sum;
  void all_reduce_sum(const std::vector<Buffer>& buffers, cudaStream_t stream, const std::string& what) override;
  void broadcast(const std::vector<Broadcast>& parts, cudaStream_t stream, const std::string& what) override;
  void reduce_sum(const std::vector<Reduce>& parts, cudaStream_t stream, const std::string& what) override;
  void all_gather(const std::vector<Gather>& parts, cudaStream_t stream, const std::string& what) override;
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype, cudaStream_t stream,
                          const std::string& what) override;
  void all_to_allv(const void* send, const std::vector<int64_t>& send_first, const std::vector<int64_t>& send_rows,
                   void* recv, const std::vector<int64_t>& recv_first, const std::vector<int64_t>& recv_rows,
                   int64_t row_bytes, cudaStream_t stream, const std::string& what) override;
  void send_recv(void* data, int64_t bytes, int from, int to, cudaStream_t stream, const std::string& what) override;
  void wait(cudaStream_t stream, const std::string& what) override;

 private:
  using Bytes = std::vector<char>;
  // send[j] to member j (j over the group, including this rank); returns what each member sent here.
  std::vector<Bytes> exchange(const std::vector<int>& members, const std::vector<Bytes>& send, const std::string& what);
  std::string label(const std::string& what) const;

  Communicator& host_;
  std::vector<int> group_;
  int rank_ = 0;
  int device_ = 0;
  std::string name_;
};

}  // namespace mt
