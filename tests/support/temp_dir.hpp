// Scratch files for tests: a fresh directory per test (mkdtemp under the system temp directory,
// removed with everything in it when the TempDir goes out of scope), and whole-file read/write
// through iostreams, deliberately independent of src/core/durable_io.hpp so that tests do not check
// the code under test with itself.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "src/core/check.hpp"

namespace lockstep::test {

class TempDir {
 public:
  // `prefix` names the test binary's directories in the temp directory (seen if one is left over).
  explicit TempDir(const std::string& prefix = "ls_test_") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    LS_CHECK(::mkdtemp(pattern.data()) != nullptr, pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;  // a destructor must not throw; a leftover directory is harmless
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes `text` to `path` (replacing it), creating missing parent directories.
inline void write_text(const std::string& path, const std::string& text) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The whole of `path` ("" if it cannot be opened).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace lockstep::test
