// Collectives between the processes of one training job. Every collective takes `what` (the operation
// and the data, e.g. "all_reduce(gradients, step 12)") for its error messages, and throws mt::Error naming
// this rank, the peer and `what` when a peer dies, closes its connection, calls a different collective, or
// does not answer within the job's timeout: no rank hangs.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group_env.h"

namespace mt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place element-wise sum over the ranks. Every rank receives bitwise the same values, summed in rank
  // order ((x_0 + x_1) + x_2 ...), so a run does not depend on message timing.
  virtual void all_reduce_sum(float* data, int64_t n, const std::string& what) = 0;
  virtual void all_reduce_sum(double* data, int64_t n, const std::string& what) = 0;
  // The same within `group` (ranks, the same list on every member, this rank among them), summed in the
  // list's order: the expert gradients of the ranks holding the same experts, the experts' squared norms over
  // an expert-parallel group. A group of one leaves the data as it is.
  virtual void all_reduce_sum(const std::vector<int>& group, float* data, int64_t n, const std::string& what) = 0;
  virtual void all_reduce_sum(const std::vector<int>& group, double* data, int64_t n, const std::string& what) = 0;
  // In-place on root: the element-wise sum over the ranks, bitwise what all_reduce_sum gives (rank order);
  // the other ranks' data is left as it was. Half an all-reduce's traffic when only one rank needs the sum.
  virtual void reduce_sum(float* data, int64_t n, int root, const std::string& what) = 0;
  // The same within `group` (root a member): the sum in the list's order, bitwise what all_reduce_sum over the
  // group gives (the expert gradients onto their owner among the ranks holding the same experts).
  virtual void reduce_sum(const std::vector<int>& group, float* data, int64_t n, int root, const std::string& what) = 0;
  // root's bytes to every rank.
  virtual void broadcast(void* data, size_t bytes, int root, const std::string& what) = 0;
  // root's bytes to every member of `group` (root a member).
  virtual void broadcast(const std::vector<int>& group, void* data, size_t bytes, int root, const std::string& what) = 0;
  // Within `group` (ranks, the same list on every member, this rank among them): send[j] goes to group[j],
  // recv[j] receives what group[j] sent to this rank (any size, including zero).
  virtual void all_to_allv(const std::vector<int>& group, const std::vector<std::vector<float>>& send,
                           std::vector<std::vector<float>>& recv, const std::string& what) = 0;
  virtual void barrier(const std::string& what) = 0;
};

// The CPU communicator: a TCP rendezvous at env.master_addr:master_port (rank 0 listens at that port on every
// interface, or on env.rendezvous_fd), then a full mesh of TCP connections between the ranks. `timeout` bounds
// the rendezvous and every collective.
std::unique_ptr<Communicator> tcp_communicator_create(const ProcessGroupEnv& env, std::chrono::milliseconds timeout);

}  // namespace mt
