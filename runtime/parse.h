// The one number parser for flags, environment variables and the files we read: the whole
// text must be the number (no spaces, no '+', no '-' for unsigned types: from_chars refuses
// them; no trailing characters),
// in range for the type; decimal, and for floating point also exponents ("1e-3").
// std::from_chars underneath: locale-independent, no exceptions.
#pragma once

#include <charconv>
#include <optional>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace ddp {

// The number `text` spells, or nothing when it is not exactly one of type T.
template <typename T>
std::optional<T> parse_number(std::string_view text) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "a number type");
  if (text.empty()) return std::nullopt;
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

// The same, for a text that may hold a longer token: parses the number at the start of
// `text` and returns how many characters it took (0: no number there).
template <typename T>
size_t parse_number_prefix(std::string_view text, T* value) {
  if (text.empty()) return 0;
  const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  if (error != std::errc()) return 0;
  return static_cast<size_t>(stop - text.data());
}

}  // namespace ddp
