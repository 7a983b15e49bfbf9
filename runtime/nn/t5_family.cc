// The T5 family (t5.h): an encoder-decoder, reversal batches.
#include "runtime/nn/builtin_families.h"

namespace sk {
namespace {

ModelTableRow T5TableRow(const NamedModelConfig& c) {
  const T5Config& t = c.t5;
  return {std::to_string(t.n_encoder_layers) + "+" + std::to_string(t.n_decoder_layers),
          std::to_string(t.d_model), std::to_string(t.n_head), std::to_string(t.d_ff),
          std::to_string(t.vocab_size), std::to_string(c.source_len) + "/" + std::to_string(c.seq_len)};
}

}  // namespace

ModelFamilyDescription T5Family() {
  ModelFamilyDescription f;
  f.id = ModelFamily::kT5;
  f.name = "t5";
  f.batches = FamilyBatches::kEncoderDecoder;
  f.create = [](const NamedModelConfig& c, const ModelOptions& o) -> StatusOr<std::unique_ptr<Model>> {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<T5Model> m, T5Model::Create(c.t5, o));
    return std::unique_ptr<Model>(std::move(m));
  };
  f.validate = [](const NamedModelConfig& c) { return c.t5.Validate(); };
  f.batch_id_space = [](const NamedModelConfig& c) { return c.t5.vocab_size; };
  f.check_step_size = [](const NamedModelConfig& c, int64_t batch, int64_t seq, int64_t source) {
    const T5Config& t = c.t5;
    return CheckTransformerStepSize(c, t.n_encoder_layers + t.n_decoder_layers, t.n_head, t.d_model, t.d_ff,
                                    t.vocab_size, batch, seq, source);
  };
  f.set_name = [](NamedModelConfig& c, const std::string& name) { c.name = c.t5.name = name; };
  f.first_unit_backward_without_parameters = true;  // the input embeddings
  f.table_row = T5TableRow;
  return f;
}

}  // namespace sk
