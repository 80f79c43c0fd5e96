// Where the message layer's log lines go.
#pragma once

#include <cstdio>
#include <functional>
#include <string_view>

namespace loom::net {

// Receives the layer's log lines ("waiting for ps task 0 at ...", rejected
// clients, bad frames). Empty: print to stderr.
using log_fn = std::function<void(std::string_view)>;

inline void log_line(const log_fn& log, std::string_view msg) {
  if (log)
    log(msg);
  else
    std::fprintf(stderr, "loom: %.*s\n", static_cast<int>(msg.size()), msg.data());
}

} // namespace loom::net
