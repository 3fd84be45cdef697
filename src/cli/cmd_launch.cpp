// mixtune launch --nproc N [--nnodes M --node-rank R --master ADDR:PORT] -- COMMAND ARGS...
// One process per rank of this node, each running `mixtune COMMAND ARGS...` with the torchrun-style
// variables set (distributed/launcher.h). The same binary also runs under mpirun or srun directly.
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "distributed/launcher.h"

namespace mt::cli {

namespace {

struct LaunchArgs {
  int nproc = 1, nnodes = 1, node_rank = 0;
  std::string master = "127.0.0.1:0";
  std::vector<std::string> command;
};

std::string self_executable() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) fail("launch: cannot find the mixtune executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("launch", "Run a mixtune command as a multi-process job (one process per rank)");
  static LaunchArgs a;
  cmd->add_option("--nproc", a.nproc, "processes (ranks) on this node")->required();
  cmd->add_option("--nnodes", a.nnodes, "nodes in the job (default 1)");
  cmd->add_option("--node-rank", a.node_rank, "this node's index (default 0)");
  cmd->add_option("--master", a.master, "rank 0's rendezvous HOST:PORT (default 127.0.0.1 and a free port)");
  cmd->add_option("command", a.command, "the command each rank runs, after '--' (e.g. -- finetune recipe.yaml)")
      ->required();
  cmd->callback([] {
    LaunchOptions o;
    o.nproc = a.nproc;
    o.nnodes = a.nnodes;
    o.node_rank = a.node_rank;
    parse_host_port(a.master, "launch: --master", &o.master_addr, &o.master_port);
    o.program = self_executable();
    o.args = a.command;
    const int rc = launch_ranks(o);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace mt::cli
