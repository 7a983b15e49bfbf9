-- Trains gpt-tiny with FULL_SHARD on 2 local ranks through the Lua frontend
-- (same settings and output as examples/c/train_gpt.c).
local sk = require("shardkit")

local session = sk.local_session({
  model = "gpt-tiny",
  fsdp = {strategy = "FULL_SHARD", seed = 1234},
  optimizer = {kind = "adamw", lr = 0.01},
  batch_size = 2,
  data_seed = 7,
  data_tokens = 64,
}, 2)
for step = 1, 8 do
  local m = session:step()
  print(string.format("step %d loss %.6f bits %s", step, m.loss, sk.f32_bits_hex(m.loss)))
end
session:close()
