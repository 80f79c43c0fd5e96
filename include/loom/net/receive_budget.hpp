// The memory a server holds for frames it has not finished receiving, bounded
// per connection and in total (rpc_server_options::max_pending_bytes_per_connection
// and max_pending_bytes; docs/wire-protocol.md, "Memory under hostile peers").
//
// A connection charges its account for the memory it allocates for the message
// it is reading (a metadata buffer before it grows it, a tensor's bytes as they
// arrive in a buffer the layer allocated) and releases all of it when the message
// is delivered or the connection closes. Bytes read into a buffer a handler
// supplied (a variable's) cost nothing new and are not charged.
//
// Over the limits the connection is closed, never paused. Pausing a connection
// keeps what it holds while it waits; with several paused holders each can wait
// for memory another keeps (a deadlock among honest peers), and a stalled peer
// would keep its share for ever. Closing frees the memory at once, and the error
// reply names the limit, so an honest peer learns why. So that a peer which
// sends part of a frame and then stalls cannot fill the total and have everyone
// else refused, a charge that would pass the total first evicts stalled holders
// (nothing received for `stalled_after`), the largest first, when that makes room.
//
// receive_charge is a connection's side of it: its account, and the refusals said the way
// the error reply says them. A client's connection has no budget: every charge is granted.
#pragma once

#include <loom/core/compiled_once.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace loom::net {

class receive_budget : public std::enable_shared_from_this<receive_budget> {
public:
  using clock = std::chrono::steady_clock;
  // A holder that received nothing for this long may be evicted to make room.
  static constexpr clock::duration stalled_after = std::chrono::seconds(1);

  enum class verdict { granted, over_connection, over_total, evicted };

  // One connection's share. Its owner (the connection, on its strand) charges and
  // releases; the budget may evict it from another thread, which makes every later
  // charge fail and calls `evict` once with the reason.
  class account {
  public:
    account(std::shared_ptr<receive_budget> b, std::function<void(std::string)> evict)
        : budget_(std::move(b)), evict_(std::move(evict)) {
      std::lock_guard lk(budget_->m_);
      budget_->accounts_.insert(this);
    }
    account(const account&) = delete;
    account& operator=(const account&) = delete;
    ~account() {
      std::lock_guard lk(budget_->m_);
      budget_->total_ -= held_;
      budget_->accounts_.erase(this);
    }

    // Charges n more bytes; anything but granted leaves the holding as it was.
    verdict charge(std::size_t n);

    // True when this connection may come to hold `more` bytes beyond what it holds
    // (a tensor about to be received into memory the layer allocates).
    bool fits(std::uint64_t more) const {
      std::lock_guard lk(budget_->m_);
      return held_ + more <= budget_->per_connection_;
    }

    void release_all() {
      std::lock_guard lk(budget_->m_);
      budget_->total_ -= held_;
      held_ = 0;
    }
    void release(std::size_t n) {
      std::lock_guard lk(budget_->m_);
      n = std::min(n, held_);
      budget_->total_ -= n;
      held_ -= n;
    }
    std::size_t held() const {
      std::lock_guard lk(budget_->m_);
      return held_;
    }

    // The connection received bytes at `now` (clock::now().time_since_epoch().count()).
    void note_progress(clock::rep now) noexcept {
      last_progress_.store(now, std::memory_order_relaxed);
    }

  private:
    friend class receive_budget;
    clock::duration quiet_for(clock::time_point now) const noexcept {
      return now.time_since_epoch() -
             clock::duration(last_progress_.load(std::memory_order_relaxed));
    }

    std::shared_ptr<receive_budget> budget_;
    std::function<void(std::string)> evict_;
    std::size_t held_ = 0; // under budget_->m_
    bool evicted_ = false; // under budget_->m_
    std::atomic<clock::rep> last_progress_{clock::now().time_since_epoch().count()};
  };

  receive_budget(std::uint64_t limit, std::uint64_t per_connection)
      : limit_(static_cast<std::size_t>(limit)),
        per_connection_(static_cast<std::size_t>(std::min(per_connection, limit))) {}

  // An account for a new connection; `evict` closes it (called from any thread).
  std::unique_ptr<account> open(std::function<void(std::string)> evict) {
    return std::make_unique<account>(shared_from_this(), std::move(evict));
  }

  // Bytes held now for incomplete frames, over all connections.
  std::size_t held() const {
    std::lock_guard lk(m_);
    return total_;
  }
  std::size_t limit() const noexcept { return limit_; }
  std::size_t per_connection() const noexcept { return per_connection_; }

private:
  // Under m_: evicts stalled holders other than `asking`, the largest first, when together
  // they make room for n more bytes; false (nobody evicted) when they cannot.
  bool evict_stalled(account& asking, std::size_t n,
                     std::vector<std::pair<std::function<void(std::string)>, std::string>>& out);

