// served_pick.h's rule (which pick each pick group of the fused one-token MoE kernel serves with a
// FusedPrediction) on the host: for random picks and guesses of every kind (right in order, right
// in another order, repeated, invalid ids, none right, random mixes) and K from 1 to 32, the map
// group -> pick is a permutation (every pick served once), a group whose guess is a pick and the
// first with that guess serves it, and the other groups take the other picks in increasing order;
// with more groups than picks the groups left over serve none. Plain C++: runs without a GPU.
#include "gpu_service/backends/cuda/moe/served_pick.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

constexpr int kE = 512;

TEST(NthSetBitTest, FindsTheNthSetBit) {
  EXPECT_EQ(NthSetBit(0u, 0), -1);
  EXPECT_EQ(NthSetBit(1u, 0), 0);
  EXPECT_EQ(NthSetBit(1u, 1), -1);
  EXPECT_EQ(NthSetBit(0x80000000u, 0), 31);
  EXPECT_EQ(NthSetBit(0b1010u, 0), 1);
  EXPECT_EQ(NthSetBit(0b1010u, 1), 3);
  EXPECT_EQ(NthSetBit(0b1010u, 2), -1);
  for (int n = 0; n < 32; ++n) EXPECT_EQ(NthSetBit(0xFFFFFFFFu, n), n);
  EXPECT_EQ(NthSetBit(0xFFFFFFFFu, 32), -1);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (int t = 0; t < 1000; ++t) {
    const unsigned mask = static_cast<unsigned>(rng());
    std::vector<int> bits;
    for (int b = 0; b < 32; ++b) {
      if ((mask >> b) & 1u) bits.push_back(b);
    }
    for (int n = 0; n <= 32; ++n) {
      EXPECT_EQ(NthSetBit(mask, n), n < static_cast<int>(bits.size()) ? bits[n] : -1) << "mask " << mask << " n " << n;
    }
  }
}

// The rule's properties for one set of guesses (a group each: K or more groups) and K picks.
void CheckServed(const std::vector<int>& guesses, const std::vector<int>& picks, const std::string& what) {
  const int K = static_cast<int>(picks.size()), G = static_cast<int>(guesses.size());
  ASSERT_GE(G, K) << what;
  std::vector<int> served(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) served[g] = ServedPickOfGroups(guesses.data(), G, picks.data(), K, kE, g);
  if (G == K) {
    for (int k = 0; k < K; ++k) EXPECT_EQ(ServedPick(guesses.data(), picks.data(), K, kE, k), served[k]) << what;
  }
  // Every pick served by one group; the groups left over serve none (-1).
  std::vector<int> sorted;
  for (int v : served) {
    if (v != -1) sorted.push_back(v);
  }
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(static_cast<size_t>(K));
  std::iota(identity.begin(), identity.end(), 0);
  ASSERT_EQ(sorted, identity) << what << ": not every pick served once";
  // Matches: a valid guess equal to a valid pick, the first group with that guess.
  std::vector<int> match(static_cast<size_t>(G), -1);
  std::vector<bool> pick_matched(static_cast<size_t>(K), false);
  for (int g = 0; g < G; ++g) {
    const int id = guesses[g];
    if (id < 0 || id >= kE) continue;
    if (std::find(guesses.begin(), guesses.begin() + g, id) != guesses.begin() + g) continue;
    const auto it = std::find(picks.begin(), picks.end(), id);
    if (it == picks.end()) continue;
    match[g] = static_cast<int>(it - picks.begin());
    pick_matched[match[g]] = true;
  }
  std::vector<int> free_picks;
  for (int j = 0; j < K; ++j) {
    if (!pick_matched[j]) free_picks.push_back(j);
  }
  size_t n = 0;
  for (int g = 0; g < G; ++g) {
    if (match[g] >= 0) {
      EXPECT_EQ(served[g], match[g]) << what << ": group " << g << " (guess " << guesses[g] << ") not its pick";
    } else if (n < free_picks.size()) {
      EXPECT_EQ(served[g], free_picks[n]) << what << ": unmatched group " << g << " not the next unmatched pick";
      ++n;
    } else {
      EXPECT_EQ(served[g], -1) << what << ": group " << g << " past the unmatched picks";
    }
  }
  EXPECT_EQ(n, free_picks.size()) << what;
}

// K distinct valid ids (a random routing's picks).
std::vector<int> RandomPicks(std::mt19937& rng, int K) {
  std::vector<int> all(kE);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  return std::vector<int>(all.begin(), all.begin() + K);
}

// A valid id that is not a pick.
int NotAPick(std::mt19937& rng, const std::vector<int>& picks) {
  for (;;) {
    const int id = static_cast<int>(rng() % kE);
    if (std::find(picks.begin(), picks.end(), id) == picks.end()) return id;
  }
}

int InvalidId(std::mt19937& rng) {
  const int ids[] = {-1, kE, kE + 7, INT_MAX, INT_MIN, -1000};
  return ids[rng() % 6];
}

// n guesses, each a pick (repeats allowed), a non-pick or an invalid id.
std::vector<int> RandomMix(std::mt19937& rng, const std::vector<int>& picks, int n) {
  std::vector<int> mix(static_cast<size_t>(n));
  for (int& id : mix) {
    const unsigned kind = rng() % 3;
    id = kind == 0 ? picks[rng() % picks.size()] : kind == 1 ? NotAPick(rng, picks) : InvalidId(rng);
  }
  return mix;
}

