#include "model/model_dir.h"

namespace pdserve {

Result<ModelDir> LoadModelDir(const std::string& path, const ModelDirOptions& options) {
  ModelDir dir;
  dir.path = path;
  PD_ASSIGN_OR_RETURN(dir.config, ModelConfig::Load(path));
  if (options.load_tokenizer) {
    PD_ASSIGN_OR_RETURN(dir.tokenizer, Tokenizer::Load(path));
  }
  PD_ASSIGN_OR_RETURN(ModelWeights weights,
                      LoadWeights(dir.config, path, options.weight_dtype, options.weight_format,
                                  options.head_format));
  PD_ASSIGN_OR_RETURN(dir.transformer,
                      Transformer::Create(dir.config, std::move(weights), options.transformer));
  return dir;
}

}  // namespace pdserve
