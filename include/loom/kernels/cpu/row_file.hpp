// A hash-table shard's disk tier (graph/hash_embedding.hpp, disk_tier_dir): the rows a
// full memory tier moved out, each a fixed-size record in one file on the shard's task's
// local disk, found through an index in memory (an unordered_map node per id: its id,
// record number and last lookup, and the map's own pointers), and in the order of their
// last lookups (each id listed again under its last lookup), so that letting the aged rows
// go costs their number, not a pass over the index: a pass over 2 x 10^6 rows took 83 ms,
// under the shard's lock (benchmarks/disk_tier_aging).
//
// Why a file of records and not RocksDB: a row's record has one size for the table's
// life, so freed records are reused in place and nothing ever needs compacting; an LSM
// store would rewrite each spilled row several times in compactions and run threads of
// its own beside the ps's. A record is read with one pread and written with one pwrite,
// through the page cache: no fsync, since the tier extends memory and is not what makes
// a table durable (checkpoints are). For the same reason a process starts its tier empty:
// the file is truncated when opened, and locked (flock) while a process uses it, so two
// tasks given the same directory and table fail instead of overwriting each other's rows.
//
// A record: the id (int64), its last lookup by the shard's clock (int64), then the
// row's payload (its values and its optimizer slots' values, as the caller lays them out).
#pragma once

#include <loom/core/error.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::kernels {

class row_file {
public:
  static constexpr std::size_t header_bytes = 2 * sizeof(std::int64_t);

  // Opens (creating, truncating and locking) `path` for records of `payload_bytes`.
  row_file(std::string path, std::size_t payload_bytes)
      : path_(std::move(path)), record_(header_bytes + payload_bytes) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      fail<failed_precondition_error>("cannot open it");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      ::close(fd_);
      fd_ = -1;
      errno = e;
      fail<failed_precondition_error>(
          e == EWOULDBLOCK ? "another process uses it (two tasks given one directory and table?)"
                           : "cannot lock it");
    }
    if (::ftruncate(fd_, 0) != 0) {
      ::close(fd_);
      fd_ = -1;
      fail<failed_precondition_error>("cannot truncate it");
    }
  }
  row_file(const row_file&) = delete;
  row_file& operator=(const row_file&) = delete;
  ~row_file() {
    if (fd_ >= 0)
      ::close(fd_); // also releases the lock
  }

  const std::string& path() const noexcept { return path_; }
  std::size_t payload_bytes() const noexcept { return record_ - header_bytes; }
  std::int64_t rows() const noexcept { return static_cast<std::int64_t>(where_.size()); }
  // The file's size: every record made, in use or free for reuse.
  std::int64_t bytes() const noexcept { return records_ * static_cast<std::int64_t>(record_); }

  struct entry {
    std::int64_t record;
    std::int64_t last_lookup;
  };
  // The id's record and last lookup, or nullptr where the tier does not hold it.
  const entry* find(std::int64_t id) const {
    const auto it = where_.find(id);
    return it == where_.end() ? nullptr : &it->second;
  }

  // Calls f(id, entry) for every id held, in no particular order.
  template <class F> void for_each(F&& f) const {
    for (const auto& [id, e] : where_)
      f(id, e);
  }

  // Writes the id's record (a new one; the id must not be held), its payload from
  // `payload`. On an error (the disk full, the file size limit) the tier is as before.
  void put(std::int64_t id, std::int64_t last_lookup, const void* payload) {
    std::int64_t r;
    if (free_.empty()) {
      r = records_;
    } else {
      r = free_.back();
    }
    buffer_.resize(record_);
    std::memcpy(buffer_.data(), &id, sizeof id);
    std::memcpy(buffer_.data() + sizeof id, &last_lookup, sizeof last_lookup);
    std::memcpy(buffer_.data() + header_bytes, payload, payload_bytes());
    write_all(buffer_.data(), offset(r));
    // In the age order first: should the index then fail to take it, the order's entry
    // names an id not held, which erase_aged skips.
    by_age_[last_lookup].push_back(id);
    ++age_entries_;
    if (r == records_)
      ++records_;
    else
      free_.pop_back();
    where_.emplace(id, entry{r, last_lookup});
  }

  // Reads the payload of the id's record (`e`, from find), or its first `bytes`, into `payload`.
  void get(const entry& e, void* payload, std::size_t bytes = 0) const {
    read_all(payload, bytes ? bytes : payload_bytes(),
             offset(e.record) + static_cast<off_t>(header_bytes));
  }

  // Holds no record again (the table was replaced whole).
  void clear() {
    if (::ftruncate(fd_, 0) != 0)
      fail<internal_error>("cannot truncate it");
    records_ = 0;
    free_.clear();
    where_.clear();
    by_age_.clear();
    age_entries_ = 0;
  }

  // Lets the id's record go (its place is reused by the next put). Its entry in the age
  // order stays until erase_aged reaches it, or the order is rebuilt: when it holds twice
  // the rows, and so once per as many erases as there are rows (a pass over the index).
  void erase(std::int64_t id) {
    const auto it = where_.find(id);
    if (it == where_.end())
      return;
    free_.push_back(it->second.record);
    where_.erase(it);
    if (age_entries_ > 2 * where_.size() + 1024) {
      by_age_.clear();
      for (const auto& [held, e] : where_)
        by_age_[e.last_lookup].push_back(held);
      age_entries_ = where_.size();
    }
  }

  // Lets go of every id whose last lookup is at most `by` (as erase), oldest first, and
  // returns them: in time for their number and the erased ids' entries among them.
  std::vector<std::int64_t> erase_aged(std::int64_t by) {
    std::vector<std::int64_t> aged;
    for (auto at = by_age_.begin(); at != by_age_.end() && at->first <= by;
         at = by_age_.erase(at)) {
      for (const std::int64_t id : at->second) {
        // An id erased since (or erased and put again) has another last lookup, or none.
        const auto it = where_.find(id);
        if (it == where_.end() || it->second.last_lookup != at->first)
          continue;
        free_.push_back(it->second.record);
        where_.erase(it);
        aged.push_back(id);
      }
      age_entries_ -= at->second.size();
    }
    return aged;
  }

