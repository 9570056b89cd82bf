// Checked POSIX file operations for checkpoints (see posix_io.hpp).
#include "src/ckpt/posix_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "src/core/check.hpp"

namespace lockstep::ckpt::posix {
namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int err) {
  throw DataError(str_cat(path, ": ", what, " failed: ", std::strerror(err)));
}

int open_checked(const std::string& path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail(path, "open", errno);
  return fd;
}

std::string parent_of(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

NewFile::NewFile(std::string path)
    : path_(std::move(path)), fd_(open_checked(path_, O_WRONLY | O_CREAT | O_EXCL, 0644)) {}

NewFile::~NewFile() {
  if (fd_ >= 0) ::close(fd_);
}

void NewFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path_, "write", errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

void NewFile::write_zeros(size_t bytes) {
  static constexpr char kZeros[256] = {};
  while (bytes > 0) {
    size_t n = std::min(bytes, sizeof kZeros);
    write(kZeros, n);
    bytes -= n;
  }
}

void NewFile::close_synced() {
  if (::fsync(fd_) != 0) fail(path_, "fsync", errno);
  int fd = std::exchange(fd_, -1);
  // close() reporting an error after a successful fsync means nothing for the data, but it is
  // still a failed operation on the file: report it rather than guess.
  if (::close(fd) != 0) fail(path_, "close", errno);
}

ReadFile::ReadFile(std::string path) : path_(std::move(path)), fd_(open_checked(path_, O_RDONLY)) {
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    fail(path_, "stat", err);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

ReadFile::~ReadFile() { ::close(fd_); }

void ReadFile::read_at(uint64_t offset, void* dst, size_t bytes) const {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    ssize_t n = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path_, "read", errno);
    }
    if (n == 0) {
      throw DataError(str_cat(path_, ": truncated: file ends at byte ", offset, ", ", bytes,
                              " more bytes expected"));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

std::string read_text(const std::string& path) {
  ReadFile f(path);
  std::string text(f.size(), '\0');
  f.read_at(0, text.data(), text.size());
  return text;
}

void fsync_dir(const std::string& path) {
  int fd = open_checked(path, O_RDONLY | O_DIRECTORY);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) fail(path, "fsync", err);
}

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) fail(path, "mkdir", errno);
}

void make_dirs(const std::string& path) {
  if (is_dir(path)) return;
  std::string parent = parent_of(path);
  if (parent != path) make_dirs(parent);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) fail(path, "mkdir", errno);
  if (!is_dir(path)) throw DataError(str_cat(path, ": exists but is not a directory"));
  fsync_dir(parent);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw DataError(str_cat("rename ", from, " -> ", to, " failed: ", std::strerror(errno)));
  }
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) throw DataError(str_cat(path, ": remove failed: ", ec.message()));
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace lockstep::ckpt::posix
