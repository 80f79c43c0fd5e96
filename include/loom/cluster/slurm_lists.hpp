// The compressed lists Slurm exports to each task of a job step, expanded:
//
//   expand_nodelist("node[01-03,07],gpu5", "SLURM_STEP_NODELIST")
//       -> {"node01", "node02", "node03", "node07", "gpu5"}
//   expand_tasks_per_node("2(x3),1", "SLURM_STEP_TASKS_PER_NODE") -> {2, 2, 2, 1}
//
// A name may hold several bracket groups ("rack[1-2]-n[1-2]": every combination, in
// Slurm's order); a range keeps the zero padding of its lower bound ("[08-10]" gives
// 08, 09, 10). Every malformed list is an invalid_argument_error naming the variable,
// its value and the position (0-based) of the offending character.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace loom::detail {

namespace slurm_impl {

// Past this many names a list is surely a mistake (or an attack on memory), not a cluster.
inline constexpr std::size_t max_expanded = 1 << 20;

[[noreturn]] inline void fail(std::string_view variable, std::string_view value, std::size_t pos,
                              const std::string& what) {
  throw invalid_argument_error(std::string(variable) + "=\"" + std::string(value) +
                               "\": at position " + std::to_string(pos) + ": " + what);
}

inline bool digit(char c) {
  return c >= '0' && c <= '9';
}

// A decimal number of at most 9 digits at `pos`; advances `pos`.
LOOM_COMPILED_ONCE long number(std::string_view variable, std::string_view value, std::size_t& pos,
                               const char* what);

// The names of one bracket group's contents "01-03,07" starting at `pos` (after '[');
// leaves `pos` after the closing ']'.
LOOM_COMPILED_ONCE std::vector<std::string> bracket(std::string_view variable,
                                                    std::string_view value, std::size_t& pos);

LOOM_COMPILED_ONCE bool name_char(char c);

} // namespace slurm_impl

// The host names of a Slurm node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST).
LOOM_COMPILED_ONCE std::vector<std::string>
expand_nodelist(std::string_view value, std::string_view variable = "node list");

// The tasks on each node of a Slurm tasks-per-node list (SLURM_STEP_TASKS_PER_NODE):
// "2(x3),1" is 2 tasks on each of 3 nodes, then 1.
LOOM_COMPILED_ONCE std::vector<int>
expand_tasks_per_node(std::string_view value, std::string_view variable = "tasks per node");

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::slurm_impl {

LOOM_COMPILED_ONCE long number(std::string_view variable, std::string_view value, std::size_t& pos,
                               const char* what) {
  const std::size_t start = pos;
  long n = 0;
  while (pos < value.size() && digit(value[pos])) {
    if (pos - start == 9)
      fail(variable, value, start, std::string(what) + " has more than 9 digits");
    n = n * 10 + (value[pos] - '0');
    ++pos;
  }
  if (pos == start)
    fail(variable, value, pos,
         std::string("expected ") + what + " (digits), got " +
             (pos < value.size() ? "'" + std::string(1, value[pos]) + "'" : "the end"));
  return n;
}

LOOM_COMPILED_ONCE std::vector<std::string> bracket(std::string_view variable,
                                                    std::string_view value, std::size_t& pos) {
  std::vector<std::string> out;
  while (true) {
    const std::size_t lo_pos = pos;
    const long lo = number(variable, value, pos, "a range's first number");
    const std::size_t width = pos - lo_pos;
    long hi = lo;
    if (pos < value.size() && value[pos] == '-') {
      ++pos;
      const std::size_t hi_pos = pos;
      hi = number(variable, value, pos, "a range's last number");
      if (hi < lo)
        fail(variable, value, hi_pos,
             "the range " + std::to_string(lo) + "-" + std::to_string(hi) + " runs backwards");
    }
    if (out.size() + static_cast<std::size_t>(hi - lo) + 1 > max_expanded)
      fail(variable, value, lo_pos,
           "the list expands to more than " + std::to_string(max_expanded) + " names");
    for (long i = lo; i <= hi; ++i) {
      std::string n = std::to_string(i);
      if (n.size() < width)
        n.insert(0, width - n.size(), '0');
      out.push_back(std::move(n));
    }
    if (pos >= value.size())
      fail(variable, value, pos, "the '[' is not closed by ']'");
    if (value[pos] == ']') {
      ++pos;
      return out;
    }
    if (value[pos] != ',')
      fail(variable, value, pos,
           "expected ',', '-' or ']' in a bracket, got '" + std::string(1, value[pos]) + "'");
    ++pos;
  }
}

LOOM_COMPILED_ONCE bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || digit(c) || c == '-' || c == '_' ||
         c == '.';
}
} // namespace loom::detail::slurm_impl