TEST(ServedPickTest, EveryPickServedOnceAndRightGuessesKeepTheirPick) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (int K = 1; K <= 32; ++K) {
    for (int t = 0; t < 20; ++t) {
      const std::vector<int> picks = RandomPicks(rng, K);
      const std::string tag = "K " + std::to_string(K) + " trial " + std::to_string(t);
      // All right, in order: every group serves its own pick.
      CheckServed(picks, picks, tag + " all right");
      for (int k = 0; k < K; ++k) EXPECT_EQ(ServedPick(picks.data(), picks.data(), K, kE, k), k) << tag;
      // All right in reverse order: group k serves pick K - 1 - k.
      std::vector<int> reversed(picks.rbegin(), picks.rend());
      CheckServed(reversed, picks, tag + " reversed");
      for (int k = 0; k < K; ++k) EXPECT_EQ(ServedPick(reversed.data(), picks.data(), K, kE, k), K - 1 - k) << tag;
      // All right in a random order.
      std::vector<int> shuffled = picks;
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      CheckServed(shuffled, picks, tag + " shuffled");
      // None right (valid ids, not picks), and all invalid: the identity.
      std::vector<int> none(static_cast<size_t>(K)), invalid(static_cast<size_t>(K));
      for (int k = 0; k < K; ++k) {
        none[k] = NotAPick(rng, picks);
        invalid[k] = InvalidId(rng);
      }
      CheckServed(none, picks, tag + " none right");
      CheckServed(invalid, picks, tag + " invalid");
      for (int k = 0; k < K; ++k) {
        EXPECT_EQ(ServedPick(none.data(), picks.data(), K, kE, k), k) << tag << " none right";
        EXPECT_EQ(ServedPick(invalid.data(), picks.data(), K, kE, k), k) << tag << " invalid";
      }
      // One right id repeated K times: the first group serves it, the rest the other picks in order.
      const int j = static_cast<int>(rng() % K);
      const std::vector<int> repeated(static_cast<size_t>(K), picks[j]);
      CheckServed(repeated, picks, tag + " repeated");
      EXPECT_EQ(ServedPick(repeated.data(), picks.data(), K, kE, 0), j) << tag;
      // Random mixes: picks (repeats allowed), non-picks, invalid ids.
      for (int m = 0; m < 10; ++m) CheckServed(RandomMix(rng, picks, K), picks, tag + " mix " + std::to_string(m));
    }
  }
}

// Picks the routing could not make (id E, possibly repeated, as WarpPickLogits leaves them) are
// matched by no guess, not even a guess of E, and are still served once.
TEST(ServedPickTest, InvalidPicksAreServedButNeverMatched) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (int K = 2; K <= 32; ++K) {
    std::vector<int> picks = RandomPicks(rng, K);
    const int bad = 1 + static_cast<int>(rng() % (K - 1));  // the last `bad` picks not made
    for (int k = K - bad; k < K; ++k) picks[k] = kE;
    std::vector<int> guesses(picks.rbegin(), picks.rend());
    CheckServed(guesses, picks, "K " + std::to_string(K) + " with " + std::to_string(bad) + " picks of id E");
    for (int k = 0; k < K; ++k) {
      const int served = ServedPick(guesses.data(), picks.data(), K, kE, k);
      if (guesses[k] == kE) {
        EXPECT_GE(served, K - bad) << "group " << k << " guessed E";
      } else {
        EXPECT_EQ(picks[served], guesses[k]) << "group " << k;
      }
    }
  }
}

// More groups than picks (FusedPrediction::groups): the groups' guesses hold the picks anywhere,
// some of them, or none; every pick is still served once, matched groups keep their pick, and the
// unmatched groups past the unmatched picks serve none.
TEST(ServedPickTest, MoreGroupsThanPicksServeEveryPickOnce) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (int K = 1; K <= 31; ++K) {
    for (int G = K + 1; G <= 32; G += 1 + static_cast<int>(rng() % 4)) {
      for (int t = 0; t < 10; ++t) {
        const std::vector<int> picks = RandomPicks(rng, K);
        const std::string tag = "K " + std::to_string(K) + " groups " + std::to_string(G) + " trial " + std::to_string(t);
        // Every pick among the guesses, at random places; the other groups guess non-picks.
        std::vector<int> guesses(static_cast<size_t>(G));
        for (int g = 0; g < G; ++g) guesses[g] = NotAPick(rng, picks);
        std::vector<int> places(static_cast<size_t>(G));
        std::iota(places.begin(), places.end(), 0);
        std::shuffle(places.begin(), places.end(), rng);
        for (int j = 0; j < K; ++j) guesses[places[j]] = picks[j];
        CheckServed(guesses, picks, tag + " all picks guessed");
        for (int j = 0; j < K; ++j) {
          EXPECT_EQ(ServedPickOfGroups(guesses.data(), G, picks.data(), K, kE, places[j]), j) << tag;
        }
        // None right: the first K groups serve the picks in order, the rest none.
        std::vector<int> none(static_cast<size_t>(G));
        for (int g = 0; g < G; ++g) none[g] = rng() % 2 == 0 ? NotAPick(rng, picks) : InvalidId(rng);
        CheckServed(none, picks, tag + " none right");
        for (int g = 0; g < G; ++g) {
          EXPECT_EQ(ServedPickOfGroups(none.data(), G, picks.data(), K, kE, g), g < K ? g : -1) << tag;
        }
        // Random mixes.
        for (int m = 0; m < 5; ++m) CheckServed(RandomMix(rng, picks, G), picks, tag + " mix " + std::to_string(m));
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cuda
