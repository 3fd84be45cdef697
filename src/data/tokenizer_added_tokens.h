// Added-token matching: leftmost-longest over a byte trie, the same matches as HF's
// Aho-Corasick (MatchKind::LeftmostLongest) in tokenizer/added_vocabulary.rs.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace mt {

struct AddedTokenMatch {
  size_t begin = 0;
  size_t end = 0;
  int32_t id = 0;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher();
  void add(std::string_view content, int32_t id);  // a repeated content keeps the last id
  bool empty() const { return count_ == 0; }
  // Non-overlapping matches, left to right: the earliest start wins, then the longest token.
  void find_all(std::string_view text, std::vector<AddedTokenMatch>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t id = -1;                                          // token ending here, or -1
  };
  int32_t child(int32_t node, unsigned char b) const;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};  // quick reject of positions that start no token
  size_t count_ = 0;
};

}  // namespace mt
