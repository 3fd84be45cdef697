// `mixtune launch`: starts one process per local rank of this node with the torchrun-style variables
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), waits for them, and makes
// the job fail as a whole: when one rank exits non-zero or is killed, the others get SIGTERM (then
// SIGKILL after a grace period) and launch exits with the first failing rank's status. SIGINT/SIGTERM
// sent to launch are forwarded to every rank (finetune then checkpoints and exits); from then on the ranks
// are left to exit on their own. With an automatic port (--master HOST:0, the default) launch opens the
// rendezvous listener itself and rank 0 inherits it (kRendezvousFdVar): no other process can take the port.
#pragma once
#include <string>
#include <vector>

#include "distributed/process_group_env.h"  // kRendezvousFdVar

namespace mt {

struct LaunchOptions {
  int nproc = 1;                 // processes on this node
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;           // 0: a free port on this machine (single node only)
  std::string program;           // the executable each rank runs (mixtune itself)
  std::vector<std::string> args; // its arguments, e.g. {"finetune", "recipe.yaml"}
  int grace_seconds = 10;        // SIGTERM -> SIGKILL delay for the surviving ranks
};

// Runs the job; returns the exit status for launch (0, or the first failing rank's exit code / 128 + signal).
// Throws mt::Error for bad options.
int launch_ranks(const LaunchOptions& o);

// "host:port" -> host, port (port 0 allowed); mt::Error naming `what` otherwise.
void parse_host_port(const std::string& s, const char* what, std::string* host, int* port);

}  // namespace mt
