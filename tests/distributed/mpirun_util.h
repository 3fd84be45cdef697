// Starting a program under Open MPI's mpirun from a test: where mpirun is, and the options a test machine needs.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace mt::test {

// `name` on PATH, or "" when it is not there.
inline std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::filesystem::path p = std::filesystem::path(dirs.substr(start, end - start)) / name;
    if (end > start && ::access(p.c_str(), X_OK) == 0) return p.string();
    start = end + 1;
  }
  return "";
}

// mpirun's arguments for a test machine: root allowed (CI runs as root), more ranks than cores, no core binding
// (each rank's OpenMP threads share the cores, as under mixtune launch), LD_LIBRARY_PATH passed on when set,
// then `-np N` (after `extra`) and `program args...`.
inline std::vector<std::string> mpirun_args(int np, const std::vector<std::string>& extra, const std::string& program,
                                            const std::vector<std::string>& args) {
  std::vector<std::string> a;
  if (::geteuid() == 0) a.push_back("--allow-run-as-root");
  for (const char* o : {"--oversubscribe", "--bind-to", "none"}) a.push_back(o);
  if (std::getenv("LD_LIBRARY_PATH")) a.insert(a.end(), {"-x", "LD_LIBRARY_PATH"});
  a.push_back("-np");
  a.push_back(std::to_string(np));
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back(program);
  a.insert(a.end(), args.begin(), args.end());
  return a;
}

}  // namespace mt::test
