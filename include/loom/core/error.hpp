// One error hierarchy for all of loom. Every error carries a code (TensorFlow's
// canonical codes, so a TF user reads them the same way) and a message that says
// what went wrong and where.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

enum class error_code {
  cancelled,
  unknown,
  invalid_argument,
  deadline_exceeded,
  not_found,
  already_exists,
  permission_denied,
  resource_exhausted,
  failed_precondition,
  aborted,
  out_of_range,
  unimplemented,
  internal,
  unavailable,
  data_loss,
  unauthenticated,
};

constexpr std::string_view to_string(error_code c) noexcept {
  switch (c) {
  case error_code::cancelled: return "cancelled";
  case error_code::unknown: return "unknown";
  case error_code::invalid_argument: return "invalid argument";
  case error_code::deadline_exceeded: return "deadline exceeded";
  case error_code::not_found: return "not found";
  case error_code::already_exists: return "already exists";
  case error_code::permission_denied: return "permission denied";
  case error_code::resource_exhausted: return "resource exhausted";
  case error_code::failed_precondition: return "failed precondition";
  case error_code::aborted: return "aborted";
  case error_code::out_of_range: return "out of range";
  case error_code::unimplemented: return "unimplemented";
  case error_code::internal: return "internal";
  case error_code::unavailable: return "unavailable";
  case error_code::data_loss: return "data loss";
  case error_code::unauthenticated: return "unauthenticated";
  }
  return "unknown";
}

// The base of every exception loom throws. what() reads "<code>: <message>".
class error : public std::runtime_error {
public:
  error(error_code code, const std::string& message)
      : std::runtime_error(std::string(to_string(code)) + ": " + message), code_(code),
        message_(message) {}

  error_code code() const noexcept { return code_; }
  // The message without the code prefix.
  const std::string& message() const noexcept { return message_; }

private:
  error_code code_;
  std::string message_;
};

// One subclass per code that callers catch on its own (TF's errors.*Error).
template <error_code Code> class coded_error : public error {
public:
  explicit coded_error(const std::string& message) : error(Code, message) {}
};

using cancelled_error = coded_error<error_code::cancelled>;
using invalid_argument_error = coded_error<error_code::invalid_argument>;
using deadline_exceeded_error = coded_error<error_code::deadline_exceeded>;
using not_found_error = coded_error<error_code::not_found>;
using already_exists_error = coded_error<error_code::already_exists>;
using permission_denied_error = coded_error<error_code::permission_denied>;
using resource_exhausted_error = coded_error<error_code::resource_exhausted>;
using failed_precondition_error = coded_error<error_code::failed_precondition>;
using aborted_error = coded_error<error_code::aborted>;
using out_of_range_error = coded_error<error_code::out_of_range>;
using unimplemented_error = coded_error<error_code::unimplemented>;
using internal_error = coded_error<error_code::internal>;
using unavailable_error = coded_error<error_code::unavailable>;
using data_loss_error = coded_error<error_code::data_loss>;
using unauthenticated_error = coded_error<error_code::unauthenticated>;

} // namespace loom
