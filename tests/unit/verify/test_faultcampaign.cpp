// The fault campaign's judgement of a record (verify/faultcampaign.hpp): each site's class, and
// what an undetected fault that changed the model counts as — a miss at an every-step site, an
// undetected fault (the replay's rate) at an interval site such as the reduced gradient.
#include <gtest/gtest.h>

#include <vector>

#include "verify/faultcampaign.hpp"

namespace lockstep::verify {
namespace {

TEST(FaultCampaign, SiteClasses) {
  EXPECT_EQ(site_class("gemm/layer/0/mlp/fc/weight/forward"), "gemm");
  EXPECT_EQ(site_class("comm/dp/all_gatherv"), "comm");
  EXPECT_EQ(site_class("param/wte"), "state");
  EXPECT_EQ(site_class("optim/m"), "state");
  EXPECT_EQ(site_class("optim/v"), "state");
  EXPECT_EQ(site_class("optim/grad"), "activation");
  EXPECT_EQ(site_class("layer/1/attn/qkv"), "activation");
}

TEST(FaultCampaign, AnUndetectedChangeIsMissedOnlyAtEveryStepSites) {
  const RunConfig cfg;
  auto record = [](const char* site) {
    return nlohmann::json{{"step", 3}, {"rank", 1}, {"site", site}, {"bit", 4}, {"detected", false}, {"changed", true}};
  };
  const std::vector<nlohmann::json> faults = {{{"step", 3}}, {{"step", 7}}};
  const nlohmann::json s = summarize_campaign(faults, {record("param/wte"), record("optim/grad")}, 10, cfg);
  EXPECT_EQ(s["totals"]["missed"], 1) << s.dump();
  EXPECT_EQ(s["interval_sites"]["undetected"], 1) << s.dump();
}

}  // namespace
}  // namespace lockstep::verify
