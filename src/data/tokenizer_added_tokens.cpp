#include "data/tokenizer_added_tokens.h"

#include <algorithm>

namespace mt {

AddedTokenMatcher::AddedTokenMatcher() : nodes_(1) {}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char b) const {
  const auto& ch = nodes_[static_cast<size_t>(node)].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), b, [](const auto& c, unsigned char v) { return c.first < v; });
  return it != ch.end() && it->first == b ? it->second : -1;
}

void AddedTokenMatcher::add(std::string_view content, int32_t id) {
  if (content.empty()) return;  // HF ignores empty added tokens
  int32_t node = 0;
  for (unsigned char b : content) {
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& ch = nodes_[static_cast<size_t>(node)].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), b, [](const auto& c, unsigned char v) { return c.first < v; });
      ch.insert(it, {b, next});
    }
    node = next;
  }
  if (nodes_[static_cast<size_t>(node)].id < 0) ++count_;
  nodes_[static_cast<size_t>(node)].id = id;
  first_byte_[static_cast<unsigned char>(content[0])] = true;
}

void AddedTokenMatcher::find_all(std::string_view text, std::vector<AddedTokenMatch>& out) const {
  if (count_ == 0) return;
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0;
    size_t best_end = 0;
    int32_t best_id = -1;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (nodes_[static_cast<size_t>(node)].id >= 0) {
        best_end = j + 1;
        best_id = nodes_[static_cast<size_t>(node)].id;
      }
    }
    if (best_id >= 0) {
      out.push_back({i, best_end, best_id});
      i = best_end;
    } else {
      ++i;
    }
  }
}

}  // namespace mt
