// Reading a --metrics file (JSON Lines) in the tests: the records of one event, in order.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddp {

inline std::vector<nlohmann::json> events_of(const std::string& metrics, const std::string& event) {
  std::ifstream in(metrics);
  std::vector<nlohmann::json> found;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record["event"] == event) found.push_back(record);
  }
  return found;
}

}  // namespace ddp
