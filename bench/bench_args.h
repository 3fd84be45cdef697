// The kernel benches' command lines: "--name N" pairs, each N a positive integer.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace mt_bench {

struct IntOption {
  const char* name;  // with the dashes, e.g. "--tokens"
  int64_t* value;
};

// Sets each named option from argv; an unknown name, a missing value or one that is not a positive integer prints
// the problem and `usage` to stderr and exits with status 2.
inline void parse_int_options(int argc, char** argv, const std::vector<IntOption>& options, const char* usage) {
  auto fail = [&](const char* what, const char* arg) {
    std::fprintf(stderr, "%s %s\nusage: %s\n", what, arg, usage);
    std::exit(2);
  };
  for (int i = 1; i < argc; i += 2) {
    const IntOption* opt = nullptr;
    for (const IntOption& o : options)
      if (std::strcmp(argv[i], o.name) == 0) opt = &o;
    if (!opt) fail("unknown option", argv[i]);
    if (i + 1 >= argc) fail("missing the value of", argv[i]);
    char* end = nullptr;
    const long long v = std::strtoll(argv[i + 1], &end, 10);
    if (end == argv[i + 1] || *end != '\0' || v <= 0) fail("not a positive integer:", argv[i + 1]);
    *opt->value = v;
  }
}

}  // namespace mt_bench