private:
  off_t offset(std::int64_t record) const {
    return static_cast<off_t>(record) * static_cast<off_t>(record_);
  }

  template <class Error> [[noreturn]] void fail(const std::string& what) const {
    throw Error("the disk tier's file " + path_ + ": " + what + " (" + std::strerror(errno) + ")");
  }

  void write_all(const unsigned char* from, off_t at) const {
    std::size_t done = 0;
    while (done < record_) {
      const ssize_t n = ::pwrite(fd_, from + done, record_ - done, at + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        if (n == 0)
          errno = ENOSPC;
        // ENOSPC, EDQUOT and EFBIG (the process's file size limit) are a full tier: the
        // step that needed room fails and says so; the rows it had not moved stay in memory.
        if (errno == ENOSPC || errno == EDQUOT || errno == EFBIG)
          fail<resource_exhausted_error>("no room for another row of " + std::to_string(record_) +
                                         " bytes at " + std::to_string(at) + " bytes");
        fail<internal_error>("writing " + std::to_string(record_) + " bytes at " +
                             std::to_string(at) + " failed");
      }
      done += static_cast<std::size_t>(n);
    }
  }

  void read_all(void* to, std::size_t bytes, off_t at) const {
    std::size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd_, static_cast<unsigned char*>(to) + done, bytes - done,
                                at + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        if (n == 0)
          errno = EIO;
        fail<data_loss_error>("reading " + std::to_string(bytes) + " bytes at " +
                              std::to_string(at) + " failed");
      }
      done += static_cast<std::size_t>(n);
    }
  }

  std::string path_;
  std::size_t record_;
  int fd_ = -1;
  std::int64_t records_ = 0;       // records made: the file's length over record_
  std::vector<std::int64_t> free_; // records below records_ that hold no id
  std::unordered_map<std::int64_t, entry> where_;
  // The ids put with each last lookup, in the order put: an entry per put, some naming ids
  // erased since (age_entries_ of them in all).
  std::map<std::int64_t, std::vector<std::int64_t>> by_age_;
  std::size_t age_entries_ = 0;
  std::vector<unsigned char> buffer_;
};

} // namespace loom::kernels
