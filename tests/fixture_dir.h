// Where tests/fixtures/<sub> is. A test binary may run on another machine than the one that built it
// (scripts/gpu-check.sh carries it to the GPU machine): $MIXTUNE_SOURCE_DIR names the source tree there, else the
// build's source tree (MIXTUNE_SOURCE_DIR), else the working directory (gpu-check runs from the repository root).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace mt::test {

// The first existing <root>/tests/fixtures/<sub>, or an empty path.
inline std::filesystem::path fixture_dir(const std::string& sub) {
  std::vector<std::filesystem::path> roots;
  if (const char* e = std::getenv("MIXTUNE_SOURCE_DIR"); e && *e) roots.emplace_back(e);
  roots.emplace_back(MIXTUNE_SOURCE_DIR);
  roots.push_back(std::filesystem::current_path());
  for (const auto& r : roots)
    if (std::filesystem::is_directory(r / "tests/fixtures" / sub)) return r / "tests/fixtures" / sub;
  return {};
}

}  // namespace mt::test
