// AtomicFile (see atomic_file.hpp): POSIX open/write/fsync/rename.
#include "src/data/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/core/check.hpp"

namespace lockstep::data {

namespace {

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

[[noreturn]] void throw_errno(const std::string& path, const char* what) {
  throw DataError(str_cat(path, ": ", what, ": ", std::strerror(errno)));
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  LS_REQUIRE(!path_.empty() && path_.back() != '/', "cannot write a file at '", path_, "': not a file name");
  temp_path_ = str_cat(directory_of(path_), "/.", name_of(path_), ".tmp.", ::getpid());
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno(temp_path_, "cannot create temporary file");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  LS_CHECK(fd_ >= 0 && !committed_);
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(temp_path_, "write failed");
    p += n;
    left -= static_cast<size_t>(n);
  }
  size_ += static_cast<int64_t>(bytes);
}

void AtomicFile::write_at(int64_t offset, const void* data, size_t bytes) {
  LS_CHECK(fd_ >= 0 && !committed_);
  LS_CHECK(offset >= 0 && offset + static_cast<int64_t>(bytes) <= size_, "offset ", offset, " size ", size_);
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    const ssize_t n = ::pwrite(fd_, p, left, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(temp_path_, "write failed");
    p += n;
    offset += n;
    left -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  LS_CHECK(fd_ >= 0 && !committed_);
  if (::fsync(fd_) != 0) throw_errno(temp_path_, "fsync failed");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_errno(temp_path_, "close failed");
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw DataError(str_cat(path_, ": cannot rename ", temp_path_, " to it: ", std::strerror(errno)));
  }
  committed_ = true;
  // Make the rename itself durable.
  const std::string dir = directory_of(path_);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) throw_errno(dir, "cannot open directory to fsync it");
  const int rc = ::fsync(dir_fd);
  ::close(dir_fd);
  if (rc != 0) throw_errno(dir, "fsync of directory failed");
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
}

}  // namespace lockstep::data