namespace loom::detail {

LOOM_COMPILED_ONCE std::vector<std::string> expand_nodelist(std::string_view value,
                                                            std::string_view variable) {
  namespace impl = slurm_impl;
  std::vector<std::string> out;
  std::size_t pos = 0;
  if (value.empty())
    impl::fail(variable, value, 0, "the node list is empty");
  while (true) {
    // One name: literal parts and bracket groups, up to a ',' outside brackets.
    const std::size_t name_start = pos;
    std::vector<std::string> names{""};
    while (pos < value.size() && value[pos] != ',') {
      const char c = value[pos];
      if (c == '[') {
        ++pos;
        const auto parts = impl::bracket(variable, value, pos);
        if (names.size() * parts.size() + out.size() > impl::max_expanded)
          impl::fail(variable, value, name_start,
                     "the list expands to more than " + std::to_string(impl::max_expanded) +
                         " names");
        std::vector<std::string> combined;
        combined.reserve(names.size() * parts.size());
        for (const auto& prefix : names)
          for (const auto& part : parts)
            combined.push_back(prefix + part);
        names = std::move(combined);
      } else if (impl::name_char(c)) {
        for (auto& n : names)
          n.push_back(c);
        ++pos;
      } else {
        impl::fail(variable, value, pos,
                   c == ']'
                       ? std::string("a ']' without its '['")
                       : "the character '" + std::string(1, c) + "' cannot be part of a host name");
      }
    }
    if (pos == name_start)
      impl::fail(variable, value, pos, "an empty host name");
    out.insert(out.end(), names.begin(), names.end());
    if (pos == value.size())
      return out;
    ++pos; // the ','
    if (pos == value.size())
      impl::fail(variable, value, pos, "an empty host name after the last ','");
  }
}

LOOM_COMPILED_ONCE std::vector<int> expand_tasks_per_node(std::string_view value,
                                                          std::string_view variable) {
  namespace impl = slurm_impl;
  std::vector<int> out;
  std::size_t pos = 0;
  if (value.empty())
    impl::fail(variable, value, 0, "the list is empty");
  while (true) {
    const std::size_t count_pos = pos;
    const long tasks = impl::number(variable, value, pos, "a task count");
    if (tasks == 0)
      impl::fail(variable, value, count_pos, "a node with 0 tasks");
    long repeat = 1;
    if (pos < value.size() && value[pos] == '(') {
      ++pos;
      if (pos >= value.size() || value[pos] != 'x')
        impl::fail(variable, value, pos, "expected 'x' after '(', as in \"2(x3)\"");
      ++pos;
      const std::size_t repeat_pos = pos;
      repeat = impl::number(variable, value, pos, "a node count");
      if (repeat == 0)
        impl::fail(variable, value, repeat_pos, "a repeat of 0 nodes");
      if (pos >= value.size() || value[pos] != ')')
        impl::fail(variable, value, pos,
                   "expected ')' to close \"(x" + std::to_string(repeat) + "\"");
      ++pos;
    }
    if (out.size() + static_cast<std::size_t>(repeat) > impl::max_expanded)
      impl::fail(variable, value, count_pos,
                 "the list expands to more than " + std::to_string(impl::max_expanded) + " nodes");
    out.insert(out.end(), static_cast<std::size_t>(repeat), static_cast<int>(tasks));
    if (pos == value.size())
      return out;
    if (value[pos] != ',')
      impl::fail(variable, value, pos,
                 "expected ',' or \"(xN)\", got '" + std::string(1, value[pos]) + "'");
    ++pos;
  }
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
