// Same seed, same config => bit-identical parameters; a different seed =>
// different ones. Runs the real trainer on the byte corpus of a small file.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt/safetensors.h"
#include "core/config.h"
#include "train/keys.h"
#include "train/trainer.h"

using namespace apiary;
namespace fs = std::filesystem;

namespace {

struct Fixture {
    fs::path dir;
    core::Schema schema;
    Fixture() {
        dir = fs::temp_directory_path() / ("apiary_det_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        std::ofstream out(dir / "corpus.txt");
        for (int i = 0; i < 3000; ++i) out << "In the beginning was the word " << i << ".\n";
        core::add_shared_keys(schema);
        train::add_keys(schema);
    }
    ~Fixture() { fs::remove_all(dir); }

    std::vector<uint8_t> train_run(const std::string& name, int seed, const std::string& arch) {
        core::Config c(schema);
        c.set("model.preset=" + arch);
        c.set("model.n_layer=2");
        c.set("train.steps=6");
        c.set("train.batch_size=2");
        c.set("train.seq_len=32");
        c.set("train.grad_accum=2");
        c.set("train.warmup_steps=2");
        c.set("train.eval_every=3");
        c.set("train.eval_batches=2");
        c.set("train.seed=" + std::to_string(seed));
        c.set("data.corpus=" + (dir / "corpus.txt").string());
        c.set("run.dir=" + (dir / name).string());
        const auto summary = train::run_training(c, false);
        std::ifstream in(fs::path(summary.checkpoint_dir) / "rank_00000.safetensors",
                         std::ios::binary);
        return {std::istreambuf_iterator<char>(in), {}};
    }
};

}  // namespace

TEST(Determinism, SameSeedGivesBitIdenticalParameters) {
    Fixture f;
    for (const char* arch : {"tiny", "tiny-llama"}) {
        const auto a = f.train_run(std::string("a_") + arch, 5, arch);
        const auto b = f.train_run(std::string("b_") + arch, 5, arch);
        const auto c = f.train_run(std::string("c_") + arch, 6, arch);
        ASSERT_GT(a.size(), 1000u);
        EXPECT_EQ(a, b) << arch;
        EXPECT_NE(a, c) << arch;
    }
}

TEST(Determinism, RunDirectoryRecordsResolvedConfig) {
    Fixture f;
    f.train_run("cfg", 1, "tiny");
    std::ifstream in(f.dir / "cfg" / "config.toml");
    std::stringstream ss;
    ss << in.rdbuf();
    // Every key is written out, defaults included, and loads back.
    core::Config back(f.schema);
    back.load_string(ss.str(), "config.toml");
    EXPECT_EQ(back.get_int("train.steps"), 6);
    EXPECT_EQ(back.get_int("model.n_layer"), 2);
    EXPECT_EQ(back.get_real("train.lr"), core::Config(f.schema).get_real("train.lr"));
    EXPECT_TRUE(fs::exists(f.dir / "cfg" / "metrics.jsonl"));
}
