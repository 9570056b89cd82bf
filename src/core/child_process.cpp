// Child processes (child_process.hpp).
#include "src/core/child_process.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>

#include "src/core/check.hpp"

extern char** environ;

namespace lockstep {

namespace {

// argv as posix_spawnp takes it.
std::vector<char*> c_args(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  return args;
}

ChildExit wait_child(pid_t pid, const std::string& program) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw DataError(str_cat(program, ": waitpid failed: ", std::strerror(errno)));
  }
  if (WIFSIGNALED(status)) return {128 + WTERMSIG(status), true};
  return {WEXITSTATUS(status), false};
}

}  // namespace


ChildExit run_child(const std::vector<std::string>& argv, const std::string& log_path) {
  LS_CHECK(!argv.empty(), "run_child: empty argv");
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw DataError(str_cat(log_path, ": open failed: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fd, STDERR_FILENO);
  std::vector<char*> args = c_args(argv);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fd);
  if (rc != 0) throw DataError(str_cat(argv[0], ": cannot start: ", std::strerror(rc)));
  return wait_child(pid, argv[0]);
}

ChildExit run_child_lines(const std::vector<std::string>& argv, const std::function<void(pid_t)>& started,
                          const std::function<void(std::string_view)>& on_line) {
  LS_CHECK(!argv.empty(), "run_child_lines: empty argv");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw DataError(str_cat("pipe failed: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // its own group: signals reach all of it
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> args = c_args(argv);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw DataError(str_cat(argv[0], ": cannot start: ", std::strerror(rc)));
  }
  started(pid);
  std::string pending;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      on_line(std::string_view(pending).substr(start, nl - start));
    }
    pending.erase(0, start);
  }
  ::close(fds[0]);
  if (!pending.empty()) on_line(pending);
  return wait_child(pid, argv[0]);
}

std::string current_executable() {
  std::string buf(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size());
  if (n <= 0) throw DataError(str_cat("/proc/self/exe: readlink failed: ", std::strerror(errno)));
  buf.resize(static_cast<size_t>(n));
  return buf;
}

std::string tail_of_file(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

}  // namespace lockstep
