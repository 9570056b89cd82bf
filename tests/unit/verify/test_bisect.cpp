// Pieces of `lockstep bisect` that need no child process: shell-like splitting of a side's
// arguments and quoting them back, the scan interval, and the op graph behind each hook name.
// The whole search runs end to end in tests/e2e/bisect_planted.sh.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "verify/bisect.hpp"
#include "verify/op_graph.hpp"
#include "verify/shell_words.hpp"

namespace lockstep::verify {
namespace {

using Words = std::vector<std::string>;

TEST(ShellWords, SplitsLikeAShell) {
  EXPECT_EQ(split_shell_words("--config c.toml  --train.mode=fast", "x"),
            (Words{"--config", "c.toml", "--train.mode=fast"}));
  EXPECT_EQ(split_shell_words("  ", "x"), Words{});
  EXPECT_EQ(split_shell_words("--a='x y' \"p q\"r --b=a\\ b ''", "x"), (Words{"--a=x y", "p qr", "--b=a b", ""}));
  EXPECT_EQ(split_shell_words(R"("a\"b\\c" 'it''s')", "x"), (Words{"a\"b\\c", "its"}));
  EXPECT_EQ(split_shell_words("'layer/*'", "x"), Words{"layer/*"});  // quoted globs stay text
}

TEST(ShellWords, RefusesWhatAShellWouldInterpret) {
  for (const char* bad : {"--x 'open", "--x \"open", "a\\", "a | b", "a; b", "x=$HOME", "a > f", "layer/*",
                          "\"$HOME\""}) {
    EXPECT_THROW(split_shell_words(bad, "--a"), ConfigError) << bad;
  }
  try {
    split_shell_words("--config 'c.toml", "--b");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--b: unterminated '"), std::string::npos) << e.what();
  }
}

TEST(ShellWords, QuotingRoundTrips) {
  const Words words = {"--config", "c d.toml", "it's", "", "--x=a*b", "plain/path-1.toml"};
  EXPECT_EQ(split_shell_words(join_shell_words(words), "x"), words);
  EXPECT_EQ(quote_shell_word("plain/path-1.toml"), "plain/path-1.toml");
  EXPECT_EQ(quote_shell_word("c d"), "'c d'");
}

TEST(Bisect, ScanIntervalIsAboutSqrtSteps) {
  EXPECT_EQ(default_bisect_every(1), 1);
  EXPECT_EQ(default_bisect_every(10), 3);
  EXPECT_EQ(default_bisect_every(200), 14);
  EXPECT_EQ(default_bisect_every(10000), 100);
}

// Every input of every op is a tensor computed before it (in the model's execution order), so a
// first divergent tensor in that order has inputs that were compared and agreed.
TEST(OpGraph, InputsPrecedeTheirOpInExecutionOrder) {
  const int64_t L = 3;
  ModelConfig cfg;
  cfg.n_layers = L;
  const ModelDesc desc = describe_model(cfg);
  std::vector<std::string> order = {"embed/out"};
  for (int64_t l = 0; l < L; ++l) {
    for (const char* t : {"ln1/out", "attn/qkv", "attn/att", "attn/out", "attn/res", "ln2/out", "mlp/fc", "mlp/act",
                          "mlp/res"}) {
      order.push_back("layer/" + std::to_string(l) + "/" + t);
    }
  }
  for (const char* t : {"lnf/out", "logits", "losses", "grad/logits", "grad/lnf/out"}) order.push_back(t);
  for (int64_t l = L - 1; l >= 0; --l) {
    for (const char* t : {"mlp/res", "mlp/act", "mlp/fc", "ln2/out", "attn/res", "attn/out", "attn/qkv", "ln1/out"}) {
      order.push_back("grad/layer/" + std::to_string(l) + "/" + t);
    }
  }
  order.push_back("grad/embed/out");
  std::set<std::string> seen;
  for (const auto& name : order) {
    const OpInputs in = op_inputs(name, desc);
    EXPECT_NE(in.op, "unknown") << name;
    for (const auto& input : in.tensors) EXPECT_TRUE(seen.count(input)) << name << " <- " << input;
    seen.insert(name);
  }
  EXPECT_EQ(op_inputs("layer/2/mlp/res", desc).tensors, (Words{"layer/2/mlp/act", "layer/2/attn/res"}));
  EXPECT_EQ(op_inputs("grad/layer/2/mlp/res", desc).tensors, (Words{"grad/lnf/out", "layer/2/mlp/res"}));
  EXPECT_EQ(op_inputs("grad/layer/0/mlp/res", desc).tensors,
            (Words{"grad/layer/1/ln1/out", "layer/0/mlp/res", "grad/layer/1/attn/res"}));
  EXPECT_EQ(op_inputs("layer/9/nonsense", desc).op, "unknown");
}

}  // namespace
}  // namespace lockstep::verify
