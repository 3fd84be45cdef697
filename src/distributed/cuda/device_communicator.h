// Collectives between the GPUs of one job, on device memory and queued on a CUDA stream. Two
// implementations: NCCL (nccl_communicator.h, the one a real job uses) and a host-staged one
// (host_staged_communicator.h) that copies through the host and the job's TCP communicator, so the
// distributed logic of the CUDA engine also runs with several ranks sharing one GPU (NCCL refuses two
// ranks on one device). Both give every rank the same values; only NCCL overlaps with compute.
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mt {

class Communicator;

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int device() const = 0;

  // Several in-place sums over the ranks (F32, F64, BF16). Every rank receives the same values.
  struct Buffer {
    void* data;
    int64_t count;
    DType dtype;
  };
  virtual void all_reduce_sum(const std::vector<Buffer>& buffers, cudaStream_t stream, const std::string& what) = 0;
  void all_reduce_sum(void* data, int64_t count, DType dtype, cudaStream_t stream, const std::string& what) {
    all_reduce_sum(std::vector<Buffer>{{data, count, dtype}}, stream, what);
  }
  // Several in-place broadcasts, each from its own root rank.
  struct Broadcast {
    void* data;
    int64_t count;
    DType dtype;
    int root;
  };
  virtual void broadcast(const std::vector<Broadcast>& parts, cudaStream_t stream, const std::string& what) = 0;
  // Several in-place sums, each onto its own root rank (F32, F64, BF16); the other ranks' data is left as it
  // was. Half an all-reduce's traffic when only one rank needs the sum.
  struct Reduce {
    void* data;
    int64_t count;
    DType dtype;
    int root;
  };
  virtual void reduce_sum(const std::vector<Reduce>& parts, cudaStream_t stream, const std::string& what) = 0;
  // Several all-gathers: recv[r·count .. (r+1)·count) = rank r's send (count elements of dtype).
  struct Gather {
    const void* send;
    void* recv;
    int64_t count;
    DType dtype;
  };
  virtual void all_gather(const std::vector<Gather>& parts, cudaStream_t stream, const std::string& what) = 0;
  void all_gather(const void* send, void* recv, int64_t count, DType dtype, cudaStream_t stream,
                  const std::string& what) {
    all_gather(std::vector<Gather>{{send, recv, count, dtype}}, stream, what);
  }
  // recv (count elements) = Σ over ranks of their send[rank()·count .. (rank()+1)·count) (F32, F64, BF16).
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype, cudaStream_t stream,
                                  const std::string& what) = 0;
  // Rows of row_bytes: send_rows[j] rows starting at row send_first[j] of `send` go to rank j; rank j's rows
  // for this rank land at row recv_first[j] of `recv` (recv_rows[j] of them). This rank's own rows are a
  // device-to-device copy.
  virtual void all_to_allv(const void* send, const std::vector<int64_t>& send_first,
                           const std::vector<int64_t>& send_rows, void* recv, const std::vector<int64_t>& recv_first,
                           const std::vector<int64_t>& recv_rows, int64_t row_bytes, cudaStream_t stream,
                           const std::string& what) = 0;
  // bytes from `data` on rank `from` to `data` on rank `to` (both call it; other ranks must not).
  virtual void send_recv(void* data, int64_t bytes, int from, int to, cudaStream_t stream,
                         const std::string& what) = 0;
  // Blocks until `stream` is done, bounded by the job's timeout.
  virtual void wait(cudaStream_t stream, const std::string& what) = 0;
};

// Which implementation a job's GPU collectives use (recipe parallel.gpu_collectives).
enum class DeviceCollectives { nccl, host };
DeviceCollectives device_collectives_parse(const std::string& s, const char* what);

// Collective over every rank of `host`: `groups` partitions the job's ranks (the same list on every rank);
// this rank joins a communicator among the members of its group, ranked in the listed order. `name` appears
// in error messages ("expert-parallel group"); `device` is this rank's GPU.
std::unique_ptr<DeviceCommunicator> device_communicator_create(DeviceCollectives kind, Communicator& host, int device,
                                                               std::chrono::milliseconds timeout,
                                                               const std::vector<std::vector<int>>& groups,
                                                               const std::string& name);
// Every rank of `host` in one group ("NCCL" / "host-staged" in messages).
std::unique_ptr<DeviceCommunicator> device_communicator_create(DeviceCollectives kind, Communicator& host, int device,
                                                               std::chrono::milliseconds timeout);

}  // namespace mt
