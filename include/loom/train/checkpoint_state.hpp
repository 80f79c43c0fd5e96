// A checkpoint directory's "checkpoint" state file (TF's CheckpointState, in
// its text format: model_checkpoint_path and all_model_checkpoint_paths), and
// tf.train.latest_checkpoint. Replaced durably (durable_file.hpp). And what a
// chief restores when that file is damaged: the newest intact checkpoint found
// in the directory (find_checkpoint_to_restore).
#pragma once

#include <loom/core/checkpoint_format.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/durable_file.hpp>
#include <loom/core/tensor_bundle.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

namespace detail::ckpt {

// TF's text form of a string field: quotes, with \\, \" and \n escaped.
LOOM_COMPILED_ONCE std::string quote(const std::string& s);
LOOM_COMPILED_ONCE std::optional<std::string> unquote(std::string_view s);

} // namespace detail::ckpt

// Whether a checkpoint is at `path`: loom's file, or TensorFlow's index
// "<path>.index" (TF's checkpoint_exists).
inline bool checkpoint_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) ||
         std::filesystem::is_regular_file(tensor_bundle::index_path(path), ec);
}

// A directory's "checkpoint" file (TF's CheckpointState). Paths are as written:
// relative to the directory when the checkpoint is in it.
struct checkpoint_state {
  std::string model_checkpoint_path;
  std::vector<std::string> all_model_checkpoint_paths;
};

// The state of `dir`, nothing when it has no (readable, well-formed) state file
// (TF's get_checkpoint_state). Paths come back joined to `dir` when relative.
LOOM_COMPILED_ONCE std::optional<checkpoint_state> get_checkpoint_state(const std::string& dir);

// The newest checkpoint of `dir` by its state file (TF's
// tf.train.latest_checkpoint), of either format; nothing without a state file
// or when the checkpoint it names is gone.
inline std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto st = get_checkpoint_state(dir);
  if (!st || !checkpoint_exists(st->model_checkpoint_path))
    return std::nullopt;
  return st->model_checkpoint_path;
}

// Writes `dir`'s state file: `kept` (oldest first) as all_model_checkpoint_paths,
// the last of them as model_checkpoint_path; relative to `dir` when in it.
LOOM_COMPILED_ONCE void write_checkpoint_state(const std::string& dir,
                                               const std::vector<std::string>& kept);

namespace detail {
// The checkpoints of `dir`, oldest first: loom's (a checkpoint's one file, or a
// sharded one's manifest: files that begin with the format's magic, other than a
// sharded checkpoint's data files) and TensorFlow's (the prefix of each
// "<prefix>.index"), not the temporary files of a write that did not finish. Ordered by the step
// their name ends with ("model.ckpt-1500"), then by time of last change.
LOOM_COMPILED_ONCE std::vector<std::string> checkpoint_files_in(const std::string& dir);
} // namespace detail

// What a chief restores from its checkpoint directory.
struct checkpoint_to_restore {
  std::string path;                // empty: nothing to restore (initialize)
  std::string note;                // when the state file did not name it: what was done, and why
  std::vector<std::string> intact; // then: the intact checkpoints found, oldest first
};

