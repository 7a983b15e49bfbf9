-- shardkit.lua: the LuaJIT FFI frontend over the C ABI (libshardkit.so).
--
--   local sk = require("shardkit")
--   local session = sk.local_session({model = "gpt-tiny", fsdp = {strategy = "FULL_SHARD"}}, 2)
--   print(session:step().loss)
--
-- * The ffi.cdef is generated from shardkit.h at build time
--   (shardkit_cdef.lua, by gen_cdef.sh): never hand-copied.
-- * Handles are boxed in small cdata structs whose metatype has an
--   idempotent __gc (the same as :close()), as ljsyscall does for fds.
-- * Every failing call raises error() with a table {code, name, message}
--   whose tostring is "NAME: message" (the library's message).
-- * Options are plain tables whose keys are the C struct's field names;
--   enum fields take the C value or a name ("FULL_SHARD", "sgd", "normal"),
--   flags take booleans, nested option structs are nested tables.
-- * The device (sk_device_options) is `device = {kind = "cuda", index = 0}`,
--   `device = {kind = "sim", profile = "a100-80g", world_size = 512,
--   gpus_per_node = 8}`, or a string "cpu", "cuda", "cuda:0", "sim"
--   (sk_device_options' own field names work too). The library validates it
--   when a trainer, session or engine is created. On the simulator, create
--   trainers and engines without a group: sk.trainer(options).
-- * Option structs, their strings and nested structs are kept reachable
--   from a module table until the C call returns (a local holding them may
--   be dead for the JIT before the call, and C pointers do not keep cdata).
-- * Unit and parameter indices are the C API's (0-based), as returned by
--   add_unit/add_param.
-- * The library is loaded from $SK_LIB if set (before 0.8.0: $SHARDKIT_LIB,
--   still read when SK_LIB is unset); else from the path
--   that `bazel run //:install` records beside the installed module
--   (shardkit_install.lua); else by the name "shardkit" (libshardkit.so on
--   the loader's search path).
local ffi = require("ffi")

ffi.cdef(require("shardkit_cdef"))

local function library_path()
  local env = os.getenv("SK_LIB")
  if not env or env == "" then env = os.getenv("SHARDKIT_LIB") end
  if env and env ~= "" then return env end
  local installed, where = pcall(require, "shardkit_install")
  if installed then return where.library end
  return "shardkit"
end

local lib = ffi.load(library_path())

local M = {lib = lib}

-- Errors -------------------------------------------------------------------

local Error = {}
Error.__index = Error
Error.__tostring = function(e) return e.name .. ": " .. e.message end
M.Error = Error

local function check(code)
  if code ~= 0 then
    local name = ffi.string(lib.sk_status_name(code))
    error(setmetatable({code = tonumber(code), name = name,
                        message = ffi.string(lib.sk_last_error_message())}, Error), 2)
  end
end

function M.version() return ffi.string(lib.sk_version()) end
function M.version_number() return tonumber(lib.sk_version_number()) end

-- Options: plain tables to C structs ---------------------------------------

-- Enum fields and how a name given for them becomes a C value.
local function invalid_argument(message, level)
  error(setmetatable({code = 3, name = "INVALID_ARGUMENT", message = message}, Error), level)
end
-- 64-bit integers (0.8.0). A Lua number holds integers exactly only up to
-- 2^53, so the C ABI's int64_t results come back as a Lua number when they
-- fit in that range and as LuaJIT's boxed int64_t cdata (exact; arithmetic
-- and comparisons with numbers work, tostring ends in "LL") beyond it: step
-- metrics, counters, byte and token counts, step counts, sizes. i64
-- collectives always return boxed int64_t values (see all_reduce).
local TWO_53 = 2 ^ 53
local function int64_result(v)
  if type(v) == "cdata" and (v > TWO_53 or v < -TWO_53) then return ffi.new("int64_t", v) end
  return tonumber(v)
end
M.int64_result = int64_result

local INT64_MAX_U = 9223372036854775807ULL
local UINT64_MAX = 18446744073709551615ULL
-- `x` (a 64-bit integer cdata, a number or a decimal string) as a boxed
-- int64_t (`unsigned`: uint64_t), exactly: a cdata within range, an
-- integral number within range ([-2^63, 2^63); [0, 2^64)), or a decimal
-- string ("-9223372036854775808"; the way to write one beyond 2^53 without
-- LL literals). Anything else raises INVALID_ARGUMENT naming `what`.
local function to_integer(x, what, level, unsigned)
  level = (level or 2) + 1
  local ctype = unsigned and "uint64_t" or "int64_t"
  local range = unsigned and "[0, 2^64)" or "[-2^63, 2^63)"
  local function refuse(shown) invalid_argument(what .. " " .. shown .. " is outside " .. range, level + 1) end
  if type(x) == "cdata" and (ffi.istype("int64_t", x) or ffi.istype("uint64_t", x)) then
    if unsigned and ffi.istype("int64_t", x) and x < 0 then refuse(tostring(x)) end
    if not unsigned and ffi.istype("uint64_t", x) and x > INT64_MAX_U then refuse(tostring(x)) end
    return ffi.new(ctype, x)
  elseif type(x) == "number" then
    if x ~= x or x % 1 ~= 0 then
      invalid_argument(what .. " " .. tostring(x) .. " is not an integer", level)
    end
    if unsigned and (x < 0 or x >= 2 ^ 64) or not unsigned and (x < -2 ^ 63 or x >= 2 ^ 63) then
      refuse(tostring(x))
    end
    if unsigned and x >= 2 ^ 63 then return ffi.new(ctype, x - 2 ^ 63) + 9223372036854775808ULL end
    return ffi.new(ctype, x)
  elseif type(x) == "string" then
    local sign, digits = x:match("^%s*([+-]?)(%d+)%s*$")
    if digits == nil then
      invalid_argument(what .. " '" .. x .. "' is not a decimal integer", level)
    end
    local limit = unsigned and UINT64_MAX or (sign == "-" and INT64_MAX_U + 1 or INT64_MAX_U)
    local v = 0ULL
    for k = 1, #digits do
      local d = digits:byte(k) - 48
      if v > (limit - d) / 10 then refuse("'" .. x .. "'") end
      v = v * 10 + d
    end
    if sign == "-" and v ~= 0 then
      if unsigned then refuse("'" .. x .. "'") end
      v = -v  -- two's complement: -2^63 too
    end
    return ffi.new(ctype, v)
  end
  invalid_argument(what .. " must be an integer (a number, a 64-bit integer cdata or a decimal string), not a " ..
                   type(x), level)
end
local function to_int64(x, what, level) return to_integer(x, what, (level or 2) + 1, false) end
-- sk.i64(x): x as an exact boxed int64_t (see to_integer), e.g.
-- sk.i64("9007199254740993"), sk.i64(2^62), sk.i64("-9223372036854775808").
function M.i64(x) return to_int64(x, "sk.i64", 2) end

local function failed_precondition(message, level)
  error(setmetatable({code = 9, name = "FAILED_PRECONDITION", message = message}, Error), level)
end
local function enum_by_prefix(prefix, ctype)
  return function(v, field)
    local out = ffi.new(ctype .. "[1]")
    if not pcall(function() out[0] = prefix .. string.upper(v) end) then
      invalid_argument(string.format("unknown %s '%s' (the %s* constants of shardkit.h)",
                                     field, v, prefix), 4)
    end
    return out[0]
  end
end
local function enum_by_parser(parser, ctype)
  return function(v)
    local out = ffi.new(ctype .. "[1]")
    check(parser(v, out))
    return out[0]
  end
end
local enum_fields = {
  strategy = enum_by_parser(lib.sk_parse_sharding_strategy, "sk_sharding_strategy_t"),
  backward_prefetch = enum_by_parser(lib.sk_parse_backward_prefetch, "sk_backward_prefetch_t"),
  param_dtype = enum_by_parser(lib.sk_parse_dtype, "sk_dtype_t"),
  reduce_dtype = enum_by_parser(lib.sk_parse_dtype, "sk_dtype_t"),
  buffer_dtype = enum_by_parser(lib.sk_parse_dtype, "sk_dtype_t"),
  dtype = enum_by_parser(lib.sk_parse_dtype, "sk_dtype_t"),
  kind = enum_by_prefix("SK_OPTIMIZER_", "sk_optimizer_kind_t"),
  init = enum_by_prefix("SK_INIT_", "sk_init_kind_t"),
  parallelism = enum_by_prefix("SK_PARALLELISM_", "sk_parallelism_t"),
  -- 0.8.0: sk_param_group.no_decay, "biases_and_norms" (Hugging Face
  -- Trainer's) or "norms_biases_embeddings" (or the number).
  no_decay = enum_by_prefix("SK_NO_DECAY_", "sk_no_decay_t"),
  -- 0.8.0: sk_fsdp_options.grad_accumulation, "sharded" or "unsharded"
  -- (no_sync), or the number.
  grad_accumulation = enum_by_prefix("SK_GRAD_ACCUMULATION_", "sk_grad_accumulation_t"),
}
-- Enum fields whose name means another enum in one struct.
local device_kind = enum_by_prefix("SK_DEVICE_", "sk_device_kind_t")
local lr_schedule_kind = enum_by_prefix("SK_LR_SCHEDULE_", "sk_lr_schedule_kind_t")
local checkpointing = enum_by_prefix("SK_CHECKPOINTING_", "sk_activation_checkpointing_t")
local dataset_format = enum_by_prefix("SK_DATASET_FORMAT_", "sk_dataset_format_t")
local token_file_layout = enum_by_prefix("SK_TOKEN_FILE_LAYOUT_", "sk_token_file_layout_t")
local struct_enum_fields = {
  -- 0.8.0: format "tokens" or "jsonl"; token_file_layout "auto", "raw", "llmc".
  sk_dataset_options = {
    format = function(v) return dataset_format(v, "dataset format") end,
    token_file_layout = function(v) return token_file_layout(v, "token_file_layout") end,
  },
  sk_device_options = {kind = function(v) return device_kind(v, "device kind") end},
  sk_lr_schedule = {kind = function(v) return lr_schedule_kind(v, "lr_schedule kind") end},
  -- 0.6.1: "off", "full", "selective", "selective_attention" (or the number);
  -- 0.8.0: "selective_matmuls".
  sk_trainer_options = {activation_checkpointing = function(v)
    return checkpointing(v, "activation_checkpointing")
  end},
}
-- Fields whose INIT macro value is not 0 (0.6.0: lr and lr_multiplier are
-- taken as given, 0 included).
local struct_defaults = {
  sk_optimizer_options = {lr = 1e-3},
  sk_param_group = {lr_multiplier = 1},
}

-- A device as the table of sk_device_options fields: "cuda:0" and "sim" are
-- {kind = ...[, index = ...]}; index sets use_index; profile, world_size and
-- gpus_per_node are the sim_* fields.
local device_aliases = {profile = "sim_profile", world_size = "sim_world_size",
                        gpus_per_node = "sim_gpus_per_node"}
local function device_fields(d)
  if type(d) == "string" then
    local kind, index = d:match("^([%a_]+):(%d+)$")
    d = kind and {kind = kind, index = tonumber(index)} or {kind = d}
  end
  if type(d) ~= "table" then
    invalid_argument("device must be a table or a string such as 'cuda:0', not a " .. type(d), 5)
  end
  local t = {}
  for k, v in pairs(d) do
    if k == "index" then
      t.use_index, t.index = 1, v
    else
      t[device_aliases[k] or k] = v
    end
  end
  return t
end

-- Fields that point to nested option structs, and how a field's Lua value
-- becomes that struct's table.
local nested_fields = {fsdp = "sk_fsdp_options", optimizer = "sk_optimizer_options",
                       device = "sk_device_options", lr_schedule = "sk_lr_schedule",
                       dataset = "sk_dataset_options"}
-- Fields that are arrays of strings, and the count field each sets
-- (sk_dataset_options: paths = {"a.bin", "b.bin"}).
local string_array_counts = {paths = "num_paths", eval_paths = "num_eval_paths",
                             custom_state_names = "num_custom_states"}
local nested_tables = {device = device_fields}
-- Structs whose field of such a name is a plain number (sk_nccl_options.device).
local plain_fields = {sk_nccl_options = {device = true}}

-- A new `ctype` struct from table `t` (nil: NULL). Strings and nested
-- structs are kept alive in `anchors` for as long as the caller holds it.
local function to_struct(ctype, t, anchors)
  if t == nil then return nil end
  local s = ffi.new(ctype)
  s.struct_size = ffi.sizeof(ctype)
  anchors[#anchors + 1] = s
  local enums = struct_enum_fields[ctype] or enum_fields
  local plain = plain_fields[ctype] or {}
  for k, v in pairs(struct_defaults[ctype] or {}) do s[k] = v end
  for k, v in pairs(t) do
    if string_array_counts[k] and type(v) == "table" then
      local arr = ffi.new("const char*[?]", math.max(#v, 1))
      anchors[#anchors + 1] = arr
      for i, p in ipairs(v) do
        anchors[#anchors + 1] = p
        arr[i - 1] = p
      end
      s[string_array_counts[k]] = #v
      v = arr
    elseif k == "eos_id" then
      -- Setting an EOS id sets has_eos_id (0 is a token id like any other).
      s.has_eos_id = 1
    elseif k == "param_groups" then
      -- An array of sk_param_group tables; sets num_param_groups too.
      local groups = ffi.new("sk_param_group[?]", math.max(#v, 1))
      anchors[#anchors + 1] = groups
      for i, g in ipairs(v) do groups[i - 1] = to_struct("sk_param_group", g, anchors) end
      s.num_param_groups = #v
      v = groups
    elseif nested_fields[k] and not plain[k] then
      if nested_tables[k] then v = nested_tables[k](v) end
      v = to_struct(nested_fields[k], v, anchors)
    elseif type(v) == "string" and (enums[k] or enum_fields[k]) then
      v = (enums[k] or enum_fields[k])(v, k)
    elseif type(v) == "string" then
      anchors[#anchors + 1] = v
    elseif type(v) == "boolean" then
      v = v and 1 or 0
    end
    -- 64-bit integer fields take numbers, boxed integers and decimal
    -- strings, exactly (a number beyond 2^53 has already lost bits: pass
    -- 9007199254740993LL or "9007199254740993").
    local ok, cur = pcall(function() return s[k] end)
    if ok and type(cur) == "cdata" and (type(v) == "number" or type(v) == "string" or type(v) == "cdata") then
      if ffi.istype("int64_t", cur) then
        v = to_integer(v, ctype .. "." .. k, 3, false)
      elseif ffi.istype("uint64_t", cur) then
        v = to_integer(v, ctype .. "." .. k, 3, true)
      end
    end
    s[k] = v  -- an unknown field name raises ffi's "no member named" error
  end
  return s
end

-- `anchors` stays reachable from here between pin and unpin: around each C
-- call that reads option structs (unpin before check() raises).
local pinned = {}
local function pin(anchors) pinned[anchors] = true end
local function unpin(anchors) pinned[anchors] = nil end

local metric_fields = {
  "step", "rank", "loss", "grad_norm", "step_seconds", "tokens_per_second",
  "model_tflops_per_rank", "hardware_tflops_per_rank", "peak_allocated_bytes",
  "peak_reserved_bytes", "allocated_bytes", "reserved_bytes", "alloc_retries", "ooms",
  "bytes_communicated", "global_loss", "lr", "target_tokens", "global_target_tokens",
}
-- The metrics as numbers (the int64_t ones beyond 2^53 as boxed int64_t,
-- exact: int64_result); `simulated` a boolean (on the simulator loss,
-- global_loss and grad_norm are NaN and times are virtual).
local function metrics_table(m)
  local t = {}
  for _, k in ipairs(metric_fields) do t[k] = int64_result(m[k]) end
  t.simulated = m.simulated ~= 0
  t.skipped = m.skipped ~= 0  -- 0.8.0: skip_nonfinite_steps skipped the update
  return t
end
-- sk.step_metrics(m): an sk_step_metrics cdata as the table step() returns.
M.step_metrics = metrics_table
-- The C element type and sk_dtype_t of a collective's Lua values.
local collective_ctypes = {f32 = {"float", 1}, f64 = {"double", 4}, i32 = {"int32_t", 5}, i64 = {"int64_t", 6}}
local function collective_dtype(name)
  local t = collective_ctypes[name or "f32"]
  if t == nil then
    invalid_argument("unknown collective dtype '" .. tostring(name) .. "' (f32, f64, i32, i64)", 4)
  end
  return t[1], t[2]
end
-- A collective's Lua values into its C buffer: i64 values exactly
-- (to_int64: numbers, int64 cdata, decimal strings), the others as numbers.
local function fill_buffer(buf, values, n, ct, level)
  if ct == "int64_t" then
    for i = 1, n do buf[i - 1] = to_int64(values[i], "i64 value " .. i, level + 1) end
  else
    for i = 1, n do buf[i - 1] = values[i] end
  end
end
-- A collective's C buffer as Lua values: i64 as boxed int64_t (exact), the
-- others as numbers.
local function read_buffer(buf, n, ct)
  local out = {}
  if ct == "int64_t" then
    for i = 1, n do out[i] = ffi.new("int64_t", buf[i - 1]) end
  else
    for i = 1, n do out[i] = tonumber(buf[i - 1]) end
  end
  return out
end
local function new_metrics()
  local m = ffi.new("sk_step_metrics")
  m.struct_size = ffi.sizeof(m)
  return m
end

-- Handles --------------------------------------------------------------------

-- Declares a boxed handle type: `struct { T* h; <extra> }` with methods,
-- whose __gc and :close() destroy the handle once (idempotent) and leave h
-- NULL.
local function handle_type(name, destroy, methods, extra)
  local box = "struct sk_lua_" .. name .. " { " .. name .. "* h; " .. (extra or "") .. " }"
  ffi.cdef(box .. ";")
  local function close(self)
    if self.h ~= nil then
      destroy(self.h)
      self.h = nil
    end
  end
  methods.close = close
  return ffi.metatype("struct sk_lua_" .. name, {__index = methods, __gc = close})
end

-- Process groups.
local ProcessGroup = handle_type("sk_process_group", lib.sk_process_group_destroy, {
  rank = function(self)
    local out = ffi.new("int32_t[1]")
    check(lib.sk_process_group_rank(self.h, out))
    return out[0]
  end,
  size = function(self)
    local out = ffi.new("int32_t[1]")
    check(lib.sk_process_group_size(self.h, out))
    return out[0]
  end,
  label = function(self)
    local out = ffi.new("const char*[1]")
    check(lib.sk_process_group_label(self.h, out))
    return ffi.string(out[0])
  end,
  -- Collectives on Lua arrays of numbers (0.6.0; shardkit.h, "Collectives
  -- on the caller's buffers"), moved as f32 unless `dtype` names another:
  -- "f64", "i32" or "i64" (0.8.0). i64 values are carried exactly: each
  -- given value may be a number (an integer below 2^63 in magnitude), a
  -- boxed int64_t (9007199254740993LL, sk.i64(...)) or a decimal string,
  -- and the results are boxed int64_t values (a Lua number would round
  -- those beyond 2^53); anything else is INVALID_ARGUMENT before any call.
  -- Each returns a new array. op: "sum" (nil), "mean", "max" or "min"
  -- (0.8.0).
  all_reduce = function(self, values, op, dtype)
    local n = #values
    local ct, dt = collective_dtype(dtype)
    local buf = ffi.new(ct .. "[?]", math.max(n, 1))
    fill_buffer(buf, values, n, ct, 2)
    local raw_op = ffi.new("sk_reduce_op_t[1]")
    if not pcall(function() raw_op[0] = "SK_REDUCE_" .. string.upper(op or "sum") end) then
      invalid_argument("unknown reduce op '" .. tostring(op) .. "' (sum, mean, max, min)", 2)
    end
    check(lib.sk_process_group_all_reduce(self.h, buf, n, dt, raw_op[0]))
    return read_buffer(buf, n, ct)
  end,
  broadcast = function(self, values, root, dtype)
    local n = #values
    local ct, dt = collective_dtype(dtype)
    local buf = ffi.new(ct .. "[?]", math.max(n, 1))
    fill_buffer(buf, values, n, ct, 2)
    check(lib.sk_process_group_broadcast(self.h, buf, n, dt, root))
    return read_buffer(buf, n, ct)
  end,
  all_gather = function(self, values, dtype)
    local n, size = #values, self:size()
    local ct, dt = collective_dtype(dtype)
    local input = ffi.new(ct .. "[?]", math.max(n, 1))
    fill_buffer(input, values, n, ct, 2)
    local output = ffi.new(ct .. "[?]", math.max(n * size, 1))
    check(lib.sk_process_group_all_gather(self.h, input, output, n, dt))
    return read_buffer(output, n * size, ct)
  end,
  barrier = function(self) check(lib.sk_process_group_barrier(self.h)) end,
})

-- The world_size rank handles of a new local group (a Lua array, rank r at
-- index r + 1). Ranks must be driven concurrently: from Lua, use
-- local_session instead, which drives them on library threads.
function M.local_groups(world_size, network_model)
  local raw = ffi.new("sk_process_group*[?]", math.max(world_size, 1))
  check(lib.sk_process_group_create_local(world_size, network_model, raw))
  local out = {}
  for r = 0, world_size - 1 do out[r + 1] = ProcessGroup(raw[r]) end
  return out
end

-- This process's rank of a gloo group; options as sk_gloo_options (nil: all
-- from torchrun's environment).
function M.gloo_group(options)
  local anchors = {}
  local o = to_struct("sk_gloo_options", options, anchors)
  local out = ffi.new("sk_process_group*[1]")
  pin(anchors)
  local code = lib.sk_process_group_create_gloo(o, out)
  unpin(anchors)
  check(code)
  return ProcessGroup(out[0])
end

-- This process's rank of an nccl group on its GPU; options as
-- sk_nccl_options (nil: all from torchrun's environment, cuda:LOCAL_RANK).
-- Raises an UNAVAILABLE error in a library built without CUDA.
-- `device` may be a GPU index or "cuda:N" (it sets use_device).
function M.nccl_group(options)
  local anchors = {}
  if options ~= nil and options.device ~= nil then
    local copy = {}
    for k, v in pairs(options) do copy[k] = v end
    local d = copy.device
    if type(d) == "string" then d = tonumber(d:match("^cuda:(%d+)$")) or invalid_argument(
      "device must be a GPU index or 'cuda:N', not '" .. copy.device .. "'", 2) end
    copy.device, copy.use_device = d, 1
    options = copy
  end
  local o = to_struct("sk_nccl_options", options, anchors)
  local out = ffi.new("sk_process_group*[1]")
  pin(anchors)
  local code = lib.sk_process_group_create_nccl(o, out)
  unpin(anchors)
  check(code)
  return ProcessGroup(out[0])
end

function M.model_num_parameters(model)
  local out = ffi.new("int64_t[1]")
  check(lib.sk_model_num_parameters(model, out))
  return int64_result(out[0])
end

local estimate_fields = {
  "parameters", "master_bytes", "grad_shard_bytes", "optimizer_bytes", "persistent_bytes",
  "unsharded_bytes", "activation_bytes", "peak_bytes",
}
-- The memory estimator's peak for one rank of a trainer with `options` (a
-- table, as for trainer()) on `world_size` ranks, as a table of numbers.
function M.estimate_memory(options, world_size)
  local anchors = {}
  local o = to_struct("sk_trainer_options", options or {}, anchors)
  local e = ffi.new("sk_memory_estimate")
  e.struct_size = ffi.sizeof(e)
  pin(anchors)
  local code = lib.sk_estimate_memory(o, world_size, e)
  unpin(anchors)
  check(code)
  local t = {}
  for _, k in ipairs(estimate_fields) do t[k] = int64_result(e[k]) end
  return t
end

-- A layout name ("shardkit", "torch", "hf-gpt2", "hf-llama"; nil = shardkit) as its
-- sk_weight_layout_t.
local function weight_layout(name)
  if name == nil then return lib.SK_WEIGHT_LAYOUT_DEFAULT end
  local out = ffi.new("sk_weight_layout_t[1]")
  check(lib.sk_parse_weight_layout(name, out))
  return out[0]
end

-- Checkpoint methods shared by trainers and local sessions (`prefix` names
-- their C functions): save_checkpoint(dir), load_checkpoint(dir) returning the
-- restored step count, save_state_dict(path[, layout]) and
-- load_state_dict(path[, layout]) returning the step count afterwards.
local function checkpoint_methods(prefix, methods)
  methods.save_checkpoint = function(self, dir) check(lib[prefix .. "_save_checkpoint"](self.h, dir)) end
  methods.load_checkpoint = function(self, dir)
    local out = ffi.new("int64_t[1]")
    check(lib[prefix .. "_load_checkpoint"](self.h, dir, out))
    return int64_result(out[0])
  end
  methods.save_state_dict = function(self, path, layout)
    check(lib[prefix .. "_save_state_dict"](self.h, path, weight_layout(layout)))
  end
  methods.load_state_dict = function(self, path, layout)
    local out = ffi.new("int64_t[1]")
    check(lib[prefix .. "_load_state_dict"](self.h, path, weight_layout(layout), out))
    return int64_result(out[0])
  end
  return methods
end

-- Caller batches (sk_batch, docs/batches.md): a list of tables {batch_size,
-- seq_len, input_ids, targets (sk.IGNORE_INDEX = -100 leaves a position out),
-- loss_mask, position_ids, segment_ids (the last three optional)}, each
-- array a Lua list of batch_size * seq_len numbers. Returns the pointer
-- array, its length and what keeps the C arrays alive through the call.
local function batch_pointers(list)
  local keep = {}
  local ptrs = ffi.new("const sk_batch*[?]", math.max(#list, 1))
  for i, t in ipairs(list) do
    local n = (t.batch_size or 0) * (t.seq_len or 0)
    local function array(ctype, field)
      local values = t[field]
      if values == nil then return nil end
      if #values ~= n then
        error(string.format("batch %d: %s has %d values, expected batch_size x seq_len = %d",
                            i, field, #values, n), 3)
      end
      local a = ffi.new(ctype .. "[?]", math.max(n, 1))
      for k = 1, n do a[k - 1] = values[k] end
      keep[#keep + 1] = a
      return a
    end
    local b = ffi.new("sk_batch")
    b.struct_size = ffi.sizeof("sk_batch")
    b.batch_size = t.batch_size or 0
    b.seq_len = t.seq_len or 0
    b.input_ids = array("int32_t", "input_ids")
    b.targets = array("int32_t", "targets")
    b.loss_mask = array("uint8_t", "loss_mask")
    b.position_ids = array("int32_t", "position_ids")
    b.segment_ids = array("int32_t", "segment_ids")
    keep[#keep + 1] = b
    ptrs[i - 1] = b
  end
  return ptrs, #list, keep
end
M.IGNORE_INDEX = -100

-- Trainer.
local Trainer = handle_type("sk_trainer", lib.sk_trainer_destroy,
                            checkpoint_methods("sk_trainer", {
  -- save_checkpoint_rotating(root, keep): a checkpoint in root/step_<step>,
  -- the newest `keep` kept; resume_latest(root): the newest complete one
  -- restored, returning the step count (unchanged, 0 at first, when none).
  save_checkpoint_rotating = function(self, root, keep)
    check(lib.sk_trainer_save_checkpoint_rotating(self.h, root, keep))
  end,
  resume_latest = function(self, root)
    local out = ffi.new("int64_t[1]")
    check(lib.sk_trainer_resume_latest(self.h, root, out))
    return int64_result(out[0])
  end,
  step = function(self)
    local m = new_metrics()
    check(lib.sk_trainer_step(self.h, m))
    return metrics_table(m)
  end,
  -- One step on the caller's micro-batches (grad_accum_steps of them).
  step_batches = function(self, batches)
    local ptrs, n, keep = batch_pointers(batches)
    local m = new_metrics()
    check(lib.sk_trainer_step_batches(self.h, ptrs, n, m))
    keep = nil
    return metrics_table(m)
  end,
  evaluate = function(self, batches)
    local out = ffi.new("float[1]")
    check(lib.sk_trainer_evaluate(self.h, batches, out))
    return out[0]
  end,
  -- The rate of every later step, replacing the schedule (0 is valid).
  set_lr = function(self, lr) check(lib.sk_trainer_set_lr(self.h, lr)) end,
  lr = function(self)
    local out = ffi.new("float[1]")
    check(lib.sk_trainer_get_lr(self.h, out))
    return out[0]
  end,
  num_parameters = function(self)
    local out = ffi.new("int64_t[1]")
    check(lib.sk_trainer_num_parameters(self.h, out))
    return int64_result(out[0])
  end,
  -- With a dataset (0.8.0): samples consumed and samples per epoch.
  data_position = function(self)
    local consumed, per_epoch = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
    check(lib.sk_trainer_data_position(self.h, consumed, per_epoch))
    return int64_result(consumed[0]), int64_result(per_epoch[0])
  end,
  -- This rank's sample ids of the last step, as a Lua array.
  last_sample_ids = function(self)
    local n = ffi.new("int64_t[1]")
    check(lib.sk_trainer_last_sample_ids(self.h, nil, 0, n))
    local ids = ffi.new("int64_t[?]", math.max(tonumber(n[0]), 1))
    check(lib.sk_trainer_last_sample_ids(self.h, ids, n[0], n))
    local t = {}
    for i = 0, tonumber(n[0]) - 1 do t[#t + 1] = int64_result(ids[i]) end
    return t
  end,
}))

-- options: sk_trainer_options as a table (fsdp/optimizer/device as nested
-- tables). Collective over `group`. On a sim device pass no group: the
-- trainer simulates a world of device.world_size ranks (a real group is
-- INVALID_ARGUMENT there; without a group only sim is accepted).
function M.trainer(options, group)
  local anchors = {}
  local o = to_struct("sk_trainer_options", options or {}, anchors)
  local out = ffi.new("sk_trainer*[1]")
  pin(anchors)
  local code = lib.sk_trainer_create(o, group and group.h or nil, out)
  unpin(anchors)
  check(code)
  return Trainer(out[0])
end

-- Local session: N ranks on library threads behind one handle.
local LocalSession = handle_type("sk_local_session", lib.sk_local_session_destroy,
                                 checkpoint_methods("sk_local_session", {
  -- One step on every rank; returns rank 0's metrics as a table.
  step = function(self)
    local m = new_metrics()
    check(lib.sk_local_session_step(self.h, m))
    return metrics_table(m)
  end,
  -- One step on the caller's batches: world size x grad_accum_steps,
  -- rank-major; rank 0's metrics.
  step_batches = function(self, batches)
    local ptrs, n, keep = batch_pointers(batches)
    local m = new_metrics()
    check(lib.sk_local_session_step_batches(self.h, ptrs, n, m))
    keep = nil
    return metrics_table(m)
  end,
  metrics = function(self, rank)
    local m = new_metrics()
    check(lib.sk_local_session_metrics(self.h, rank, m))
    return metrics_table(m)
  end,
  evaluate = function(self, batches)
    local out = ffi.new("float[1]")
    check(lib.sk_local_session_evaluate(self.h, batches, out))
    return out[0]
  end,
  set_lr = function(self, lr) check(lib.sk_local_session_set_lr(self.h, lr)) end,
  world_size = function(self)
    local out = ffi.new("int32_t[1]")
    check(lib.sk_local_session_world_size(self.h, out))
    return out[0]
  end,
}))

-- Every rank on options.device (cpu or cuda: a local group cannot carry the
-- simulator's tensors, so sim is the library's INVALID_ARGUMENT).
function M.local_session(options, world_size, network_model)
  local anchors = {}
  local o = to_struct("sk_trainer_options", options or {}, anchors)
  local out = ffi.new("sk_local_session*[1]")
  pin(anchors)
  local code = lib.sk_local_session_create(o, world_size, network_model, out)
  unpin(anchors)
  check(code)
  return LocalSession(out[0])
end

-- Model spec.
local ModelSpec = handle_type("sk_model_spec", lib.sk_model_spec_destroy, {
  -- Returns the unit's index (0-based, the C API's).
  add_unit = function(self, name)
    local out = ffi.new("int32_t[1]")
    check(lib.sk_model_spec_add_unit(self.h, name, out))
    return out[0]
  end,
  -- param: {name = "w", shape = {4, 2}, init = "normal", init_a = 0, init_b = 0.02}
  add_param = function(self, unit, param)
    local anchors = {}
    local fields = {}
    for k, v in pairs(param) do
      if k ~= "shape" then fields[k] = v end
    end
    local p = to_struct("sk_param_spec", fields, anchors)
    local shape = param.shape or {}
    local dims = ffi.new("int64_t[?]", math.max(#shape, 1), shape)
    anchors[#anchors + 1] = dims
    p.ndim = #shape
    p.shape = dims
    local out = ffi.new("int32_t[1]")
    pin(anchors)
    local code = lib.sk_model_spec_add_param(self.h, unit, p, out)
    unpin(anchors)
    check(code)
    return out[0]
  end,
  -- `unit` also uses parameter `owner_param` of the earlier unit
  -- `owner_unit` (a tied parameter, sk_model_spec_add_tied_param); returns
  -- its index within `unit`, after the unit's own parameters.
  add_tied_param = function(self, unit, name, owner_unit, owner_param)
    local out = ffi.new("int32_t[1]")
    check(lib.sk_model_spec_add_tied_param(self.h, unit, name, owner_unit, owner_param, out))
    return out[0]
  end,
})

function M.model_spec()
  local out = ffi.new("sk_model_spec*[1]")
  check(lib.sk_model_spec_create(out))
  return ModelSpec(out[0])
end

-- Engine.
local function view(fn, engine, unit, param)
  local v = ffi.new("sk_tensor_view")
  v.struct_size = ffi.sizeof(v)
  check(fn(engine.h, unit, param, v))
  return v
end
-- The view's data as float* (error unless f32 and host memory), and its
-- element count.
local off_host = {[tonumber(lib.SK_DEVICE_CUDA)] = "cuda (device memory)",
                  [tonumber(lib.SK_DEVICE_SIM)] = "the simulator (no data behind it)"}
local function f32(v, engine, what)
  local where = off_host[tonumber(engine.device)]
  if where then
    failed_precondition(string.format("engine:%s: the buffer is on %s, not host memory; use %s_view",
                                      what, where, what), 3)
  end
  if v.dtype ~= lib.SK_DTYPE_F32 then
    invalid_argument("buffer dtype is not f32 (param_dtype/reduce_dtype)", 3)
  end
  return ffi.cast("float*", v.data), tonumber(v.numel)
end

local Engine = handle_type("sk_engine", lib.sk_engine_destroy, {
  num_units = function(self)
    local out = ffi.new("int32_t[1]")
    check(lib.sk_engine_num_units(self.h, out))
    return out[0]
  end,
  pre_forward = function(self, unit) check(lib.sk_engine_pre_forward(self.h, unit)) end,
  post_forward = function(self, unit) check(lib.sk_engine_post_forward(self.h, unit)) end,
  pre_backward = function(self, unit) check(lib.sk_engine_pre_backward(self.h, unit)) end,
  post_backward = function(self, unit) check(lib.sk_engine_post_backward(self.h, unit)) end,
  -- The raw sk_tensor_view of a gathered parameter / gradient buffer.
  param_view = function(self, unit, param) return view(lib.sk_engine_param, self, unit, param) end,
  grad_view = function(self, unit, param) return view(lib.sk_engine_grad, self, unit, param) end,
  -- float* and element count (valid until the matching post_* call).
  -- Host memory only: FAILED_PRECONDITION on cuda and sim (use the views).
  param = function(self, unit, param) return f32(view(lib.sk_engine_param, self, unit, param), self, "param") end,
  grad = function(self, unit, param) return f32(view(lib.sk_engine_grad, self, unit, param), self, "grad") end,
  -- The sk_device_kind_t the engine was created on.
  device_kind = function(self) return tonumber(self.device) end,
  set_gradient_sync = function(self, enabled)
    check(lib.sk_engine_set_gradient_sync(self.h, enabled and 1 or 0))
  end,
  -- Stream-ordered hooks on `stream` (from M.stream or M.wrap_cuda_stream)
  -- from the next call on; nil: the synchronous protocol. The engine keeps
  -- the stream alive.
  set_stream = function(self, stream)
    check(lib.sk_engine_set_stream(self.h, stream and stream.h or nil))
  end,
  finish_backward = function(self) check(lib.sk_engine_finish_backward(self.h)) end,
  clip_grad_norm = function(self, max_norm)
    local out = ffi.new("double[1]")
    check(lib.sk_engine_clip_grad_norm(self.h, max_norm, out))
    return out[0]
  end,
  optimizer_step = function(self) check(lib.sk_engine_optimizer_step(self.h)) end,
  zero_grad = function(self) check(lib.sk_engine_zero_grad(self.h)) end,
  -- Full state dicts of the units; layout as for trainers (nil = shardkit).
  save_state_dict = function(self, path, layout)
    check(lib.sk_engine_save_state_dict(self.h, path, weight_layout(layout)))
  end,
  load_state_dict = function(self, path, layout)
    check(lib.sk_engine_load_state_dict(self.h, path, weight_layout(layout)))
  end,
  -- An update rule of your own: after finish_backward, begin_custom_step;
  -- master_shard(u), grad_shard(u), optimizer_state(u, i) are float* views
  -- (and their length) of this rank's shards, host memory only; then
  -- end_custom_step.
  begin_custom_step = function(self) check(lib.sk_engine_begin_custom_step(self.h)) end,
  master_shard = function(self, unit)
    local v = ffi.new("sk_tensor_view")
    v.struct_size = ffi.sizeof(v)
    check(lib.sk_engine_master_shard(self.h, unit, v))
    return f32(v, self, "master_shard")
  end,
  grad_shard = function(self, unit)
    local v = ffi.new("sk_tensor_view")
    v.struct_size = ffi.sizeof(v)
    check(lib.sk_engine_grad_shard(self.h, unit, v))
    return f32(v, self, "grad_shard")
  end,
  optimizer_state = function(self, unit, index)
    local v = ffi.new("sk_tensor_view")
    v.struct_size = ffi.sizeof(v)
    check(lib.sk_engine_optimizer_state(self.h, unit, index, v))
    return f32(v, self, "optimizer_state")
  end,
  end_custom_step = function(self) check(lib.sk_engine_end_custom_step(self.h)) end,
  -- Where each parameter lies in this rank's shard of `unit` (0.8.0; any
  -- time): {shard_index, num_shards, pieces = {{name, param, shape,
  -- shard_offset, numel, param_offset, param_group (nil: none),
  -- weight_decay, lr_multiplier}, ...}}. shard_index is the rank's place in
  -- the unit's shard group, not its rank (0 of 1 under NO_SHARD).
  shard_layout = function(self, unit)
    local index, shards, n = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("int32_t[1]")
    check(lib.sk_engine_shard_layout(self.h, unit, index, shards, n))
    local layout = {shard_index = index[0], num_shards = shards[0], pieces = {}}
    for i = 0, n[0] - 1 do
      local p = ffi.new("sk_shard_piece")
      p.struct_size = ffi.sizeof(p)
      check(lib.sk_engine_shard_piece(self.h, unit, i, p))
      local shape = {}
      for d = 0, p.ndim - 1 do shape[d + 1] = int64_result(p.shape[d]) end
      layout.pieces[i + 1] = {
        name = ffi.string(p.name), param = p.param, shape = shape,
        shard_offset = int64_result(p.shard_offset), numel = int64_result(p.numel),
        param_offset = int64_result(p.param_offset),
        param_group = p.param_group >= 0 and p.param_group or nil,
        weight_decay = p.weight_decay, lr_multiplier = p.lr_multiplier,
      }
    end
    return layout
  end,
  -- Sets a parameter's full value from a Lua array (collective).
  write_param = function(self, unit, param, values)
    local n = #values
    local buf = ffi.new("float[?]", math.max(n, 1))
    for i = 1, n do buf[i - 1] = values[i] end
    check(lib.sk_engine_write_param(self.h, unit, param, buf, n))
  end,
  set_lr = function(self, lr) check(lib.sk_engine_set_lr(self.h, lr)) end,
  -- A token-weighted loss (sk_engine_set_loss_tokens): this rank's counted
  -- tokens in the step's micro-batches; returns N, the sum over ranks. Add
  -- the gradients of each micro-batch's loss SUM: the step's reductions
  -- divide by N (collective; once per step, before its first reduction).
  set_loss_tokens = function(self, tokens)
    local out = ffi.new("int64_t[1]")
    check(lib.sk_engine_set_loss_tokens(self.h, tokens, out))
    return tonumber(out[0])
  end,
  lr = function(self)
    local out = ffi.new("float[1]")
    check(lib.sk_engine_get_lr(self.h, out))
    return out[0]
  end,
  steps = function(self)
    local out = ffi.new("int64_t[1]")
    check(lib.sk_engine_steps(self.h, out))
    return int64_result(out[0])
  end,
  -- Sharded checkpoints in the trainer's format; load returns the step.
  save_checkpoint = function(self, dir) check(lib.sk_engine_save_checkpoint(self.h, dir)) end,
  load_checkpoint = function(self, dir)
    local out = ffi.new("int64_t[1]")
    check(lib.sk_engine_load_checkpoint(self.h, dir, out))
    return int64_result(out[0])
  end,
  -- The full parameter as a Lua array of numbers.
  read_param = function(self, unit, param, numel)
    local buf = ffi.new("float[?]", math.max(numel, 1))
    check(lib.sk_engine_read_param(self.h, unit, param, buf, numel))
    local out = {}
    for i = 0, numel - 1 do out[i + 1] = buf[i] end
    return out
  end,
}, "int32_t device;")

-- options: sk_engine_options as a table (fsdp/optimizer/device nested;
-- 0.8.0: custom_optimizer = "lion", custom_state_names = {"exp_avg"}).
-- Collective over `group`; on a sim device pass group nil (the engine
-- simulates its own world; its views have shapes and no data).
function M.engine(spec, group, options)
  local anchors = {}
  local o = to_struct("sk_engine_options", options, anchors)
  local out = ffi.new("sk_engine*[1]")
  local device = (o ~= nil and o.device ~= nil) and o.device.kind or lib.SK_DEVICE_CPU
  pin(anchors)
  local code = lib.sk_engine_create(spec.h, group and group.h or nil, o, out)
  unpin(anchors)
  check(code)
  return Engine(out[0], device)
end

-- Caller streams (sk_stream): the caller's in-order work queue on an
-- engine's device, which the engine's hooks order themselves against once
-- engine:set_stream names it (see shardkit.h, "Caller streams").
local Stream = handle_type("sk_stream", lib.sk_stream_destroy, {
  -- Enqueues fn(user_data) after the stream's earlier work. `fn` must be a C
  -- function (a cdata sk_stream_fn from a C library): it runs on the
  -- stream's thread, where no Lua callback may run.
  enqueue = function(self, fn, user_data)
    if type(fn) ~= "cdata" then
      invalid_argument("stream:enqueue needs a C function (sk_stream_fn cdata), not a " .. type(fn) ..
                       ": the stream runs it on another thread, where Lua cannot run", 2)
    end
    check(lib.sk_stream_enqueue(self.h, fn, user_data))
  end,
  -- Blocks until everything enqueued so far has run.
  synchronize = function(self) check(lib.sk_stream_synchronize(self.h)) end,
})

-- A new stream on the device of `engine` (cpu: a worker thread; cuda: a
-- stream the handle owns).
function M.stream(engine)
  local out = ffi.new("sk_stream*[1]")
  check(lib.sk_stream_create(engine.h, out))
  return Stream(out[0])
end

-- Wraps the caller's cudaStream_t (a pointer cdata; not owned: it must
-- outlive the engine).
function M.wrap_cuda_stream(engine, cuda_stream)
  local out = ffi.new("sk_stream*[1]")
  check(lib.sk_stream_wrap_cuda(engine.h, cuda_stream, out))
  return Stream(out[0])
end

-- The planner (sk_plan). `request` is sk_plan_request as a table (model,
-- profile, gpus, gpus_per_node, batch_size, seq_len, source_len, strategies,
-- dtypes, trace_path); activation_checkpointing and cpu_offload take "both",
-- "off" or "on" (or the C values 0/1/2). checkpointing lists the policies to
-- search instead, as a string ("off,selective") or a table of names
-- ({"off", "full", "selective", "selective_attention", "selective_matmuls"}).
-- Returns a plain table:
-- profile, device_memory_bytes, recommended (1-based index into candidates, or
-- nil when nothing fits), recommendation, table, json, and candidates in
-- ranked order, each with the fields of sk_plan_candidate (label and error as
-- strings, enums as numbers, fits/out_of_memory/... as booleans;
-- activation_checkpointing true for whole-block checkpointing) and
-- checkpointing, the candidate's policy by name ("off", "full", "selective",
-- "selective_attention", "selective_matmuls").
local both_off_on = {both = 0, off = 1, on = 2}
local candidate_numbers = {
  "parallelism", "strategy", "shard_group_size", "backward_prefetch", "rate_limit",
  "param_dtype", "reduce_dtype", "peak_allocated_bytes", "peak_reserved_bytes",
  "alloc_retries", "required_bytes", "step_seconds", "tflops_per_gpu", "mfu",
  "exposed_comm_seconds", "peak_host_bytes",
}
local candidate_flags = {"forward_prefetch", "cpu_offload", "fits", "out_of_memory"}
local checkpointing_names = {
  [tonumber(lib.SK_CHECKPOINTING_OFF)] = "off",
  [tonumber(lib.SK_CHECKPOINTING_FULL)] = "full",
  [tonumber(lib.SK_CHECKPOINTING_SELECTIVE)] = "selective",
  [tonumber(lib.SK_CHECKPOINTING_SELECTIVE_ATTENTION)] = "selective_attention",
  [tonumber(lib.SK_CHECKPOINTING_SELECTIVE_MATMULS)] = "selective_matmuls",
}
function M.plan(request)
  local t = {}
  for k, v in pairs(request or {}) do
    if (k == "activation_checkpointing" or k == "cpu_offload") and type(v) == "string" then
      if both_off_on[v] == nil then
        invalid_argument(k .. " must be 'both', 'off' or 'on', not '" .. v .. "'", 2)
      end
      v = both_off_on[v]
    elseif k == "checkpointing" and type(v) == "table" then
      v = table.concat(v, ",")
    end
    t[k] = v
  end
  local anchors = {}
  local r = to_struct("sk_plan_request", t, anchors)
  local out = ffi.new("sk_plan_result*[1]")
  pin(anchors)
  local code = lib.sk_plan(r, out)
  unpin(anchors)
  check(code)
  local res = ffi.gc(out[0], lib.sk_plan_result_free)
  local plan = {
    profile = ffi.string(res.profile),
    device_memory_bytes = int64_result(res.device_memory_bytes),
    recommended = res.recommended >= 0 and res.recommended + 1 or nil,
    recommendation = ffi.string(res.recommendation),
    table = ffi.string(res.table),
    json = ffi.string(res.json),
    candidates = {},
  }
  local c = ffi.new("sk_plan_candidate")
  for i = 0, res.num_candidates - 1 do
    c.struct_size = ffi.sizeof(c)
    check(lib.sk_plan_result_candidate(res, i, c))
    local e = {label = ffi.string(c.label), error = c.error ~= nil and ffi.string(c.error) or nil}
    for _, k in ipairs(candidate_numbers) do e[k] = int64_result(c[k]) end
    for _, k in ipairs(candidate_flags) do e[k] = c[k] ~= 0 end
    e.activation_checkpointing = c.activation_checkpointing == lib.SK_CHECKPOINTING_FULL
    e.checkpointing = checkpointing_names[tonumber(c.activation_checkpointing)]
    plan.candidates[i + 1] = e
  end
  lib.sk_plan_result_free(ffi.gc(res, nil))
  return plan
end

-- A number rounded to f32 (as C's (float)x), and back to a Lua number.
function M.to_f32(x)
  return tonumber(ffi.new("float[1]", x)[0])
end

-- The bits of a number rounded to f32, as "0x%08x" (for bit-exact output).
function M.f32_bits_hex(x)
  local f = ffi.new("float[1]", x)
  return string.format("0x%08x", tonumber(ffi.cast("uint32_t*", f)[0]))
end

return M
