// Stop strings over streamed text: nothing of a stop string (not even a prefix) is released.
#include <gtest/gtest.h>

#include "runtime/completion_text.h"

namespace lily {
namespace {

// Feeds `text` in pieces of `step` bytes; returns what was released and whether it stopped.
std::pair<std::string, bool> run(const std::vector<std::string>& stops, const std::string& text, size_t step) {
  StopStrings s(stops);
  std::string out;
  for (size_t i = 0; i < text.size() && !s.stopped(); i += step) {
    std::string piece = s.push(text.substr(i, step));
    // Every release so far must not end inside a stop string that completes later.
    out += piece;
  }
  out += s.flush();
  return {out, s.stopped()};
}

TEST(StopStrings, CutsAtTheFirstStopWhateverTheSplit) {
  for (size_t step = 1; step <= 12; ++step) {
    auto [out, stopped] = run({"STOP", "END"}, "hello ST world STOP after END", step);
    EXPECT_EQ(out, "hello ST world ") << "step " << step;
    EXPECT_TRUE(stopped);
  }
}

TEST(StopStrings, EarliestStopWins) {
  auto [out, stopped] = run({"bc", "abcd"}, "xxabcdyy", 1);
  EXPECT_EQ(out, "xxa");
  EXPECT_TRUE(stopped);
}

TEST(StopStrings, HoldsBackAPossiblePrefixAndReleasesItWhenItIsNot) {
  StopStrings s({"</stop>"});
  EXPECT_EQ(s.push("abc</st"), "abc");
  EXPECT_EQ(s.push("x"), "</stx");
  EXPECT_EQ(s.push("<"), "");
  EXPECT_EQ(s.flush(), "<");
  EXPECT_FALSE(s.stopped());
}

TEST(StopStrings, NeverLeaksAPrefix) {
  // Whatever the split, the released text never contains "ST" once "STOP" follows it.
  const std::string text = "aSTbSTOP";
  for (size_t step = 1; step <= text.size(); ++step) {
    StopStrings s({"STOP"});
    std::string released;
    for (size_t i = 0; i < text.size(); i += step) released += s.push(text.substr(i, step));
    EXPECT_EQ(released, "aSTb") << "step " << step;
  }
}

TEST(StopStrings, NoStopsPassesEverythingThrough) {
  StopStrings s({});
  EXPECT_EQ(s.push("abc"), "abc");
  EXPECT_EQ(s.flush(), "");
  StopStrings empty({""});
  EXPECT_EQ(empty.push("abc"), "abc");
}

TEST(StopStrings, MultiByteCharactersStayWhole) {
  auto [out, stopped] = run({"é!"}, "caféé!", 1);
  EXPECT_EQ(out, "café");
  EXPECT_TRUE(stopped);
}

}  // namespace
}  // namespace lily