// The checkpoint a chief restores from `dir`: the one its state file names
// (a damaged file there is the restore's data_loss error, naming the tensor).
// Where the state file is missing, unreadable or names a file that is gone,
// but the directory holds checkpoints, the newest of them whose every checksum
// holds, with a note saying so: a damaged state file must never cost the run
// its progress. Where none of them is intact, a data_loss error, unless
// `initialize_over_damaged` (then nothing, with a note): initializing would
// replace the run's progress with step 0 and the state file's next write
// would hide what was there.
LOOM_COMPILED_ONCE checkpoint_to_restore
find_checkpoint_to_restore(const std::string& dir, bool initialize_over_damaged = false);

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::ckpt {

LOOM_COMPILED_ONCE std::string quote(const std::string& s) {
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

LOOM_COMPILED_ONCE std::optional<std::string> unquote(std::string_view s) {
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
} // namespace loom::detail::ckpt

namespace loom {

LOOM_COMPILED_ONCE std::optional<checkpoint_state> get_checkpoint_state(const std::string& dir) {
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

LOOM_COMPILED_ONCE void write_checkpoint_state(const std::string& dir,
                                               const std::vector<std::string>& kept) {
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

namespace loom::detail {

LOOM_COMPILED_ONCE std::vector<std::string> checkpoint_files_in(const std::string& dir) {
  namespace fs = std::filesystem;
  struct found {
    std::int64_t step;
    fs::file_time_type changed;
    std::string path;
  };
  std::vector<found> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec) || name.find(".data-") != std::string::npos ||
        name.find(".tmp-") != std::string::npos)
      continue;
    std::string path = entry.path().string();
    if (name.ends_with(".index")) {
      path.resize(path.size() - std::string_view(".index").size());
      name.resize(name.size() - std::string_view(".index").size());
    } else if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      char head[detail::ckpt::magic.size()] = {};
      const bool is_checkpoint = std::fread(head, 1, sizeof head, f) == sizeof head &&
                                 std::memcmp(head, detail::ckpt::magic.data(), sizeof head) == 0;
      std::fclose(f);
      if (!is_checkpoint)
        continue;
    } else {
      continue;
    }
    std::int64_t step = -1;
    if (const auto dash = name.rfind('-');
        dash != std::string::npos && dash + 1 < name.size() && name.size() - dash <= 19 &&
        std::all_of(name.begin() + static_cast<long>(dash) + 1, name.end(),
                    [](char c) { return c >= '0' && c <= '9'; }))
      step = std::stoll(name.substr(dash + 1));
    files.push_back({step, entry.last_write_time(ec), std::move(path)});
  }
  std::sort(files.begin(), files.end(), [](const found& a, const found& b) {
    return a.step != b.step ? a.step < b.step : a.changed < b.changed;
  });
  std::vector<std::string> out;
  for (auto& f : files)
    out.push_back(std::move(f.path));
  return out;
}
} // namespace loom::detail

namespace loom {

LOOM_COMPILED_ONCE checkpoint_to_restore find_checkpoint_to_restore(const std::string& dir,
                                                                    bool initialize_over_damaged) {
  namespace fs = std::filesystem;
  const fs::path state_file = fs::path(dir) / "checkpoint";
  std::error_code ec;
  const bool has_state_file = fs::exists(state_file, ec);
  std::string why;
  if (const auto st = get_checkpoint_state(dir)) {
    if (checkpoint_exists(st->model_checkpoint_path))
      return {st->model_checkpoint_path, {}, {}};
    why = "its state file " + state_file.string() + " names " + st->model_checkpoint_path +
          ", which does not exist";
  } else {
    why = has_state_file ? "its state file " + state_file.string() +
                               " cannot be read (truncated, or not a checkpoint state)"
                         : "it has no state file ('checkpoint')";
  }
  const std::vector<std::string> files = detail::checkpoint_files_in(dir);
  if (files.empty())
    return {{},
            has_state_file ? dir + ": " + why + ", and it holds no checkpoint: initializing"
                           : std::string{},
            {}};
  std::vector<std::string> intact;
  std::string damaged; // the newer damaged ones, and what is wrong with each
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    std::string problem;
    try {
      if (fs::is_regular_file(tensor_bundle::index_path(*it), ec)) {
        const tensor_bundle::reader r(*it); // every tensor read: each checked
        for (const tensor_bundle::entry* e : r.entries())
          if (e->type())
            r.read_tensor(e->key);
        intact.insert(intact.begin(), *it);
      } else if (const checkpoint_reader r(*it); r.all_ok()) {
        intact.insert(intact.begin(), *it);
      } else {
        problem = "a tensor fails its checksum";
      }
    } catch (const error& e) {
      problem = e.what();
    }
    if (!problem.empty() && intact.empty())
      damaged += (damaged.empty() ? "" : "; ") + *it + ": " + problem;
  }
  const std::string found = std::to_string(files.size()) + " checkpoint file(s)";
  if (intact.empty()) {
    if (!initialize_over_damaged)
      throw data_loss_error(
          dir + ": " + why + ", and none of its " + found + " is intact (" + damaged +
          "). Not initializing over them, which would lose the run's progress: move them "
          "away, or set monitored_session_options::initialize_over_damaged_checkpoints");
    return {{},
            dir + ": " + why + ", and none of its " + found + " is intact (" + damaged +
                "): initializing over them, as initialize_over_damaged_checkpoints asks",
            {}};
  }
  std::string note = dir + ": " + why + "; restoring " + intact.back() +
                     ", the newest intact of the " + found + " there";
  if (!damaged.empty())
    note += " (newer, damaged: " + damaged + ")";
  return {intact.back(), std::move(note), std::move(intact)};
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
