// What this process writes to stderr while a capture lives, for tests that
// check a line is printed once, or never (fd 2 itself is redirected, so
// fprintf, std::cerr and loom's log lines are all caught).
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace loom::testing {

class stderr_capture {
public:
  stderr_capture() : file_(std::tmpfile()) {
    if (!file_)
      throw std::runtime_error("stderr_capture: no temporary file");
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    if (saved_ < 0 || ::dup2(::fileno(file_), STDERR_FILENO) < 0)
      throw std::runtime_error("stderr_capture: cannot redirect stderr");
  }
  stderr_capture(const stderr_capture&) = delete;
  stderr_capture& operator=(const stderr_capture&) = delete;
  ~stderr_capture() {
    restore();
    std::fclose(file_);
  }

  // Ends the capture and returns what was written.
  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;)
      out.append(buf, n);
    return out;
  }

private:
  void restore() {
    if (saved_ < 0)
      return;
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }

  std::FILE* file_;
  int saved_ = -1;
};

} // namespace loom::testing
