// AtomicFile: writes a file under a temporary name in the destination's directory, then fsyncs it,
// renames it over the final name and fsyncs the directory, so that the final name only ever holds
// a complete file (the old one or the new one), even after a crash. Used for token files,
// data.json, and the synthetic corpora.
// Not a general I/O layer: no appending to existing files, no buffering policy, no locking
// between concurrent writers of the same path (the last rename wins).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::data {

class AtomicFile {
 public:
  // Creates `<dir>/.<name>.tmp.<pid>` next to `path`. Throws DataError if it cannot.
  explicit AtomicFile(std::string path);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends at the end of what was written so far.
  void write(const void* data, size_t bytes);
  // Overwrites `bytes` at `offset` (< the bytes written so far): headers filled in last.
  void write_at(int64_t offset, const void* data, size_t bytes);
  int64_t bytes_written() const { return size_; }
  // fsync, rename to the final path, fsync the directory. Throws DataError on any failure.
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  int64_t size_ = 0;
  bool committed_ = false;
};

// The whole of `contents` into `path`, atomically (as AtomicFile).
void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace lockstep::data
