// `pdserve make-model`: writes a synthetic model (real shape, seeded random weights) in the
// Hugging Face layout, e.g. `pdserve make-model --preset qwen2.5-0.5b --out models/q05`.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "common/dtype.h"
#include "model/synthetic.h"

namespace pdserve::cli {
namespace {

struct MakeModelFlags {
  std::string preset;
  std::string out;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  bool list = false;
  SyntheticVariant variant;
};

// "4.51 GB", "3.4 MB": decimal units, as docs/benchmarks.md gives model sizes.
std::string SizeText(uint64_t bytes) {
  char text[32];
  if (bytes >= 1000000000) {
    std::snprintf(text, sizeof(text), "%.2f GB", static_cast<double>(bytes) / 1e9);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MB", static_cast<double>(bytes) / 1e6);
  }
  return text;
}

int PrintPresets() {
  std::printf("%-22s %10s %10s %10s  %s\n", "preset", "bf16", "fp8", "int8", "description");
  for (const SyntheticPreset& p : SyntheticPresets()) {
    std::printf("%-22s %10s %10s %10s  %s\n", p.name.c_str(),
                SizeText(SyntheticWeightBytes(p.config, DType::kBF16)).c_str(),
                SizeText(SyntheticWeightBytes(p.config, DType::kF8E4M3)).c_str(),
                SizeText(SyntheticWeightBytes(p.config, DType::kI8)).c_str(),
                p.description.c_str());
  }
  return 0;
}

int RunMakeModel(const MakeModelFlags& f) {
  if (f.list) return PrintPresets();
  if (f.preset.empty() || f.out.empty()) {
    std::fprintf(stderr,
                 "error: make-model needs --preset NAME and --out DIR (--list shows the "
                 "presets)\n");
    return 2;
  }
  const std::optional<DType> dtype = ParseDTypeFlag(f.dtype);
  if (!dtype.has_value()) {
    std::fprintf(stderr, "error: --dtype %s is not a dtype (bf16, f16, f32, fp8, int8)\n",
                 f.dtype.c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  Status s = WriteSyntheticModel(f.preset, f.out, f.seed, *dtype, f.variant);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "wrote preset %s%s%s (seed %llu, %s) to %s in %.1f s\n", f.preset.c_str(),
               f.variant.empty() ? "" : " variant ", f.variant.Name().c_str(),
               static_cast<unsigned long long>(f.seed), f.dtype.c_str(), f.out.c_str(), seconds);
  return 0;
}

}  // namespace

void AddMakeModelCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<MakeModelFlags>();
  CLI::App* cmd = app.add_subcommand(
      "make-model", "Write a synthetic model: a real shape with seeded random weights");
  cmd->add_option("--preset", flags->preset, "Preset name (see --list)")
      ->check(CLI::IsMember(SyntheticPresetNames()));
  cmd->add_option("--out", flags->out, "Output directory (created if needed)");
  cmd->add_option("--seed", flags->seed, "Random seed of the weights and tokenizer merges")
      ->capture_default_str();
  cmd->add_option("--dtype", flags->dtype,
                  "Stored dtype of the weights (fp8: the linear layers' weights F8_E4M3 with "
                  "128x128 block scales, the rest bf16, as DeepSeek ships FP8 checkpoints; "
                  "int8: those weights I8 with an F32 weight_scale per row and 128 columns)")
      ->check(CLI::IsMember({"bf16", "f16", "f32", "fp8", "int8"}))
      ->capture_default_str();
  cmd->add_option("--num-layers", flags->variant.num_layers,
                  "Write only the preset's first N decoder layers, every other tensor as the "
                  "whole preset's (a draft model of it; no MTP modules)");
  cmd->add_option("--quiet-from-layer", flags->variant.quiet_from_layer,
                  "Scale the output projections (o_proj, down_proj) of this layer and the later "
                  "ones by --quiet-scale (a target that its --num-layers draft predicts well)");
  cmd->add_option("--quiet-scale", flags->variant.quiet_scale,
                  "Scale of the quiet layers' output projections, in [0, 1]")
      ->capture_default_str();
  cmd->add_option("--head-scale", flags->variant.head_scale,
                  "Scale of an untied lm_head's weights (> 1: sharper next-token "
                  "distributions)")
      ->capture_default_str();
  cmd->add_flag("--mtp-mimic", flags->variant.mtp_mimic,
                "With --quiet-from-layer, on a preset with an MTP module: make the module draft "
                "what the quiet model says next (eh_proj = [I | R/4], its layer quieted too), a "
                "pair for --speculative mtp with high acceptance");
  cmd->add_flag("--list", flags->list, "List the presets and exit");
  cmd->callback([flags, exit_code] { *exit_code = RunMakeModel(*flags); });
}

}  // namespace pdserve::cli
