// Thin POSIX file operations for checkpoints, each failure a DataError naming the path and the
// system error. Durability comes from the caller's ordering (write, fsync file, fsync directory,
// rename, fsync parent); these helpers only make each step checked. Internal to src/ckpt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep::ckpt::posix {

// A new file (must not exist) written sequentially and fsynced on close.
class NewFile {
 public:
  explicit NewFile(std::string path);
  ~NewFile();  // closes without fsync if close_synced() was not reached (an error path)
  NewFile(const NewFile&) = delete;
  NewFile& operator=(const NewFile&) = delete;

  void write(const void* data, size_t bytes);
  void write_zeros(size_t bytes);
  uint64_t bytes_written() const { return written_; }
  void close_synced();  // fsync, then close

 private:
  std::string path_;
  int fd_;
  uint64_t written_ = 0;
};

// An existing file read at explicit offsets.
class ReadFile {
 public:
  explicit ReadFile(std::string path);
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  uint64_t size() const { return size_; }
  // Reads exactly `bytes` at `offset`; DataError if the file ends first.
  void read_at(uint64_t offset, void* dst, size_t bytes) const;

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

std::string read_text(const std::string& path);
void fsync_dir(const std::string& path);
void make_dir(const std::string& path);           // one level; must not exist
void make_dirs(const std::string& path);          // like mkdir -p; fsyncs each created level's parent
void rename_path(const std::string& from, const std::string& to);
void remove_tree(const std::string& path);        // no error if absent
bool is_dir(const std::string& path);
bool exists(const std::string& path);

}  // namespace lockstep::ckpt::posix