  const std::size_t limit_, per_connection_;
  mutable std::mutex m_;
  std::size_t total_ = 0;
  std::unordered_set<account*> accounts_;
};

// One connection's charges (its strand only, but for the eviction callback, which may
// come from any thread). A refusal is the text of why, "" when granted.
class receive_charge {
public:
  // Server side, before the first read: charges go to `budget` from now on, which may
  // evict this connection (evict then runs once, with the reason, from any thread).
  void attach(const std::shared_ptr<receive_budget>& budget,
              std::function<void(std::string)> evict) {
    budget_ = budget;
    account_ = budget->open(std::move(evict));
  }

  // Charges n more bytes held for the message being read.
  std::string charge(std::size_t n) {
    if (!account_ || n == 0)
      return {};
    return refusal(account_->charge(n));
  }

  // Fresh destinations that will hold `bytes` more: refused at once when that passes the
  // per-connection limit (rather than after reading them).
  std::string fits(std::uint64_t bytes) const;

  // The connection received bytes at `now` (it is not stalled).
  void note_progress(receive_budget::clock::rep now) noexcept {
    if (account_)
      account_->note_progress(now);
  }
  void release(std::size_t n) {
    if (account_)
      account_->release(n);
  }
  // The memory held for the message being read is no longer the connection's (delivered,
  // or dropped).
  void release_all() {
    if (account_)
      account_->release_all();
  }

private:
  std::string refusal(receive_budget::verdict v) const;

  std::shared_ptr<receive_budget> budget_;
  std::unique_ptr<receive_budget::account> account_;
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE auto receive_budget::account::charge(std::size_t n) -> verdict {
  std::vector<std::pair<std::function<void(std::string)>, std::string>> victims;
  {
    std::lock_guard lk(budget_->m_);
    if (evicted_)
      return verdict::evicted;
    if (held_ + n > budget_->per_connection_)
      return verdict::over_connection;
    if (budget_->total_ + n > budget_->limit_ && !budget_->evict_stalled(*this, n, victims))
      return verdict::over_total;
    budget_->total_ += n;
    held_ += n;
  }
  for (auto& [evict, why] : victims)
    evict(why);
  return verdict::granted;
}

LOOM_COMPILED_ONCE bool receive_budget::evict_stalled(
    account& asking, std::size_t n,
    std::vector<std::pair<std::function<void(std::string)>, std::string>>& out) {
  const auto now = clock::now();
  std::vector<account*> stalled;
  for (account* a : accounts_)
    if (a != &asking && !a->evicted_ && a->held_ > 0 && a->quiet_for(now) >= stalled_after)
      stalled.push_back(a);
  std::sort(stalled.begin(), stalled.end(),
            [](const account* x, const account* y) { return x->held_ > y->held_; });
  std::size_t freed = 0, take = 0;
  while (take < stalled.size() && total_ - freed + n > limit_)
    freed += stalled[take++]->held_;
  if (total_ - freed + n > limit_)
    return false;
  for (std::size_t i = 0; i < take; ++i) {
    account* a = stalled[i];
    const auto quiet =
        std::chrono::duration_cast<std::chrono::milliseconds>(a->quiet_for(now)).count();
    out.emplace_back(a->evict_, "it held " + std::to_string(a->held_) +
                                    " bytes of an incomplete frame and sent nothing for " +
                                    std::to_string(quiet) +
                                    " ms while the server was at max_pending_bytes (" +
                                    std::to_string(limit_) + ")");
    total_ -= a->held_;
    a->held_ = 0;
    a->evicted_ = true;
  }
  return true;
}

LOOM_COMPILED_ONCE std::string receive_charge::fits(std::uint64_t bytes) const {
  if (!account_ || bytes == 0 || account_->fits(bytes))
    return {};
  return "its tensors need " + std::to_string(bytes) +
         " bytes of memory the server allocates, over max_pending_bytes_per_connection (" +
         std::to_string(budget_->per_connection()) + " bytes)";
}

LOOM_COMPILED_ONCE std::string receive_charge::refusal(receive_budget::verdict v) const {
  switch (v) {
  case receive_budget::verdict::granted: return {};
  case receive_budget::verdict::over_connection:
    return "it would hold more than max_pending_bytes_per_connection (" +
           std::to_string(budget_->per_connection()) + " bytes) for one incomplete message";
  case receive_budget::verdict::over_total:
    return "the server holds " + std::to_string(budget_->held()) +
           " bytes for incomplete frames, at max_pending_bytes (" +
           std::to_string(budget_->limit()) + "), and none of it is stalled";
  case receive_budget::verdict::evicted: break;
  }
  return "it was evicted";
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
