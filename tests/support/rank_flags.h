// A test program's flags for one rank only (ranks that disagree): "--rank1-flags 'F...'" is taken
// out of the command line, and on the process whose RANK is 1 its words are added to it, so that
// one ddprun command line starts ranks given different options.
#pragma once

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace ddp {

// The command line to parse: argv without "--rank1-flags TEXT", and with TEXT's words on rank 1.
// `words` keeps the strings the returned pointers point into.
inline std::vector<char*> with_rank1_flags(int argc, char** argv, std::vector<std::string>& words) {
  std::string extra;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--rank1-flags" && i + 1 < argc) {
      extra = argv[++i];
      continue;
    }
    words.emplace_back(argv[i]);
  }
  const char* rank = std::getenv("RANK");
  if (rank != nullptr && std::string(rank) == "1") {
    std::istringstream in(extra);
    for (std::string word; in >> word;)
      words.push_back(word);
  }
  std::vector<char*> out;
  for (std::string& w : words)
    out.push_back(w.data());
  return out;
}

}  // namespace ddp
