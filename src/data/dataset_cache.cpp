#include "data/dataset_cache.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "core/error.h"
#include "data/tokenizer.h"

namespace mt {

namespace {
namespace fs = std::filesystem;

constexpr char kMagic[8] = {'M', 'T', 'D', 'S', 'C', 'v', '1', '\0'};

// FNV-1a, 64-bit: a cache key against accidental mismatches, not an adversary.
struct Hasher {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void str(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  void u64(uint64_t v) { bytes(&v, sizeof v); }
};

// Tokenizer does not expose its source file, so its identity is fingerprinted through the public API:
// every token string and special flag, plus encodings of a probe text that exercises the merges and the
// pre-tokenizer (digits, contractions, whitespace runs, non-Latin scripts, added tokens).
void hash_tokenizer(Hasher& h, const Tokenizer& tok) {
  const int64_t n = tok.vocab_size();
  h.u64(static_cast<uint64_t>(n));
  for (int64_t id = 0; id < n; ++id) {
    try {
      h.str(tok.id_to_token(static_cast<int32_t>(id)));
      h.u64(tok.is_special(static_cast<int32_t>(id)));
    } catch (const Error&) {
      h.u64(0xffffffffffffffffull);  // a hole in the id space
    }
  }
  static const char* const kProbes[] = {
      "The quick brown fox jumps over the lazy dog. It's 12345 o'clock, isn't it?",
      "  leading  and   trailing spaces\n\n\ttabs\r\n",
      "def f(x):\n    return x**2 + 3.14159  # comment",
      "Übergrößenträger naïve café — 東京は日本の首都です。 Привет, мир! مرحبا 😀👍",
      "<|im_start|>user\nhello<|im_end|>\n<|endoftext|><think>\n\n</think>",
  };
  for (const char* p : kProbes)
    for (int32_t id : tok.encode(p)) h.u64(static_cast<uint64_t>(static_cast<uint32_t>(id)));
}

template <typename T>
void put(std::ofstream& f, const T& v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
bool get(std::ifstream& f, T& v) {
  return static_cast<bool>(f.read(reinterpret_cast<char*>(&v), sizeof v));
}
}  // namespace

uint64_t dataset_cache_key(const DatasetOptions& options, const Tokenizer* tokenizer, int64_t vocab_size) {
  Hasher h;
  h.bytes(kMagic, sizeof kMagic);
  std::ifstream f(options.path, std::ios::binary);
  if (!f) fail("{}: cannot open", options.path);
  std::vector<char> buf(1 << 20);
  uint64_t size = 0;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<size_t>(f.gcount());
    h.bytes(buf.data(), got);
    size += got;
  }
  if (f.bad()) fail("{}: read error", options.path);
  h.u64(size);
  h.u64(tokenizer != nullptr);
  if (tokenizer) hash_tokenizer(h, *tokenizer);
  h.u64(static_cast<uint64_t>(vocab_size));
  h.u64(static_cast<uint64_t>(options.seq_len));
  h.str(options.truncation);
  h.u64(options.skip_bad_lines);
  h.u64(options.enable_thinking);
  // Only when set, so the keys of caches made before these options existed stay valid.
  // NOTE: an unset clock is not keyed: a template that prints the date keeps the date of the day the cache
  // was built, so a run resumed on another day (or ranks on both sides of midnight) gets the same tokens.
  if (!options.chat_template.empty()) h.str(options.chat_template);
  if (options.chat_now) h.u64(static_cast<uint64_t>(*options.chat_now));
  return h.h;
}

std::string dataset_cache_path(const DatasetOptions& options, uint64_t key) {
  return (fs::path(options.cache_dir) / fmt::format("{}.{:016x}.tokens", fs::path(options.path).stem().string(), key))
      .string();
}

bool dataset_cache_read(const std::string& path, uint64_t key, int64_t vocab_size, int64_t seq_len,
                        std::vector<Example>& examples, DatasetStats& stats) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::error_code ec;
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) return false;
  char magic[8];
  uint64_t k = 0;
  DatasetStats st;
  int64_t n = 0;
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0) return false;
  if (!get(f, k) || k != key) return false;
  if (!get(f, st.lines) || !get(f, st.skipped_bad_lines) || !get(f, st.truncated) || !get(f, st.dropped_too_long) ||
      !get(f, n))
    return false;
  // Each example takes at least 8 + 2*4 bytes: bound n by the file size before reserving anything.
  if (n <= 0 || static_cast<uint64_t>(n) > file_size / 16) return false;
  std::vector<Example> out(static_cast<size_t>(n));
  for (Example& ex : out) {
    int64_t len = 0;
    if (!get(f, len) || len <= 0 || len > seq_len) return false;
    ex.input_ids.resize(len);
    ex.labels.resize(len);
    if (!f.read(reinterpret_cast<char*>(ex.input_ids.data()), len * 4)) return false;
    if (!f.read(reinterpret_cast<char*>(ex.labels.data()), len * 4)) return false;
    for (int64_t i = 0; i < len; ++i) {
      if (ex.input_ids[i] < 0 || ex.input_ids[i] >= vocab_size) return false;
      if (ex.labels[i] != -100 && (ex.labels[i] < 0 || ex.labels[i] >= vocab_size)) return false;
      st.tokens += 1;
      st.trained_tokens += ex.labels[i] != -100;
    }
  }
  if (f.peek() != std::char_traits<char>::eof()) return false;  // trailing bytes: not a file we wrote
  st.examples = n;
  st.from_cache = true;
  examples = std::move(out);
  stats = st;
  return true;
}

void dataset_cache_write(const std::string& path, uint64_t key, const std::vector<Example>& examples,
                         const DatasetStats& stats) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) fail("data.cache_dir: cannot create '{}': {}", fs::path(path).parent_path().string(), ec.message());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("data.cache_dir: cannot write '{}'", tmp);
    f.write(kMagic, sizeof kMagic);
    put(f, key);
    put(f, stats.lines);
    put(f, stats.skipped_bad_lines);
    put(f, stats.truncated);
    put(f, stats.dropped_too_long);
    put(f, static_cast<int64_t>(examples.size()));
    for (const Example& ex : examples) {
      put(f, static_cast<int64_t>(ex.input_ids.size()));
      f.write(reinterpret_cast<const char*>(ex.input_ids.data()), static_cast<std::streamsize>(ex.input_ids.size() * 4));
      f.write(reinterpret_cast<const char*>(ex.labels.data()), static_cast<std::streamsize>(ex.labels.size() * 4));
    }
    f.flush();
    if (!f) {
      f.close();
      fs::remove(tmp, ec);
      fail("data.cache_dir: cannot write '{}' (disk full?)", tmp);
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ec2;
    fs::remove(tmp, ec2);
    fail("data.cache_dir: cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  }
}

}  // namespace mt
