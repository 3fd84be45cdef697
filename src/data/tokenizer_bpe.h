// The byte-level BPE model of a tokenizer.json: vocabulary, ranked merges and HF's merge loop
// (models/bpe/word.rs `Word::merge_all`: a min-heap of (rank, position) over a linked list of
// symbols, stale entries skipped). Pieces arrive as raw bytes; the GPT-2 byte-to-unicode map is
// applied here, so symbol ids come straight from a 256-entry table.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mt {

// GPT-2 bytes_to_unicode: byte -> UTF-8 of its printable stand-in (space -> "Ġ", '\n' -> "Ċ").
const std::array<std::string, 256>& byte_level_chars();
// Inverse for decoding: code point -> byte, or -1 when the code point is not a stand-in.
int byte_level_byte_of(uint32_t code_point);

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// (left id, right id) -> (rank, merged id), open addressing on the packed uint64 key.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t new_id = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void reserve(size_t n);
  void insert_or_assign(int32_t left, int32_t right, uint32_t rank, int32_t new_id);
  const Entry* find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot_of(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t count_ = 0;
};

class BpeModel {
 public:
  // `merges` in rank order (rank = index; a repeated pair keeps its last rank, as HF's map does).
  // Errors name `where` (the file) and the offending field.
  BpeModel(TokenIdMap vocab, const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
           const std::string& where);

  // Appends the ids of one pre-tokenized piece (raw bytes). Thread-safe.
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when no token has this id
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }

 private:
  void merge_bytes(std::string_view bytes, std::vector<int32_t>& out) const;

  TokenIdMap vocab_;
  std::vector<const std::string*> id_to_token_;  // points into vocab_ keys
  MergeTable merges_;
  std::array<int32_t, 256> byte_id_{};  // vocab id of each byte's stand-in, -1 if absent
  bool ignore_merges_ = false;

  // piece bytes -> ids; pieces under 256 bytes, bounded like HF's BPE cache.
  static constexpr size_t kCacheMaxPiece = 256;
  static constexpr size_t kCacheCapacity = 100000;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace mt
