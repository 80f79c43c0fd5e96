// What the tests check of an error: its text, taken from the exception a call throws.
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace loom::testing {

// Whether text holds part: the tests' one helper for it (their files share a unit).
inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The what() of the exception E that f throws; a marker string when f throws
// something else or nothing, so that the checks on the text fail visibly.
template <class E, class F> std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<wrong exception: ") + e.what() + ">";
  }
  return "<no exception>";
}

} // namespace loom::testing
