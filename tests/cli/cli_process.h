// The mixtune binary as a child process, for the CLI tests: start it with its output in a log file, wait
// for its exit status, read files back.
#pragma once
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace mt::test {

// The binary under test: $MIXTUNE_TEST_BINARY when set (a test binary carried to another machine, e.g. by
// scripts/gpu-session.sh), else the one this build made.
inline const char* mixtune_binary() {
  const char* env = std::getenv("MIXTUNE_TEST_BINARY");
  return env && *env ? env : MIXTUNE_BINARY;
}

// Starts `program args...` (program a path) with stdout/stderr to `log`, the variables in `unset` removed from
// its environment and those in `set` set, and a file-size limit (setrlimit(RLIMIT_FSIZE)) of `file_size_limit`
// bytes; returns the pid.
inline pid_t spawn_program(const std::string& program, const std::vector<std::string>& args,
                           const std::filesystem::path& log, const std::vector<std::string>& unset = {},
                           const std::vector<std::pair<std::string, std::string>>& set = {},
                           rlim_t file_size_limit = RLIM_INFINITY) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (file_size_limit != RLIM_INFINITY) {
      const struct rlimit lim = {file_size_limit, file_size_limit};
      if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(126);
    }
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    for (const std::string& v : unset) ::unsetenv(v.c_str());
    for (const auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Starts `mixtune args...` with stdout/stderr to `log`; returns the pid.
inline pid_t spawn_mixtune(const std::vector<std::string>& args, const std::filesystem::path& log) {
  return spawn_program(mixtune_binary(), args, log);
}

// The exit code, or 128 + the signal that killed it (as a shell reports it).
inline int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline int run_mixtune(const std::vector<std::string>& args, const std::filesystem::path& log) {
  return wait_exit(spawn_mixtune(args, log));
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct RunResult {
  int code;
  std::string out;  // stdout
  std::string err;  // stderr
};

// `mixtune ARGS` through the shell (ARGS may quote and redirect), its stdout and stderr captured.
inline RunResult run_capture(const std::string& args) {
  // One file per process: ctest runs the tests of a file in parallel processes.
  const std::filesystem::path err_file =
      std::filesystem::temp_directory_path() / ("mt_cli_stderr_" + std::to_string(::getpid()) + ".txt");
  const std::string cmd = std::string(mixtune_binary()) + " " + args + " 2>" + err_file.string();
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  std::string err = slurp(err_file);
  std::filesystem::remove(err_file);
  return {WEXITSTATUS(status), out, err};
}

}  // namespace mt::test
