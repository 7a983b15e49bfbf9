// The unit-table family (unit_table.h): a network described as a table of
// units, one image per batch entry.
#include <algorithm>

#include "runtime/nn/builtin_families.h"
#include "runtime/nn/unit_table_json.h"

namespace sk {
namespace {

Status CheckUnitTableStepSize(const NamedModelConfig& c, int64_t batch_size, int64_t seq_len,
                              int64_t source_len) {
  if (seq_len > 1 || source_len > 0) {
    return InvalidArgumentError("model '" + c.name + "' takes one image per batch entry: seq_len must be 1 "
                                "(or 0 for the default) and source_len 0");
  }
  // Bytes per image, generously: every unit's output, kept and temporary
  // copies of it, and its largest im2col patch matrix (taps x input).
  int64_t per_image = 0, bytes = 0;
  bool overflow = false;
  int64_t h = c.table.image_size, w = c.table.image_size, ch = c.table.image_channels;
  for (const TableUnit& u : c.table.units) {
    int64_t most = ch;
    for (const ConvLayerSpec& l : u.convs) {
      const int64_t oh = (h + 2 * l.pad() - l.kernel) / l.stride + 1, ow = (w + 2 * l.pad() - l.kernel) / l.stride + 1;
      most = std::max({most, l.kernel * l.kernel * l.in_channels, l.out_channels});
      h = oh, w = ow, ch = l.out_channels;
    }
    most = std::max({most, u.width, u.d_ff, u.heads * u.in_h * u.in_w});
    int64_t unit = 0;
    overflow |= __builtin_mul_overflow(h * w + u.in_h * u.in_w + 1, most, &unit);
    overflow |= __builtin_add_overflow(per_image, 16 * unit, &per_image);
  }
  overflow |= __builtin_mul_overflow(per_image, batch_size, &bytes);
  if (overflow || bytes > (int64_t{1} << 62)) {
    return InvalidArgumentError("batch_size " + std::to_string(batch_size) + " of model '" + c.name +
                                "' is too large: its activation memory does not fit in 64-bit byte counts");
  }
  return OkStatus();
}

ModelTableRow UnitTableRow(const NamedModelConfig& c) {
  // Per image: the table has no token sequence; "layers" counts units.
  return {std::to_string(c.table.units.size()) + " units", "-", "-", "-",
          std::to_string(c.table.num_classes) + " classes", "image " + std::to_string(c.table.image_size)};
}

}  // namespace

ModelFamilyDescription UnitTableFamily() {
  ModelFamilyDescription f;
  f.id = ModelFamily::kUnitTable;
  f.name = "unit table";
  f.batches = FamilyBatches::kImages;
  f.create = [](const NamedModelConfig& c, const ModelOptions& o) -> StatusOr<std::unique_ptr<Model>> {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<UnitTableModel> m, UnitTableModel::Create(c.table, o));
    return std::unique_ptr<Model>(std::move(m));
  };
  f.validate = [](const NamedModelConfig& c) { return c.table.Validate(); };
  f.batch_id_space = [](const NamedModelConfig& c) { return c.table.num_classes; };
  f.check_step_size = CheckUnitTableStepSize;
  f.set_name = [](NamedModelConfig& c, const std::string& name) { c.name = c.table.name = name; };
  f.table_row = UnitTableRow;
  f.model_file = [](const NamedModelConfig& c) -> StatusOr<std::string> { return UnitTableToJson(c.table); };
  return f;
}

}  // namespace sk
