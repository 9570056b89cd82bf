// Checked POSIX file I/O for everything Lockstep writes to disk and must find whole after a crash:
// checkpoints (src/ckpt) and token files, data.json and synthetic corpora (src/data).
//
// Every failure throws DataError naming the path and the system error, in one form:
// "<path>: <operation> failed: <strerror>" (rename: "rename <from> -> <to> failed: <strerror>").
// Two ways to make a file durable:
//  - NewFile + the caller's ordering (write, close_synced, fsync the directory, rename, fsync the
//    parent): what checkpoints do, because a checkpoint is a directory of files;
//  - AtomicFile: one file written under a temporary name next to its final one, then fsynced,
//    renamed over the final name and the directory fsynced, so that the final name only ever
//    holds a complete file (the old one or the new one).
// Not a general I/O layer: no buffering policy, no appending to existing files, no locking between
// concurrent writers of the same path (the last rename wins). Readers that need their own messages
// (TokenFile's mmap) open files themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::durable_io {

// A file created for writing, written front to back (write_at patches bytes already written:
// headers filled in last) and fsynced on close.
class NewFile {
 public:
  enum class IfExists {
    kFail,      // O_EXCL: the path must not exist (checkpoint files inside a fresh directory)
    kTruncate,  // O_TRUNC: a stale file of the same name is emptied (AtomicFile's temporary name)
  };
  explicit NewFile(std::string path, IfExists if_exists = IfExists::kFail);
  ~NewFile();  // closes without fsync if close_synced() was not reached (an error path)
  NewFile(const NewFile&) = delete;
  NewFile& operator=(const NewFile&) = delete;

  // Appends at the end of what was written so far.
  void write(const void* data, size_t bytes);
  void write_zeros(size_t bytes);
  // Overwrites `bytes` at `offset`; offset + bytes must not pass bytes_written() (InternalError).
  void write_at(uint64_t offset, const void* data, size_t bytes);
  uint64_t bytes_written() const { return written_; }
  void close_synced();  // fsync, then close

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_;
  uint64_t written_ = 0;
};

// A file that replaces `path` atomically on commit() (see the header comment). Until then it is
// `<dir>/.<name>.tmp.<pid>`, removed by the destructor if commit() did not succeed.
class AtomicFile {
 public:
  // ConfigError if `path` is empty or ends in '/'; DataError if the temporary file cannot be made.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes) { temp_.write(data, bytes); }
  void write_at(uint64_t offset, const void* data, size_t bytes) { temp_.write_at(offset, data, bytes); }
  uint64_t bytes_written() const { return temp_.bytes_written(); }
  // fsync, close, rename to the final path, fsync the directory.
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  NewFile temp_;
  bool committed_ = false;
};

// The whole of `contents` into `path`, atomically (as AtomicFile).
void write_file_atomic(const std::string& path, std::string_view contents);

// An existing file read at explicit offsets.
class ReadFile {
 public:
  explicit ReadFile(std::string path);
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  uint64_t size() const { return size_; }
  // Reads exactly `bytes` at `offset`; DataError "<path>: truncated: ..." if the file ends first.
  void read_at(uint64_t offset, void* dst, size_t bytes) const;

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

std::string read_text(const std::string& path);   // the whole file
std::string parent_of(const std::string& path);   // "." for a bare name
void fsync_dir(const std::string& path);
void make_dir(const std::string& path);           // one level; must not exist
void make_dirs(const std::string& path);          // like mkdir -p; fsyncs each created level's parent
void rename_path(const std::string& from, const std::string& to);
void remove_tree(const std::string& path);        // no error if absent
bool is_dir(const std::string& path);
bool exists(const std::string& path);

}  // namespace lockstep::durable_io
