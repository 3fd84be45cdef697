// Runs the ranks of a CPU job as threads of one test process, over loopback TCP.
#pragma once
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/process_group_env.h"
#include "distributed/tcp_socket.h"

namespace mt::test {

inline int free_port() {
  int port = 0;
  tcp_listen("127.0.0.1", 0, &port, "test: free port");
  return port;
}

inline ProcessGroupEnv env_of(int rank, int world, int port) {
  ProcessGroupEnv e;
  e.rank = rank;
  e.world = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

// Runs body(rank) on `world` threads; returns each rank's error message ("" = none).
inline std::vector<std::string> run_ranks(int world, const std::function<void(int)>& body) {
  std::vector<std::string> err(world);
  std::vector<std::thread> t;
  for (int r = 0; r < world; ++r)
    t.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  for (auto& x : t) x.join();
  return err;
}

}  // namespace mt::test
