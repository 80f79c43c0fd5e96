// A checkpoint directory's "checkpoint" state file (TF's CheckpointState, in
// its text format: model_checkpoint_path and all_model_checkpoint_paths), and
// tf.train.latest_checkpoint. Replaced durably (durable_file.hpp).
#pragma once

#include <loom/core/durable_file.hpp>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

namespace detail::ckpt {

// TF's text form of a string field: quotes, with \\, \" and \n escaped.
inline std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\\' || c == '"')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out + "\"";
}
inline std::optional<std::string> unquote(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  if (s.size() < 2 || s.front() != '"' || s.back() != '"')
    return std::nullopt;
  s = s.substr(1, s.size() - 2);
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    if (++i == s.size())
      return std::nullopt;
    out += s[i] == 'n' ? '\n' : s[i];
  }
  return out;
}

} // namespace detail::ckpt

// A directory's "checkpoint" file (TF's CheckpointState). Paths are as written:
// relative to the directory when the checkpoint is in it.
struct checkpoint_state {
  std::string model_checkpoint_path;
  std::vector<std::string> all_model_checkpoint_paths;
};

// The state of `dir`, nothing when it has no (readable, well-formed) state file
// (TF's get_checkpoint_state). Paths come back joined to `dir` when relative.
inline std::optional<checkpoint_state> get_checkpoint_state(const std::string& dir) {
  std::FILE* f = std::fopen((std::filesystem::path(dir) / "checkpoint").c_str(), "rb");
  if (!f)
    return std::nullopt;
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (1u << 24);)
    text.append(buf, n);
  std::fclose(f);
  auto full = [&](const std::string& p) {
    const std::filesystem::path path(p);
    return path.is_absolute() ? p : (std::filesystem::path(dir) / path).string();
  };
  checkpoint_state st;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos)
      end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos)
      continue;
    const auto colon = line.find(':');
    if (colon == std::string_view::npos)
      return std::nullopt;
    std::string_view key = line.substr(0, colon);
    while (!key.empty() && (key.front() == ' ' || key.front() == '\t'))
      key.remove_prefix(1);
    const auto value = detail::ckpt::unquote(line.substr(colon + 1));
    if (!value)
      return std::nullopt;
    if (key == "model_checkpoint_path")
      st.model_checkpoint_path = full(*value);
    else if (key == "all_model_checkpoint_paths")
      st.all_model_checkpoint_paths.push_back(full(*value));
  }
  if (st.model_checkpoint_path.empty())
    return std::nullopt;
  return st;
}

// The newest checkpoint of `dir` by its state file (TF's
// tf.train.latest_checkpoint); nothing without a state file or when the file
// it names is gone.
inline std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto st = get_checkpoint_state(dir);
  if (!st)
    return std::nullopt;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(st->model_checkpoint_path, ec))
    return std::nullopt;
  return st->model_checkpoint_path;
}

// Writes `dir`'s state file: `kept` (oldest first) as all_model_checkpoint_paths,
// the last of them as model_checkpoint_path; relative to `dir` when in it.
inline void write_checkpoint_state(const std::string& dir, const std::vector<std::string>& kept) {
  auto rel = [&](const std::string& p) {
    return detail::ckpt::parent_dir(p) == dir ? std::filesystem::path(p).filename().string() : p;
  };
  std::string text = "model_checkpoint_path: " + detail::ckpt::quote(rel(kept.back())) + "\n";
  for (const auto& p : kept)
    text += "all_model_checkpoint_paths: " + detail::ckpt::quote(rel(p)) + "\n";
  detail::ckpt::write_atomically((std::filesystem::path(dir) / "checkpoint").string(),
                                 [&](auto&& out) { out(text.data(), text.size()); });
}

} // namespace loom
