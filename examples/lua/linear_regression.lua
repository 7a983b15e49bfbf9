-- The low-level API through the Lua frontend: a linear regression computed
-- here on gathered parameters (same arithmetic and output as
-- examples/c/linear_regression.c; Lua numbers are doubles, as the C
-- example computes).
local sk = require("shardkit")

local FEATURES, BATCH, STEPS = 4, 8, 20
local TRUE_W = {0.5, -1.0, 2.0, 0.25}

local function feature(step, i, j) return ((step * 5 + i * 3 + j * 7) % 11) / 5.0 - 1.0 end
local function target(step, i)
  local y = 0.0
  for j = 0, FEATURES - 1 do y = y + TRUE_W[j + 1] * feature(step, i, j) end
  return y + 0.3
end

local spec = sk.model_spec()
local unit = spec:add_unit("linear")
spec:add_param(unit, {name = "w", shape = {FEATURES}, init = "normal", init_a = 0.0, init_b = 0.5})
spec:add_param(unit, {name = "b", shape = {1}, init = "zeros"})

local group = sk.local_groups(1)[1]
local engine = sk.engine(spec, group, {
  fsdp = {seed = 42},
  optimizer = {kind = "sgd", lr = 0.05},
})
spec:close()   -- the engine keeps its own copy
group:close()  -- and keeps the group alive

for step = 0, STEPS - 1 do
  engine:zero_grad()
  local err, loss = {}, 0.0
  engine:pre_forward(unit)
  local w = engine:param(unit, 0)
  local b = engine:param(unit, 1)
  for i = 0, BATCH - 1 do
    local pred = 0.0
    for j = 0, FEATURES - 1 do pred = pred + w[j] * feature(step, i, j) end
    pred = pred + b[0]
    err[i] = pred - target(step, i)
    loss = loss + err[i] * err[i]
  end
  loss = loss / BATCH
  engine:post_forward(unit)
  engine:pre_backward(unit)
  local gw = engine:grad(unit, 0)
  local gb = engine:grad(unit, 1)
  for j = 0, FEATURES - 1 do
    local g = 0.0
    for i = 0, BATCH - 1 do g = g + err[i] * feature(step, i, j) end
    gw[j] = gw[j] + g * (2.0 / BATCH)
  end
  local g = 0.0
  for i = 0, BATCH - 1 do g = g + err[i] end
  gb[0] = gb[0] + g * (2.0 / BATCH)
  engine:post_backward(unit)
  engine:finish_backward()
  engine:optimizer_step()

  local bits = sk.f32_bits_hex(loss)
  print(string.format("step %d loss %.6f bits %s", step + 1, sk.to_f32(loss), bits))
end
local w = engine:read_param(unit, 0, FEATURES)
print(string.format("w %.4f %.4f %.4f %.4f", w[1], w[2], w[3], w[4]))
engine:close()
