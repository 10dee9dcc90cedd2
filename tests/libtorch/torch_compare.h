// The LibTorch tests' comparison: two safetensors files of parameters (torch_worker's --out)
// hold the same names and shapes, and their largest relative difference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "models/safetensors.h"
#include "tests/support/margins.h"

namespace ddp {

// max over elements of |a - b| / (1 + |b|), or +inf where the files differ in names or shapes
// (with a test failure naming it).
inline double max_relative_difference(const std::string& a_path, const std::string& b_path) {
  const SafetensorsFile a = read_safetensors(a_path), b = read_safetensors(b_path);
  double worst = 0;
  EXPECT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, tb] : b.tensors) {
    const auto it = a.tensors.find(name);
    if (it == a.tensors.end() || it->second.shape != tb.shape || tb.dtype != "F32") {
      ADD_FAILURE() << name << " missing, of another shape or not F32 in " << a_path;
      return INFINITY;
    }
    const size_t n = tb.data.size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      float x = 0, y = 0;
      std::memcpy(&x, it->second.data.data() + i * sizeof(float), sizeof(float));
      std::memcpy(&y, tb.data.data() + i * sizeof(float), sizeof(float));
      worst = std::max(worst, std::abs(double(x) - double(y)) / (1 + std::abs(double(y))));
    }
  }
  return reported_error(worst);
}

// A pipeline's parameters, each rank's own in `rank_paths`, against one process's `reference`
// file: max over elements of |a - b| / (1 + |b|); every reference tensor must be in exactly
// one rank's file (a test failure otherwise), and a tensor of no reference or of another
// shape is +inf.
inline double max_relative_difference_of_ranks(const std::vector<std::string>& rank_paths,
                                               const std::string& reference_path) {
  const SafetensorsFile reference = read_safetensors(reference_path);
  size_t found = 0;
  double worst = 0;
  for (const std::string& path : rank_paths) {
    for (const auto& [name, tensor] : read_safetensors(path).tensors) {
      const auto it = reference.tensors.find(name);
      if (it == reference.tensors.end() || it->second.shape != tensor.shape) {
        ADD_FAILURE() << name << " of " << path << " not in the reference";
        return INFINITY;
      }
      ++found;
      const auto* a = reinterpret_cast<const float*>(tensor.data.data());
      const auto* b = reinterpret_cast<const float*>(it->second.data.data());
      for (size_t i = 0; i < tensor.data.size() / sizeof(float); ++i)
        worst =
            std::max(worst, std::abs(double(a[i]) - double(b[i])) / (1 + std::abs(double(b[i]))));
    }
  }
  EXPECT_EQ(found, reference.tensors.size()) << "every tensor on exactly one rank";
  return reported_error(worst);
}

// For each tensor: max over its elements of |a - b| over the largest |b| (a difference relative
// to the tensor's scale, for gradients, many of them near zero), +inf where the files differ in
// names or shapes (with a test failure naming it).
inline std::map<std::string, double> difference_per_tensor(const std::string& a_path,
                                                           const std::string& b_path) {
  const SafetensorsFile a = read_safetensors(a_path), b = read_safetensors(b_path);
  std::map<std::string, double> out;
  EXPECT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, tb] : b.tensors) {
    const auto it = a.tensors.find(name);
    if (it == a.tensors.end() || it->second.shape != tb.shape || tb.dtype != "F32") {
      ADD_FAILURE() << name << " missing, of another shape or not F32 in " << a_path;
      out[name] = INFINITY;
      continue;
    }
    double worst = 0, largest = 0;
    for (size_t i = 0; i < tb.data.size() / sizeof(float); ++i) {
      float x = 0, y = 0;
      std::memcpy(&x, it->second.data.data() + i * sizeof(float), sizeof(float));
      std::memcpy(&y, tb.data.data() + i * sizeof(float), sizeof(float));
      worst = std::max(worst, std::abs(double(x) - double(y)));
      largest = std::max(largest, std::abs(double(y)));
    }
    out[name] = reported_error(largest > 0 ? worst / largest : worst);
  }
  return out;
}

// What rank `rank` printed after "running_mean " (torch_worker --batchnorm), or "" (with a test
// failure) where it printed nothing.
inline std::string batchnorm_line(const std::string& output, int rank) {
  const std::string tag = "rank " + std::to_string(rank) + " running_mean ";
  const size_t at = output.find(tag);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no '" << tag << "' in\n" << output;
    return "";
  }
  return output.substr(at + tag.size(), output.find('\n', at) - at - tag.size());
}

// Each rank's "rank R step S scale X stepped B" lines (a ddp::GradScaler's updates, printed by
// the workers' --scaler), as "S:X:B" in order.
inline std::map<int, std::vector<std::string>> scale_lines(const std::string& output) {
  std::map<int, std::vector<std::string>> found;
  const std::regex line(R"(rank (\d+) step (\d+) scale ([0-9.e+]+) stepped (\d))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it)
    found[std::stoi((*it)[1])].push_back((*it)[2].str() + ":" + (*it)[3].str() + ":" +
                                         (*it)[4].str());
  return found;
}

}  // namespace ddp
