// Splitting a command-line string into words the way a POSIX shell does for a plain command, and
// quoting words back: `lockstep bisect --a='--config c.toml --inject.kind="cast:bf16"'` names each
// side's arguments as one string, and bisect-report.md prints commands a person can paste.
//
// Supported: blanks separate words; '...' is literal; "..." keeps blanks and honours \" \\ \$ \`;
// a backslash outside quotes escapes the next character. Not supported (ConfigError naming the
// character): expansions ($VAR, `cmd`, globs are left as literal text only when quoted), redirections
// and control operators (| & ; < > ( )), which would mean something else to a shell.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::verify {

// ConfigError naming `what` on an unterminated quote or an unquoted shell operator.
std::vector<std::string> split_shell_words(const std::string& text, const std::string& what);

// The word as a shell reads it back: unchanged when it holds only safe characters, else in '...'.
std::string quote_shell_word(const std::string& word);
std::string join_shell_words(const std::vector<std::string>& words);

// The words of a launcher template (`mpirun --oversubscribe -np {np}`) for np ranks: none for one
// rank (the executable runs as it is), else the template's words with {np} replaced.
std::vector<std::string> launcher_words(const std::string& launcher, int64_t np, const std::string& what);

}  // namespace lockstep::verify
