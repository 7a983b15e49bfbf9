-- examples/c/finetune.c through the Lua frontend (docs/finetune.md): import a
-- Hugging Face directory, fine-tune it on a JSONL whose prompt tokens are
-- labelled -100, evaluate on a held-out JSONL, export a directory
-- transformers loads. One process per rank over gloo; same settings and
-- output as the C program.
--   launch --nproc_per_node=2 --master_port=0 luajit examples/lua/finetune.lua \
--       MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR
local sk = require("shardkit")

if #arg ~= 4 then
  io.stderr:write("usage: finetune.lua MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR\n")
  os.exit(2)
end
local model_dir, train, held_out, out_dir = arg[1], arg[2], arg[3], arg[4]
if out_dir:sub(-1) ~= "/" then out_dir = out_dir .. "/" end  -- written as a directory

local function print_loss(what, loss)
  print(string.format("%s loss %.9g bits %s", what, loss, sk.f32_bits_hex(loss)))
end

local group = sk.gloo_group()  -- RANK, WORLD_SIZE, ...
local rank = group:rank()
local trainer = sk.trainer({
  model = model_dir,  -- its config.json gives the shape
  optimizer = {kind = "adamw", lr = 5e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01},
  lr_schedule = {kind = "cosine", warmup_steps = 2, decay_steps = 6, min_lr = 5e-4},
  batch_size = 2,  -- rows per rank per step
  seq_len = 16,
  clip_grad_norm = 1.0,
  skip_init = true,  -- no random weights: the load below brings them
  -- input_ids + labels (-100 = not trained), in file order.
  dataset = {paths = {train}, format = "jsonl", sequential = true, eval_paths = {held_out}},
}, group)
trainer:load_state_dict(model_dir, "hf-llama")
local eval = trainer:evaluate(1000)  -- one pass over the eval file
if rank == 0 then print_loss("eval before", eval) end
for step = 1, 8 do
  local m = trainer:step()
  if rank == 0 then print_loss("step " .. step, m.global_loss) end
end
eval = trainer:evaluate(1000)
if rank == 0 then print_loss("eval after", eval) end
trainer:save_state_dict(out_dir, "hf-llama")
trainer:close()
group:close()
