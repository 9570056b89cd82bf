// Checked POSIX file I/O (see durable_io.hpp).
#include "src/core/durable_io.hpp"

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

namespace lockstep::durable_io {
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

int create_flags(NewFile::IfExists if_exists) {
  return O_WRONLY | O_CREAT | (if_exists == NewFile::IfExists::kFail ? O_EXCL : O_TRUNC);
}

// `<dir>/.<name>.tmp.<pid>`: in the destination's directory, so that the rename stays within one
// file system, and hidden, so that directory listings of finished files skip it.
std::string temp_name_for(const std::string& path) {
  LS_REQUIRE(!path.empty() && path.back() != '/', "cannot write a file at '", path, "': not a file name");
  return str_cat(parent_of(path), "/.", std::filesystem::path(path).filename().string(), ".tmp.", ::getpid());
}

}  // namespace

NewFile::NewFile(std::string path, IfExists if_exists)
    : path_(std::move(path)), fd_(open_checked(path_, create_flags(if_exists), 0644)) {}

NewFile::~NewFile() {
  if (fd_ >= 0) ::close(fd_);
}

void NewFile::write(const void* data, size_t bytes) {
  LS_CHECK(fd_ >= 0, path_, " written after close");
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

void NewFile::write_at(uint64_t offset, const void* data, size_t bytes) {
  LS_CHECK(fd_ >= 0, path_, " written after close");
  LS_CHECK(offset <= written_ && bytes <= written_ - offset, "offset ", offset, " bytes ", bytes,
           " written ", written_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path_, "write", errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

void NewFile::close_synced() {
  LS_CHECK(fd_ >= 0, path_, " closed twice");
  if (::fsync(fd_) != 0) fail(path_, "fsync", errno);
  int fd = std::exchange(fd_, -1);
  // close() reporting an error after a successful fsync means nothing for the data, but it is
  // still a failed operation on the file: report it rather than guess.
  if (::close(fd) != 0) fail(path_, "close", errno);
}

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temp_(temp_name_for(path_), NewFile::IfExists::kTruncate) {}

AtomicFile::~AtomicFile() {
  if (!committed_) ::unlink(temp_.path().c_str());  // temp_ closes itself afterwards
}

void AtomicFile::commit() {
  LS_CHECK(!committed_, path_, " committed twice");
  temp_.close_synced();
  rename_path(temp_.path(), path_);
  committed_ = true;
  fsync_dir(parent_of(path_));  // makes the rename itself durable
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
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

std::string parent_of(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
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

}  // namespace lockstep::durable_io
