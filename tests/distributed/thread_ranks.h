// Runs the ranks of a CPU job as threads of one test process, over loopback TCP.
#pragma once
#include <exception>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "distributed/process_group_env.h"
#include "distributed/tcp_socket.h"

namespace mt::test {

// A loopback port for a test's rendezvous, free when checked. Drawn at random below the kernel's ephemeral range
// (ip_local_port_range): a port the kernel handed out (bind to 0) is closed again before the ranks listen on it,
// and in that gap the kernel may give it to another test process's outgoing connection as its local port
// ("Address already in use" under a parallel ctest); below the range only a test drawing the same number can.
inline int free_port() {
  int ephemeral_low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(range >> ephemeral_low) || ephemeral_low < 12000) ephemeral_low = 32768;
  std::mt19937 g(std::random_device{}());
  std::uniform_int_distribution<int> pick(10000, ephemeral_low - 1);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = pick(g);
    try {
      tcp_listen("127.0.0.1", port, nullptr, "test: free port");  // closed again on return
      return port;
    } catch (const std::exception&) {
      // taken: draw again
    }
  }
  int port = 0;  // every draw taken: let the kernel pick one
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
