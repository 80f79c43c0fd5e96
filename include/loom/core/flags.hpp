// Command-line flags in the style of tf.app.flags: --name=value or --name value,
// booleans as --name, --name=true/false or --noname. Unknown flags, missing
// values and malformed numbers are errors that name the flag and list the
// known ones; --help prints every flag with its default and help text, and
// --version the loom version the program was built with.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/version.hpp>

#include <charconv>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace loom {

class flags {
public:
  using value = std::variant<std::string, std::int64_t, double, bool>;

  explicit flags(std::string program_description = {})
      : description_(std::move(program_description)) {}

  flags& define(const std::string& name, value default_value, std::string help);
  flags& define_string(const std::string& n, std::string d, std::string h) {
    return define(n, std::move(d), std::move(h));
  }
  flags& define_int(const std::string& n, std::int64_t d, std::string h) {
    return define(n, d, std::move(h));
  }
  flags& define_float(const std::string& n, double d, std::string h) {
    return define(n, d, std::move(h));
  }
  flags& define_bool(const std::string& n, bool d, std::string h) {
    return define(n, d, std::move(h));
  }

  // Parses argv; returns false when --help or --version was given (after
  // printing the usage or the version): the program then exits 0.
  bool parse(int argc, const char* const* argv, std::ostream& out = std::cout);

  std::string get_string(const std::string& n) const { return get<std::string>(n); }
  std::int64_t get_int(const std::string& n) const { return get<std::int64_t>(n); }
  double get_float(const std::string& n) const { return get<double>(n); }
  bool get_bool(const std::string& n) const { return get<bool>(n); }
  // True if the command line set the flag (TF's "flag is None" checks).
  bool is_set(const std::string& n) const { return find(n).set; }

  void print_usage(std::ostream& os, std::string_view program) const;

private:
  struct entry {
    value current;
    std::string help;
    bool set;
  };

  const entry& find(const std::string& n) const {
    auto it = entries_.find(n);
    if (it == entries_.end())
      throw not_found_error("flag --" + n + " is not defined");
    return it->second;
  }
  template <class T> T get(const std::string& n) const {
    const entry& e = find(n);
    if (auto* v = std::get_if<T>(&e.current))
      return *v;
    throw invalid_argument_error("flag --" + n + " is " + type_name(e.current) + " flag, read as " +
                                 type_name(value(T{})));
  }

  static std::string type_name(const value& v) {
    static constexpr const char* names[] = {"a string", "an integer", "a float", "a boolean"};
    return names[v.index()];
  }

  std::string known() const {
    std::string s = "; known flags:";
    for (auto& [name, e] : entries_)
      s += " --" + name;
    return s;
  }

  static value convert(const std::string& name, const value& like, const std::string& text);

  std::string description_;
  std::map<std::string, entry> entries_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto flags::define(const std::string& name, value default_value,
                                      std::string help) -> flags& {
  if (!entries_.emplace(name, entry{std::move(default_value), std::move(help), false}).second)
    throw already_exists_error("flag --" + name + " is defined twice");
  return *this;
}

LOOM_COMPILED_ONCE bool flags::parse(int argc, const char* const* argv, std::ostream& out) {
  const std::string_view program = argc > 0 ? argv[0] : "program";
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage(out, program);
      return false;
    }
    if (arg == "--version") {
      out << program << " (loom " << version() << ")\n";
      return false;
    }
    if (arg.substr(0, 2) != "--")
      throw invalid_argument_error("unexpected argument '" + std::string(arg) +
                                   "': flags look like --name=value" + known());
    arg.remove_prefix(2);
    std::string name(arg.substr(0, arg.find('=')));
    std::optional<std::string> text;
    if (auto eq = arg.find('='); eq != std::string_view::npos)
      text = std::string(arg.substr(eq + 1));
    auto it = entries_.find(name);
    if (it == entries_.end() && name.rfind("no", 0) == 0 && !text) {
      auto neg = entries_.find(name.substr(2));
      if (neg != entries_.end() && std::holds_alternative<bool>(neg->second.current)) {
        neg->second.current = false;
        neg->second.set = true;
        continue;
      }
    }
    if (it == entries_.end())
      throw invalid_argument_error("unknown flag --" + name + known());
    entry& e = it->second;
    if (!text) {
      if (std::holds_alternative<bool>(e.current))
        text = "true";
      else if (i + 1 < argc && std::string_view(argv[i + 1]).substr(0, 2) != "--")
        text = argv[++i];
      else // `--job_name --task_index=1`: the value was left out, not "--task_index=1"
        throw invalid_argument_error("flag --" + name + " needs a value" +
                                     (i + 1 < argc
                                          ? " (the next argument, '" + std::string(argv[i + 1]) +
                                                "', is a flag; write --" + name + "=VALUE)"
                                          : std::string()));
    }
    e.current = convert(name, e.current, *text);
    e.set = true;
  }
  return true;
}

LOOM_COMPILED_ONCE void flags::print_usage(std::ostream& os, std::string_view program) const {
  if (!description_.empty())
    os << description_ << "\n\n";
  os << "usage: " << program << " [--flag=value ...] | --help | --version\n";
  for (auto& [name, e] : entries_) {
    os << "  --" << name << " (default: ";
    std::visit([&](const auto& v) { os << v; }, e.current);
    os << ")\n      " << e.help << "\n";
  }
}

LOOM_COMPILED_ONCE auto flags::convert(const std::string& name, const value& like,
                                       const std::string& text) -> value {
  auto bad = [&](const char* what) {
    return invalid_argument_error("flag --" + name + "=" + text + ": not " + what);
  };
  if (std::holds_alternative<std::string>(like))
    return text;
  if (std::holds_alternative<bool>(like)) {
    if (text == "true" || text == "True" || text == "1")
      return true;
    if (text == "false" || text == "False" || text == "0")
      return false;
    throw bad("a boolean (true or false)");
  }
  if (std::holds_alternative<std::int64_t>(like)) {
    std::int64_t v{};
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || p != text.data() + text.size())
      throw bad("an integer");
    return v;
  }
  try {
    std::size_t used = 0;
    double v = std::stod(text, &used);
    if (used != text.size())
      throw bad("a number");
    return v;
  } catch (const std::logic_error&) {
    throw bad("a number");
  }
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
