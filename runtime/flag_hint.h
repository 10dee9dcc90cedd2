// What a mistyped flag most likely meant: the known flag that is the same once case, dashes
// and underscores are set aside ("batchsize", "batch_size" -> "batch-size"), else the nearest
// within a few edits ("lerning-rate" -> "learning-rate"), else nothing. Pure.
#pragma once

#include <string>
#include <vector>

namespace ddp {

// The flag of `known` (long names, without dashes in front) that `unknown` most likely meant,
// or empty.
std::string closest_flag(const std::string& unknown, const std::vector<std::string>& known);

// " did you mean --NAME?" for closest_flag's answer, or empty.
std::string did_you_mean(const std::string& unknown, const std::vector<std::string>& known);

}  // namespace ddp
