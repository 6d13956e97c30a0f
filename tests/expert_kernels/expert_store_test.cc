// The expert store: a share's slices equal the file's bytes, the computer serving them matches the
// reference FFN, and bad shares / NUMA nodes are refused clearly.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model_gen/model_generator.h"
#include "common/model_gen/model_spec.h"
#include "common/reference/moe.h"
#include "gtest/gtest.h"
#include "host_expert_worker/store/expert_store.h"
#include "tests/expert_kernels/random_experts.h"

namespace tandem {
namespace {

class ExpertStoreTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(absl::StrCat(TANDEM_BINARY_DIR, "/expert_store_test_", getpid(), ".gguf"));
    GenModelSpec spec = *PresetSpec("tiny");
    spec.expert_gate_up_type = WeightType::kQ4_K;
    spec.expert_down_type = WeightType::kQ6_K;
    ASSERT_TRUE(GenerateModel(spec, *path_).ok());
    file_ = GgufFile::Open(*path_)->release();
  }
  static void TearDownTestSuite() {
    delete file_;
    unlink(path_->c_str());
    delete path_;
  }
  void SetUp() override {
    WorkerThreadPoolOptions o;
    o.threads = 2;
    pool_ = *WorkerThreadPool::Create(o);
  }

  static std::string* path_;
  static GgufFile* file_;
  std::unique_ptr<WorkerThreadPool> pool_;
};
std::string* ExpertStoreTest::path_ = nullptr;
GgufFile* ExpertStoreTest::file_ = nullptr;

TEST_F(ExpertStoreTest, ShareHoldsTheFilesBytesAndComputesLikeTheReference) {
  const ModelConfig config = *ReadModelConfig(*file_);
  const ModelWeights weights = *BindModelWeights(*file_, config);
  ExpertStoreOptions options;
  options.share = *ParseExpertShare("1/3");
  std::unique_ptr<ExpertStore> store = *ExpertStore::Load(*file_, options, pool_.get());
  const ExpertModelShape& shape = store->shape();
  const uint32_t E = static_cast<uint32_t>(config.moe.E);
  EXPECT_EQ(shape.expert_begin, E / 3);
  EXPECT_EQ(shape.expert_end, 2 * E / 3);
  EXPECT_EQ(shape.layer_count, weights.layers.size());
  EXPECT_EQ(shape.expert_count, E);
  EXPECT_EQ(shape.hidden_size, config.h);
  EXPECT_EQ(shape.fingerprint, *ExpertTensorsFingerprint(*file_, shape.layer_count));

  const uint32_t held = shape.expert_end - shape.expert_begin;
  for (uint32_t l = 0; l < shape.layer_count; ++l) {
    const ExpertLayerView& v = store->layer(l);
    const MoeWeights& m = weights.layers[l].moe;
    for (auto [got, want] : {std::pair{&v.gate, &m.gate}, std::pair{&v.up, &m.up}, std::pair{&v.down, &m.down}}) {
      ASSERT_EQ(got->experts, held);
      const size_t expert_bytes = static_cast<size_t>(want->rows * want->row_bytes);
      EXPECT_EQ(std::memcmp(got->data,
                            static_cast<const uint8_t*>(want->data) + expert_bytes * shape.expert_begin,
                            expert_bytes * held),
                0)
          << "layer " << l;
    }
  }

  // The computer on the store against the reference FFN of the file's experts.
  ExpertFfnEngineOptions eo;
  eo.hidden = config.h;
  eo.inner = config.expert_ffn;
  eo.isa = BestKernelIsa();
  std::unique_ptr<ExpertFfnEngine> engine = *ExpertFfnEngine::Create(eo, pool_.get());
  HostExpertComputer computer(store.get(), engine.get());
  const std::vector<float> x = RandomActivations(2 * config.h, 3);
  const std::vector<ExpertRowPair> pairs = {{shape.expert_begin, 0}, {shape.expert_end - 1, 1},
                                            {shape.expert_begin, 1}};
  const uint32_t layer = shape.layer_count - 1;
  ExpertBatch batch;
  batch.layer = layer;
  batch.pairs = pairs;
  batch.activations = x.data();
  batch.activation_row_count = 2;
  batch.hidden_size = static_cast<uint32_t>(config.h);
  for (bool exact : {true, false}) {
    batch.exact = exact;
    std::vector<float> out(pairs.size() * config.h);
    ASSERT_TRUE(computer.Compute(batch, out.data()).ok());
    double num = 0, den = 0;
    std::vector<float> want(config.h);
    for (size_t i = 0; i < pairs.size(); ++i) {
      ExpertFfn(weights.layers[layer].moe, pairs[i].expert, x.data() + pairs[i].row * config.h, 1,
                want.data(), nullptr);
      for (int64_t j = 0; j < config.h; ++j) {
        num += std::pow(out[i * config.h + j] - want[j], 2);
        den += std::pow(want[j], 2);
      }
    }
    EXPECT_LE(std::sqrt(num / den), exact ? 1e-5 : 2.5e-2) << (exact ? "exact" : "int8");
  }
}

TEST_F(ExpertStoreTest, RefusesANumaNodeThatDoesNotExist) {
  ExpertStoreOptions options;
  options.numa_node = 999;
  absl::StatusOr<std::unique_ptr<ExpertStore>> store = ExpertStore::Load(*file_, options, pool_.get());
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("999"), std::string_view::npos) << store.status();
  EXPECT_FALSE(CheckNumaNode(-5).ok());
  EXPECT_TRUE(CheckNumaNode(kNoNumaNode).ok());
}

TEST_F(ExpertStoreTest, LoadsOnNodeZeroWhenTheMachineHasNuma) {
  if (!CheckNumaNode(0).ok()) GTEST_SKIP() << "no NUMA support here: " << CheckNumaNode(0);
  ExpertStoreOptions options;
  options.numa_node = 0;
  options.share = *ParseExpertShare("0/1");
  std::unique_ptr<ExpertStore> store = *ExpertStore::Load(*file_, options, pool_.get());
  EXPECT_EQ(store->numa_node(), 0);
  EXPECT_EQ(store->shape().expert_end, store->shape().expert_count);
  EXPECT_FALSE(NumaNodeCpus(0)->empty());
}

TEST(ExpertShare, ParsesAndRefuses) {
  const ExpertShare s = *ParseExpertShare("1/4");
  EXPECT_EQ(s.begin(512), 128u);
  EXPECT_EQ(s.end(512), 256u);
  for (const char* bad : {"4/4", "-1/2", "1", "a/b", "1/0", "1/2/3"}) {
    absl::StatusOr<ExpertShare> r = ParseExpertShare(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--share"), std::string_view::npos);
    }
  }
}

}  // namespace
}  // namespace tandem
