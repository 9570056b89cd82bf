// Token file reader and writer (see token_file.hpp).
#include "src/data/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "src/core/check.hpp"

namespace lockstep::data {

namespace {

constexpr const char* kRegenerateHint =
    "regenerate it with `lockstep data build --input TEXT --out DIR`";

}  // namespace

TokenFile::TokenFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(str_cat(path_, ": cannot open token file: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw DataError(str_cat(path_, ": cannot stat token file: ", std::strerror(err)));
  }
  const int64_t file_bytes = st.st_size;
  if (!S_ISREG(st.st_mode) || file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    if (!S_ISREG(st.st_mode)) throw DataError(str_cat(path_, ": not a regular file"));
    throw DataError(str_cat(path_, ": truncated: file has ", file_bytes, " bytes, shorter than the ",
                            kTokenFileHeaderBytes, "-byte header"));
  }
  map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw DataError(str_cat(path_, ": cannot mmap token file: ", std::strerror(map_err)));
  }
  map_bytes_ = file_bytes;

  std::array<int32_t, 3> header{};
  std::memcpy(header.data(), map_, sizeof(header));
  try {
    if (header[0] != kTokenFileMagic) {
      throw DataError(str_cat(path_, ": bad magic: header[0] is ", header[0], ", expected ", kTokenFileMagic,
                              " (not a Lockstep/llm.c token file); ", kRegenerateHint));
    }
    if (header[1] != kTokenFileVersion) {
      throw DataError(str_cat(path_, ": unsupported version: header[1] is ", header[1], ", expected ",
                              kTokenFileVersion, "; ", kRegenerateHint));
    }
    if (header[2] < 0) {
      throw DataError(str_cat(path_, ": bad token count: header[2] is ", header[2], ", expected >= 0"));
    }
    const int64_t expected = token_file_bytes(header[2]);
    if (file_bytes != expected) {
      throw DataError(str_cat(path_, ": ", file_bytes < expected ? "truncated" : "trailing bytes",
                              ": header says ", header[2], " tokens (", expected, " bytes) but file has ",
                              file_bytes, " bytes"));
    }
  } catch (...) {
    release();
    throw;
  }
  num_tokens_ = header[2];
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kTokenFileHeaderBytes);
}

TokenFile::~TokenFile() { release(); }

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      num_tokens_(std::exchange(other.num_tokens_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
  }
  return *this;
}

void TokenFile::release() {
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(map_bytes_));
  map_ = nullptr;
  map_bytes_ = 0;
  num_tokens_ = 0;
  tokens_ = nullptr;
}

template <class Visit>
void TokenFile::scan_tokens(const Visit& visit) const {
  constexpr int64_t kRunBytes = int64_t{1} << 20;  // a multiple of the page size
  for (int64_t at = 0; at < map_bytes_; at += kRunBytes) {
    const int64_t end = std::min(map_bytes_, at + kRunBytes);
    const int64_t first_token = std::max<int64_t>(0, (at - kTokenFileHeaderBytes) / 2);
    const int64_t end_token = std::clamp<int64_t>((end - kTokenFileHeaderBytes) / 2, 0, num_tokens_);
    if (first_token < end_token) visit(first_token, end_token);
    ::madvise(static_cast<char*>(map_) + at, static_cast<size_t>(end - at), MADV_DONTNEED);
  }
}

void TokenFile::check_vocab(int32_t vocab_size) const {
  LS_CHECK(vocab_size > 0, vocab_size);
  scan_tokens([&](int64_t first, int64_t end) {
    for (int64_t i = first; i < end; ++i) {
      if (tokens_[i] >= vocab_size) {
        throw DataError(str_cat(path_, ": token out of range: position ", i, " holds ", tokens_[i],
                                ", expected < vocab_size ", vocab_size));
      }
    }
  });
}

int32_t TokenFile::max_token() const {
  int32_t m = -1;
  scan_tokens([&](int64_t first, int64_t end) {
    for (int64_t i = first; i < end; ++i) m = std::max<int32_t>(m, tokens_[i]);
  });
  return m;
}

TokenFileWriter::TokenFileWriter(std::string path) : file_(std::move(path)) {
  const std::array<int32_t, kTokenFileHeaderInts> zeros{};
  file_.write(zeros.data(), sizeof(zeros));  // header as zeros for now: commit() writes the count
}

void TokenFileWriter::append(std::span<const uint16_t> tokens) {
  file_.write(tokens.data(), tokens.size_bytes());
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void TokenFileWriter::commit() {
  if (num_tokens_ > kTokenFileMaxTokens) {
    throw DataError(str_cat(file_.path(), ": too many tokens: ", num_tokens_, ", the format holds at most ",
                            kTokenFileMaxTokens, " per file (header[2] is int32)"));
  }
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(num_tokens_);
  file_.write_at(0, header.data(), sizeof(header));
  file_.commit();
}

void write_token_file(const std::string& path, std::span<const uint16_t> tokens) {
  TokenFileWriter writer(path);
  writer.append(tokens);
  writer.commit();
}

}  // namespace lockstep::data
