#include "distributed/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "distributed/tcp_socket.h"

namespace mt {

namespace {

volatile sig_atomic_t g_forward_signal = 0;

extern "C" void on_launch_signal(int sig) { g_forward_signal = sig; }

int status_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

void parse_host_port(const std::string& s, const char* what, std::string* host, int* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    fail("{}: '{}' is not HOST:PORT", what, s);
  const std::string p = s.substr(colon + 1);
  char* end = nullptr;
  const long v = std::strtol(p.c_str(), &end, 10);
  if (*end != '\0' || v < 0 || v > 65535) fail("{}: '{}' has no valid port (0..65535)", what, s);
  *host = s.substr(0, colon);
  *port = static_cast<int>(v);
}

int launch_ranks(const LaunchOptions& o) {
  if (o.nproc < 1 || o.nproc > 1024) fail("launch: --nproc {} must be in 1..1024", o.nproc);
  if (o.nnodes < 1) fail("launch: --nnodes {} must be at least 1", o.nnodes);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    fail("launch: --node-rank {} must be below --nnodes {}", o.node_rank, o.nnodes);
  if (o.args.empty()) fail("launch: no command after '--' (e.g. mixtune launch --nproc 2 -- finetune recipe.yaml)");
  int port = o.master_port;
  Socket rendezvous;  // with an automatic port: the listener itself, handed to rank 0 (no bind race)
  if (port == 0) {
    if (o.nnodes > 1) fail("launch: --master needs an explicit port when --nnodes > 1");
    rendezvous = tcp_listen(o.master_addr, 0, &port, "launch: rendezvous listener");
  }
  const int world = o.nnodes * o.nproc;

  std::vector<pid_t> pids(o.nproc, -1);
  for (int i = 0; i < o.nproc; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) fail("launch: fork: {}", std::strerror(errno));
    if (pid == 0) {
      ::setenv("RANK", std::to_string(o.node_rank * o.nproc + i).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (rendezvous.valid() && o.node_rank * o.nproc + i == 0) {
        // Rank 0 inherits the listening socket (it was opened close-on-exec) and is told its number.
        const int fd = rendezvous.fd();
        ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) & ~FD_CLOEXEC);
        ::setenv(kRendezvousFdVar, std::to_string(fd).c_str(), 1);
      }
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(o.program.c_str()));
      for (const auto& a : o.args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(o.program.c_str(), argv.data());
      std::fprintf(stderr, "mixtune: error: launch: cannot run %s: %s\n", o.program.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    pids[i] = pid;
  }
  rendezvous.close();  // rank 0 holds it now

  struct sigaction sa {};
  sa.sa_handler = on_launch_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  int result = 0, alive = o.nproc, first_failed = -1;
  std::chrono::steady_clock::time_point kill_at{};
  bool terminating = false;
  // After a forwarded SIGINT/SIGTERM the ranks stop on their own (finetune agrees on a step, rank 0 writes a
  // checkpoint): their 130/143 exits are not failures to stop the others for (a second signal would kill
  // rank 0 in the middle of its checkpoint).
  bool stopping = false;
  while (alive > 0) {
    if (g_forward_signal) {
      for (pid_t p : pids)
        if (p > 0) ::kill(p, g_forward_signal);
      g_forward_signal = 0;
      stopping = true;
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (int i = 0; i < o.nproc; ++i) {
        if (pids[i] != done) continue;
        pids[i] = -1;
        --alive;
        const int code = status_code(status);
        if (code != 0 && first_failed < 0 && stopping) {
          first_failed = i;
          result = code;
        } else if (code != 0 && first_failed < 0) {
          first_failed = i;
          result = code;
          std::fprintf(stderr, "mixtune: launch: rank %d exited with status %d; stopping the other ranks\n",
                       o.node_rank * o.nproc + i, code);
          for (pid_t p : pids)
            if (p > 0) ::kill(p, SIGTERM);
          terminating = true;
          kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(o.grace_seconds);
        }
      }
      continue;
    }
    if (done < 0 && errno != EINTR) break;
    if (terminating && std::chrono::steady_clock::now() >= kill_at) {
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL);
      terminating = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sa.sa_handler = SIG_DFL;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  return result;
}

}  // namespace mt
