// closest_flag: a normalised comparison, then the edit distance.
#include "runtime/flag_hint.h"

#include <algorithm>
#include <cctype>

namespace ddp {

namespace {

std::string normalised(const std::string& name) {
  std::string out;
  for (const char c : name)
    if (c != '-' && c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Levenshtein distance (insertions, deletions, substitutions).
size_t edits(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest_flag(const std::string& unknown, const std::vector<std::string>& known) {
  const std::string want = normalised(unknown);
  if (want.empty()) return {};
  // The same once normalised (0 edits), else a few edits, fewer for short names (so that
  // "lr" does not suggest "tp").
  const size_t most = want.size() <= 4 ? 1 : want.size() <= 8 ? 2 : 3;
  std::string best;
  size_t best_edits = most + 1;
  for (const std::string& k : known) {
    const size_t e = edits(want, normalised(k));
    if (e < best_edits) best = k, best_edits = e;
  }
  return best;
}

std::string did_you_mean(const std::string& unknown, const std::vector<std::string>& known) {
  const std::string k = closest_flag(unknown, known);
  return k.empty() ? std::string() : " did you mean --" + k + "?";
}

}  // namespace ddp
