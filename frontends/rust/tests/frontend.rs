//! The safe layer: Results carrying the library's code and message, owners
//! that release in Drop, and rank callbacks whose errors and panics come back
//! as Results instead of unwinding through C.
use shardkit::{
    run_local_ranks, sys, Batch, Bf16, CustomOptimizer, Dataset, Device, Engine, EngineOptions, FsdpOptions, Group, LocalSession, LrSchedule, ModelSpec,
    OptimizerOptions, ParamGroup, ParamSpec, ProcessGroup, ReduceOp, Stream, Trainer, TrainerOptions, WeightLayout,
};

fn tiny() -> TrainerOptions {
    TrainerOptions { model: Some("gpt-tiny".to_string()), data_tokens: 64, ..Default::default() }
}

#[test]
fn version_is_the_librarys() {
    assert_eq!(shardkit::version(), "0.8.0");
    assert_eq!(shardkit::version_number(), 8000);
}

#[test]
fn errors_carry_code_name_and_message() {
    let e = shardkit::model_num_parameters("gpt-nonexistent").unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_NOT_FOUND);
    assert_eq!(e.code_name(), "NOT_FOUND");
    assert!(e.message.contains("gpt-nonexistent"), "{}", e);
    assert!(e.to_string().starts_with("NOT_FOUND: "), "{}", e);
    let e = shardkit::parse_sharding_strategy("QUARTER_SHARD").unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    let e = shardkit::model_num_parameters("nul\0inside").unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert!(ProcessGroup::local(0, None).is_err());
}

#[test]
fn nccl_groups_check_their_options_and_say_what_is_missing() {
    let e = ProcessGroup::nccl_with(Some(-1), None).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert!(e.message.contains("sk_nccl_options.device"), "{}", e);
    // Outside a launcher: a library without CUDA says so; one with CUDA
    // names the first missing variable (tests run without RANK).
    let e = ProcessGroup::nccl_from_env().unwrap_err();
    if e.code == sys::SK_STATUS_UNAVAILABLE {
        assert!(e.message.contains("built without CUDA"), "{}", e);
    } else {
        assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
        assert!(e.message.contains("RANK"), "{}", e);
    }
}

#[test]
fn a_dataset_feeds_a_trainer_in_order_and_bad_ones_are_refused() {
    let base = std::env::var_os("TEST_TMPDIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let path = base.join(format!("rust-dataset-{}.jsonl", std::process::id()));
    let mut text = String::new();
    for i in 0..6 {
        text += &format!("{{\"input_ids\": [{}, {}, {}], \"labels\": [-100, {}, {}]}}\n", i, i + 1, i + 2, i + 1, i + 2);
    }
    std::fs::write(&path, text).unwrap();
    let dataset = Dataset {
        paths: vec![path.clone()],
        format: sys::SK_DATASET_FORMAT_JSONL,
        seed: 7,
        eos_id: Some(0),
        eval_paths: vec![path.clone()],
        ..Default::default()
    };
    let groups = ProcessGroup::local(1, None).unwrap();
    let options = TrainerOptions { data_tokens: 0, dataset: Some(dataset.clone()), ..tiny() };
    let mut trainer = Trainer::new(&options, &groups[0]).unwrap();
    assert_eq!(trainer.last_sample_ids().unwrap(), Vec::<i64>::new());
    trainer.step().unwrap();
    let ids = trainer.last_sample_ids().unwrap();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    let p = trainer.data_position().unwrap();
    assert_eq!((p.samples_consumed, p.samples_per_epoch), (2, 6));
    assert!(trainer.evaluate(10).unwrap() > 0.0);

    let packed_tokens = Dataset { format: sys::SK_DATASET_FORMAT_TOKENS, packing: true, eos_id: None, ..dataset };
    let bad = TrainerOptions { dataset: Some(packed_tokens), ..options.clone() };
    let e = Trainer::new(&bad, &groups[0]).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert!(e.message.contains("eos_id"), "{}", e);
    let none = TrainerOptions { dataset: Some(Dataset::default()), ..options };
    assert_eq!(Trainer::new(&none, &groups[0]).unwrap_err().code, sys::SK_STATUS_INVALID_ARGUMENT);
    let plain = Trainer::new(&tiny(), &groups[0]).unwrap();
    assert_eq!(plain.data_position().unwrap_err().code, sys::SK_STATUS_FAILED_PRECONDITION);
}

#[test]
fn trainer_keeps_its_group_alive_after_the_owner_drops() {
    let groups = ProcessGroup::local(1, None).unwrap();
    assert_eq!(groups[0].label().unwrap(), "local");
    let mut trainer = Trainer::new(&tiny(), &groups[0]).unwrap();
    drop(groups);
    assert_eq!(trainer.step().unwrap().step, 1);
    assert_eq!(trainer.num_parameters().unwrap(), shardkit::model_num_parameters("gpt-tiny").unwrap());
    assert!(trainer.evaluate(1).unwrap() > 0.0);
    assert_eq!(trainer.evaluate(0).unwrap_err().code, sys::SK_STATUS_INVALID_ARGUMENT);
}

#[test]
fn selective_checkpointing_steps_as_no_checkpointing() {
    let losses = |policy: sys::sk_activation_checkpointing_t| {
        let options = TrainerOptions { model: Some("llama-tiny".to_string()), activation_checkpointing: policy, ..tiny() };
        let groups = ProcessGroup::local(1, None).unwrap();
        let mut trainer = Trainer::new(&options, &groups[0]).unwrap();
        (trainer.step().unwrap().loss, trainer.step().unwrap().loss)
    };
    let off = losses(sys::SK_CHECKPOINTING_OFF);
    for policy in [sys::SK_CHECKPOINTING_FULL, sys::SK_CHECKPOINTING_SELECTIVE,
                   sys::SK_CHECKPOINTING_SELECTIVE_ATTENTION, sys::SK_CHECKPOINTING_SELECTIVE_MATMULS] {
        assert_eq!(losses(policy), off, "policy {}", policy);
    }
    let groups = ProcessGroup::local(1, None).unwrap();
    let bad = TrainerOptions { activation_checkpointing: 5, ..tiny() };
    let e = Trainer::new(&bad, &groups[0]).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    assert!(e.message.contains("activation_checkpointing"), "{}", e);
}

#[test]
fn local_session_trains_two_ranks() {
    let mut options = tiny();
    options.fsdp.strategy = sys::SK_SHARDING_FULL_SHARD;
    let mut session = LocalSession::new(&options, 2, None).unwrap();
    assert_eq!(session.world_size().unwrap(), 2);
    assert_eq!(session.metrics(0).unwrap_err().code, sys::SK_STATUS_FAILED_PRECONDITION);
    let m0 = session.step().unwrap();
    assert_eq!(m0.rank, 0);
    assert_eq!(session.metrics(1).unwrap().rank, 1);
    options.fsdp.strategy = 42;
    let e = LocalSession::new(&options, 2, None).unwrap_err();
    assert!(e.message.contains("strategy"), "{}", e);
}

#[test]
fn checkpoints_resume_a_session_and_report_failures() {
    let base = std::env::var_os("TEST_TMPDIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let dir = base.join(format!("rust_frontend_ckpt_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut session = LocalSession::new(&tiny(), 2, None).unwrap();
    session.step().unwrap();
    session.save_checkpoint(&dir).unwrap();
    let next = session.step().unwrap().loss;
    let mut resumed = LocalSession::new(&tiny(), 2, None).unwrap();
    assert_eq!(resumed.load_checkpoint(&dir).unwrap(), 1);
    assert_eq!(resumed.step().unwrap().loss, next);
    let groups = ProcessGroup::local(1, None).unwrap();
    let mut trainer = Trainer::new(&tiny(), &groups[0]).unwrap();
    assert_eq!(trainer.load_checkpoint(&dir).unwrap(), 1);
    let e = trainer.load_checkpoint(dir.join("missing")).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_NOT_FOUND, "{}", e);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rotating_checkpoints_resume_the_latest() {
    let base = std::env::var_os("TEST_TMPDIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let root = base.join(format!("rust_frontend_rotating_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let groups = ProcessGroup::local(1, None).unwrap();
    let mut trainer = Trainer::new(&tiny(), &groups[0]).unwrap();
    assert_eq!(trainer.resume_latest(&root).unwrap(), 0);
    for _ in 0..3 {
        trainer.step().unwrap();
        trainer.save_checkpoint_rotating(&root, 2).unwrap();
    }
    let next = trainer.step().unwrap().loss;
    let mut fresh = Trainer::new(&tiny(), &groups[0]).unwrap();
    assert_eq!(fresh.resume_latest(&root).unwrap(), 3);
    assert_eq!(fresh.step().unwrap().loss, next);
    let e = trainer.save_checkpoint_rotating(&root, 0).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    let _ = std::fs::remove_dir_all(&root);
}

/// A gpt-tiny micro-batch (vocabulary 64) of `rows` x `len` tokens: a
/// pattern, targets the inputs shifted, each row's first `ignored` targets
/// SK_IGNORE_INDEX.
fn pattern_batch(rows: i64, len: i64, ignored: i64) -> Batch {
    let mut ids = Vec::new();
    let mut targets = Vec::new();
    for r in 0..rows {
        for i in 0..len {
            ids.push(((r * 7 + i * 3) % 64) as i32);
            targets.push(if i < ignored { sys::SK_IGNORE_INDEX } else { ((r * 7 + (i + 1) * 3) % 64) as i32 });
        }
    }
    Batch::new(rows, len, ids, targets)
}

#[test]
fn trainers_and_sessions_step_on_the_callers_batches() {
    let options = TrainerOptions { batch_size: 2, seq_len: 16, ..tiny() };
    let groups = ProcessGroup::local(1, None).unwrap();
    let mut trainer = Trainer::new(&options, &groups[0]).unwrap();
    // Masked, then packed (two documents a row, positions restarting).
    let masked = pattern_batch(2, 16, 5).with_loss_mask(vec![1; 32]);
    let m = trainer.step_batches(&[masked.clone()]).unwrap();
    assert_eq!(m.step, 1);
    assert!(m.loss.is_finite() && m.loss > 0.0, "{}", m.loss);
    let positions: Vec<i32> = (0..2).flat_map(|_| (0..16).map(|i| if i < 6 { i } else { i - 6 })).collect();
    let segments: Vec<i32> = (0..2).flat_map(|_| (0..16).map(|i| i32::from(i >= 6))).collect();
    let packed = pattern_batch(2, 16, 0).packed(positions, segments);
    assert_eq!(trainer.step_batches(&[packed]).unwrap().step, 2);
    // A wrong length is refused before the library reads anything, and a
    // bad value by the library; neither counts as a step.
    let mut short = pattern_batch(2, 16, 0);
    short.targets.pop();
    let e = trainer.step_batches(&[short]).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    assert!(e.message.contains("batch 0: targets has 31 values"), "{}", e);
    let mut bad = pattern_batch(2, 16, 0);
    bad.targets[3] = -1;
    let e = trainer.step_batches(&[bad]).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    assert!(e.message.contains("targets"), "{}", e);
    let e = trainer.step_batches(&[]).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    assert!(e.message.contains("grad_accum_steps"), "{}", e);
    assert_eq!(trainer.step_batches(&[pattern_batch(1, 9, 0)]).unwrap().step, 3);

    // Two ranks of a session given the same masked batch: the global loss
    // is the one rank's loss on it (every counted target of both ranks).
    let mut one = Trainer::new(&options, &groups[0]).unwrap();
    let alone = one.step_batches(&[masked.clone()]).unwrap();
    let mut session = LocalSession::new(&options, 2, None).unwrap();
    let both = session.step_batches(&[masked.clone(), masked.clone()]).unwrap();
    // 0.8.0's counts: 2 x (16 - 5) targets a rank, twice that in all.
    assert_eq!(alone.target_tokens, 22);
    assert_eq!((both.target_tokens, both.global_target_tokens), (22, 44));
    assert!((both.global_loss - alone.loss).abs() <= 1e-6 * alone.loss, "{} vs {}", both.global_loss, alone.loss);
    let e = session.step_batches(&[masked]).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
}

#[test]
fn state_dicts_resume_a_session_and_import_hugging_face_layout() {
    let base = std::env::var_os("TEST_TMPDIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let file = base.join(format!("rust_frontend_sd_{}.safetensors", std::process::id()));
    let hf = base.join(format!("rust_frontend_sd_{}-hf.safetensors", std::process::id()));
    let mut session = LocalSession::new(&tiny(), 2, None).unwrap();
    session.step().unwrap();
    session.save_state_dict(&file, WeightLayout::Shardkit).unwrap();
    session.save_state_dict(&hf, WeightLayout::HfGpt2).unwrap();
    let weights = session.evaluate(1).unwrap();
    let next = session.step().unwrap().loss;
    // 0.8.0: skip_init, no random initialisation for weights a load brings;
    // until then the session refuses to step.
    let mut resumed = LocalSession::new(&TrainerOptions { skip_init: true, ..tiny() }, 2, None).unwrap();
    let e = resumed.step().unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_FAILED_PRECONDITION, "{}", e);
    assert!(e.message.contains("skip_init"), "{}", e);
    assert_eq!(resumed.load_state_dict(&hf, WeightLayout::HfGpt2).unwrap(), 0);
    assert_eq!(resumed.evaluate(1).unwrap(), weights);
    assert_eq!(resumed.load_state_dict(&file, WeightLayout::Shardkit).unwrap(), 1);
    assert_eq!(resumed.step().unwrap().loss, next);
    let groups = ProcessGroup::local(1, None).unwrap();
    let mut trainer = Trainer::new(&tiny(), &groups[0]).unwrap();
    assert_eq!(trainer.load_state_dict(&hf, WeightLayout::HfGpt2).unwrap(), 0);
    let e = trainer.load_state_dict(&file, WeightLayout::HfGpt2).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    assert!(e.message.contains("embed.wte"), "{}", e);
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&hf);
}

#[test]
fn ddp_trains_and_the_estimator_prefers_full_shard() {
    let mut options = tiny();
    options.parallelism = sys::SK_PARALLELISM_DDP;
    let mut ddp = LocalSession::new(&options, 2, None).unwrap();
    assert_eq!(ddp.step().unwrap().step, 1);
    let ddp_estimate = shardkit::estimate_memory(&options, 2).unwrap();
    options.parallelism = 7;
    assert!(LocalSession::new(&options, 2, None).unwrap_err().message.contains("parallelism"));
    let mut options = tiny();
    options.model = Some("gpt-1m".into());
    options.fsdp.strategy = sys::SK_SHARDING_FULL_SHARD;
    let full = shardkit::estimate_memory(&options, 4).unwrap();
    options.fsdp.strategy = sys::SK_SHARDING_NO_SHARD;
    let replicated = shardkit::estimate_memory(&options, 4).unwrap();
    assert!(full.peak_bytes > 0 && full.peak_bytes < replicated.peak_bytes, "{:?} vs {:?}", full, replicated);
    // DDP's estimate holds the whole model state on each of the 2 ranks.
    assert!(ddp_estimate.master_bytes > 0 && ddp_estimate.unsharded_bytes == 0, "{:?}", ddp_estimate);
    assert_eq!(full.parameters, shardkit::model_num_parameters("gpt-1m").unwrap());
}

#[test]
fn packed_documents_counts_the_composed_attention_on_cuda() {
    let options = |device: Device, packed: bool| TrainerOptions {
        model: Some("llama-tiny".to_string()),
        batch_size: 3,
        seq_len: 32,
        device: Some(device),
        packed_documents: packed,
        ..tiny()
    };
    let cuda = || Device::Cuda { index: None };
    let cpu = || Device::Cpu { index: None, launch_blocking: false };
    let plain = shardkit::estimate_memory(&options(cuda(), false), 2).unwrap();
    let packed = shardkit::estimate_memory(&options(cuda(), true), 2).unwrap();
    assert!(packed.activation_bytes - plain.activation_bytes > 4 * 3 * 4 * 32 * 32, "{:?} vs {:?}", packed, plain);
    assert_eq!(
        shardkit::estimate_memory(&options(cpu(), true), 2).unwrap().peak_bytes,
        shardkit::estimate_memory(&options(cpu(), false), 2).unwrap().peak_bytes
    );
}

#[test]
fn rank_errors_and_panics_come_back_as_results() {
    let e = run_local_ranks(2, None, |rank, group| {
        assert_eq!(group.rank().unwrap(), rank);
        if rank == 1 {
            shardkit::model_num_parameters("no-model")?;
        }
        Ok(())
    })
    .unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_NOT_FOUND);
    assert!(e.message.contains("no-model"), "{}", e);

    let e = run_local_ranks(3, None, |rank, _| {
        if rank == 2 {
            panic!("rank two is unhappy");
        }
        Ok(())
    })
    .unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INTERNAL);
    assert!(e.message.contains("rank 2 panicked: rank two is unhappy"), "{}", e);
}

/// A tied parameter is numbered after the unit's own and bad ties are errors.
#[test]
fn tied_parameter_is_declared_after_the_units_own() -> shardkit::Result<()> {
    let mut spec = ModelSpec::new()?;
    let embed = spec.add_unit("embed")?;
    let head = spec.add_unit("head")?;
    spec.add_param(embed, &ParamSpec { name: "w", shape: &[3], init: sys::SK_INIT_ONES, init_a: 0.0, init_b: 0.0 })?;
    spec.add_param(head, &ParamSpec { name: "b", shape: &[2], init: sys::SK_INIT_ZEROS, init_a: 0.0, init_b: 0.0 })?;
    assert!(spec.add_tied_param(embed, "x", head, 0).is_err());
    assert_eq!(spec.add_tied_param(head, "w", embed, 0)?, 1);
    Ok(())
}

/// y = 2x - 1 on two ranks, each with half the batch: both ranks end with
/// the same parameters, close to the truth.
#[test]
fn two_rank_engine_regression_converges() {
    let results = std::sync::Mutex::new(vec![0.0f32; 2]);
    run_local_ranks(2, None, |rank, group| {
        let mut spec = ModelSpec::new()?;
        let u = spec.add_unit("linear")?;
        spec.add_param(u, &ParamSpec { name: "w", shape: &[1], init: sys::SK_INIT_NORMAL, init_a: 0.0, init_b: 0.5 })?;
        spec.add_param(u, &ParamSpec { name: "b", shape: &[1], init: sys::SK_INIT_ZEROS, init_a: 0.0, init_b: 0.0 })?;
        let options = EngineOptions {
            optimizer: OptimizerOptions { kind: sys::SK_OPTIMIZER_SGD, lr: 0.2, ..Default::default() },
            ..Default::default()
        };
        let mut e = Engine::new(&spec, &group, &options)?;
        for _ in 0..60 {
            e.zero_grad()?;
            e.pre_forward(u)?;
            let (w, b) = (e.param(u, 0)?[0] as f64, e.param(u, 1)?[0] as f64);
            let xs: Vec<f64> = (0..4).map(|i| (rank * 4 + i) as f64 / 4.0 - 1.0).collect();
            let errs: Vec<f64> = xs.iter().map(|x| w * x + b - (2.0 * x - 1.0)).collect();
            e.post_forward(u)?;
            e.pre_backward(u)?;
            let gw: f64 = xs.iter().zip(&errs).map(|(x, r)| 2.0 * r * x / 4.0).sum();
            let gb: f64 = errs.iter().map(|r| 2.0 * r / 4.0).sum();
            e.grad(u, 0)?[0] += gw as f32;
            e.grad(u, 1)?[0] += gb as f32;
            e.post_backward(u)?;
            e.finish_backward()?;
            e.optimizer_step()?;
        }
        results.lock().unwrap()[rank as usize] = e.read_param(u, 0, 1)?[0];
        Ok(())
    })
    .unwrap();
    let w = results.into_inner().unwrap();
    assert_eq!(w[0], w[1]);
    assert!((w[0] - 2.0).abs() < 0.2, "w = {}", w[0]);
}

#[test]
fn engine_lifecycle_errors_are_results() {
    let groups = ProcessGroup::local(1, None).unwrap();
    let mut spec = ModelSpec::new().unwrap();
    let u = spec.add_unit("layer").unwrap();
    let e = spec.add_param(u, &ParamSpec { name: "w", shape: &[2, -1], init: 0, init_a: 0.0, init_b: 0.0 }).unwrap_err();
    assert!(e.message.contains("layer.w"), "{}", e);
    spec.add_param(u, &ParamSpec { name: "w", shape: &[2, 3], init: sys::SK_INIT_ONES, init_a: 0.0, init_b: 0.0 }).unwrap();
    let mut engine = Engine::new(&spec, &groups[0], &EngineOptions::default()).unwrap();
    assert_eq!(engine.num_units().unwrap(), 1);
    assert_eq!(engine.post_forward(u).unwrap_err().code, sys::SK_STATUS_FAILED_PRECONDITION);
    assert_eq!(engine.param(u, 0).unwrap_err().code, sys::SK_STATUS_FAILED_PRECONDITION);
    engine.pre_forward(u).unwrap();
    assert_eq!(engine.param(u, 0).unwrap(), &[1.0f32; 6][..]);
    assert_eq!(engine.param(u, 1).unwrap_err().code, sys::SK_STATUS_OUT_OF_RANGE);
    engine.post_forward(u).unwrap();
    assert_eq!(engine.read_param(u, 0, 5).unwrap_err().code, sys::SK_STATUS_INVALID_ARGUMENT);
    // State dicts: the ones come back after the parameter is overwritten by another file.
    let base = std::env::var_os("TEST_TMPDIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let ones = base.join(format!("rust_frontend_engine_{}.safetensors", std::process::id()));
    engine.save_state_dict(&ones, WeightLayout::Shardkit).unwrap();
    let mut zeros_spec = ModelSpec::new().unwrap();
    let z = zeros_spec.add_unit("layer").unwrap();
    zeros_spec.add_param(z, &ParamSpec { name: "w", shape: &[2, 3], init: 0, init_a: 0.0, init_b: 0.0 }).unwrap();
    let mut zeros = Engine::new(&zeros_spec, &groups[0], &EngineOptions::default()).unwrap();
    assert_eq!(zeros.read_param(z, 0, 6).unwrap(), vec![0.0f32; 6]);
    let e = zeros.load_state_dict(&ones, WeightLayout::HfGpt2).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    zeros.load_state_dict(&ones, WeightLayout::Shardkit).unwrap();
    assert_eq!(zeros.read_param(z, 0, 6).unwrap(), vec![1.0f32; 6]);
    let _ = std::fs::remove_file(&ones);
}

#[test]
fn plan_ranks_simulated_candidates() {
    let request = shardkit::PlanRequest {
        model: "gpt-1m".to_string(),
        gpus: 8,
        batch_size: 4,
        strategies: Some("DDP,NO_SHARD".to_string()),
        dtypes: Some("bf16".to_string()),
        activation_checkpointing: 1,
        cpu_offload: 1,
        ..Default::default()
    };
    let plan = shardkit::plan(&request).unwrap();
    assert_eq!(plan.profile, "a100-80g");
    assert_eq!(plan.candidates.len(), 2);
    assert_eq!(plan.recommended, Some(0));
    let best = &plan.candidates[0];
    assert!(best.fits && !best.out_of_memory && best.error.is_none(), "{:?}", best);
    assert!(best.step_seconds > 0.0 && best.step_seconds <= plan.candidates[1].step_seconds);
    assert!(plan.recommendation.contains(&best.label), "{}", plan.recommendation);
    assert!(plan.table.contains("simulated, profile a100-80g"), "{}", plan.table);
    let mut labels: Vec<&str> = plan.candidates.iter().map(|c| c.label.as_str()).collect();
    labels.sort();
    assert_eq!(labels, vec!["DDP bf16", "NO_SHARD bf16"]);
    // No offload: nothing in the simulated host memory; with it, the shards and optimizer state.
    assert!(plan.candidates.iter().all(|c| c.peak_host_bytes == 0));
    let offload = shardkit::plan(&shardkit::PlanRequest {
        strategies: Some("NO_SHARD".to_string()),
        cpu_offload: 2,
        ..request.clone()
    })
    .unwrap();
    assert_eq!(offload.candidates.len(), 1);
    assert!(offload.candidates[0].cpu_offload && offload.candidates[0].peak_host_bytes > 0, "{:?}", offload.candidates[0]);
    let e = shardkit::plan(&shardkit::PlanRequest { strategies: Some("ZERO4".to_string()), ..request.clone() })
        .unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert!(e.message.contains("ZERO4"), "{}", e);
    // Selective checkpointing, with and without the attention recomputed.
    let selective = shardkit::plan(&shardkit::PlanRequest {
        strategies: Some("DDP".to_string()),
        activation_checkpointing: 0,
        checkpointing: Some("full,selective,selective_attention".to_string()),
        ..request.clone()
    })
    .unwrap();
    assert_eq!(selective.candidates.len(), 3);
    let by = |policy| selective.candidates.iter().find(|c| c.checkpointing == policy).unwrap();
    let full = by(sys::SK_CHECKPOINTING_FULL);
    let sel = by(sys::SK_CHECKPOINTING_SELECTIVE);
    let attn = by(sys::SK_CHECKPOINTING_SELECTIVE_ATTENTION);
    assert!(full.activation_checkpointing && !sel.activation_checkpointing && !attn.activation_checkpointing);
    assert_eq!(sel.label, "DDP sel-ckpt bf16");
    assert_eq!(attn.label, "DDP sel-ckpt+attn bf16");
    assert!(attn.peak_allocated_bytes < sel.peak_allocated_bytes, "{:?} {:?}", attn, sel);
    assert_eq!(best.checkpointing, sys::SK_CHECKPOINTING_OFF);
    let e = shardkit::plan(&shardkit::PlanRequest { checkpointing: Some("sometimes".to_string()), ..request.clone() })
        .unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert!(e.message.contains("checkpointing"), "{}", e);
    // A decoder by its shape, RoPE scaling included; a half-given scaling is named.
    let decoder = "decoder:layers=2,d_model=32,heads=4,d_ff=64,vocab=64,seq=64";
    let scaled = shardkit::plan(&shardkit::PlanRequest {
        model: format!("{},rope_type=llama3,rope_factor=8,rope_low_freq_factor=1,rope_high_freq_factor=4,rope_original_max_positions=16", decoder),
        strategies: Some("DDP".to_string()),
        ..request.clone()
    })
    .unwrap();
    assert_eq!(scaled.candidates.len(), 1);
    assert!(scaled.candidates[0].fits, "{}", scaled.table);
    let e = shardkit::plan(&shardkit::PlanRequest {
        model: format!("{},rope_type=llama3,rope_factor=8", decoder),
        ..request.clone()
    })
    .unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert!(e.message.contains("'rope_low_freq_factor' is required with rope_type=llama3"), "{}", e);
    let e = shardkit::plan(&shardkit::PlanRequest { model: "gpt-9z".to_string(), ..request }).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_NOT_FOUND);
}

// --- devices ---------------------------------------------------------------------
// cargo runs tests on concurrent threads, and one simulated device runs one
// trainer, engine or plan at a time (plan uses sim:0): each test below that
// simulates takes its own sim device index.

/// 8 simulated A100-80G GPUs on sim:`index`.
fn a100s(index: i32) -> Device {
    Device::Sim { profile: "a100-80g".to_string(), world_size: 8, gpus_per_node: 0, index: Some(index), launch_blocking: false }
}

#[test]
fn a_simulated_trainer_makes_its_own_world() {
    let options = TrainerOptions { device: Some(a100s(1)), ..tiny() };
    let mut trainer = Trainer::simulated(&options).unwrap();
    assert_eq!(trainer.num_parameters().unwrap(), shardkit::model_num_parameters("gpt-tiny").unwrap());
    for step in 1..=3 {
        let m = trainer.step().unwrap();
        assert_eq!(m.step, step);
        assert_eq!(m.simulated, 1, "{:?}", m);
        assert!(m.loss.is_nan() && m.global_loss.is_nan() && m.grad_norm.is_nan(), "{:?}", m);
        assert!(m.step_seconds > 0.0, "{:?}", m);
        assert!(m.bytes_communicated > 0, "{:?}", m);
    }
    let e = trainer.save_checkpoint("/nonexistent/ckpt").unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_FAILED_PRECONDITION, "{}", e);
    drop(trainer);
    // A real group cannot carry the simulator's tensors, so neither can a session.
    let groups = ProcessGroup::local(1, None).unwrap();
    let e = Trainer::new(&options, &groups[0]).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    assert!(e.message.contains("simulated process group"), "{}", e);
    let e = LocalSession::new(&options, 1, None).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    // Without a group only the simulator is accepted.
    let e = Trainer::simulated(&tiny()).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
    let e = Trainer::simulated(&TrainerOptions { device: Some(Device::cpu()), ..tiny() }).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{}", e);
}

#[test]
fn bad_devices_are_the_librarys_errors() {
    let groups = ProcessGroup::local(1, None).unwrap();
    let sim = |profile: &str, world_size: i32, gpus_per_node: i32| Device::Sim {
        profile: profile.to_string(),
        world_size,
        gpus_per_node,
        index: Some(2),
        launch_blocking: false,
    };
    let simulated = [
        (sim("", 8, 0), sys::SK_STATUS_INVALID_ARGUMENT, "sim_profile"),
        (sim("a100-80g", -2, 0), sys::SK_STATUS_INVALID_ARGUMENT, "sim_world_size"),
        (sim("a100-80g", 8, -1), sys::SK_STATUS_INVALID_ARGUMENT, "sim_gpus_per_node"),
        (sim("no-such-profile", 8, 0), sys::SK_STATUS_NOT_FOUND, "no-such-profile"),
        (sim("a100\0", 8, 0), sys::SK_STATUS_INVALID_ARGUMENT, "NUL"),
    ];
    for (device, code, mentions) in simulated {
        let e = Trainer::simulated(&TrainerOptions { device: Some(device.clone()), ..tiny() }).unwrap_err();
        assert_eq!(e.code, code, "{:?}: {}", device, e);
        assert!(e.message.contains(mentions), "{:?}: {}", device, e);
    }
    let grouped = [
        (Device::Cpu { index: Some(-1), launch_blocking: false }, "index"),
        (
            Device::Sim {
                profile: "a100-80g".to_string(),
                world_size: 8,
                gpus_per_node: 0,
                index: Some(-3),
                launch_blocking: false,
            },
            "index",
        ),
    ];
    for (device, mentions) in grouped {
        let e = Trainer::new(&TrainerOptions { device: Some(device.clone()), ..tiny() }, &groups[0]).unwrap_err();
        assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT, "{:?}: {}", device, e);
        assert!(e.message.contains(mentions), "{:?}: {}", device, e);
    }
    // The estimator validates the device as trainer creation does.
    let e = shardkit::estimate_memory(&TrainerOptions { device: Some(sim("", 8, 0)), ..tiny() }, 1).unwrap_err();
    assert!(e.message.contains("sim_profile"), "{}", e);
}

#[test]
fn cuda_is_unavailable_without_a_gpu_and_trains_with_one() {
    let groups = ProcessGroup::local(1, None).unwrap();
    match Trainer::new(&TrainerOptions { device: Some(Device::cuda(0)), ..tiny() }, &groups[0]) {
        Ok(mut trainer) => {
            let m = trainer.step().unwrap();
            assert!(m.simulated == 0 && m.loss.is_finite(), "{:?}", m);
        }
        Err(e) => {
            assert_eq!(e.code, sys::SK_STATUS_UNAVAILABLE, "{}", e);
            assert!(e.message.contains("cuda"), "{}", e);
        }
    }
    match LocalSession::new(&TrainerOptions { device: Some(Device::Cuda { index: None }), ..tiny() }, 2, None) {
        Ok(mut session) => assert!(session.step().unwrap().global_loss.is_finite()),
        Err(e) => {
            assert_eq!(e.code, sys::SK_STATUS_UNAVAILABLE, "{}", e);
            assert!(e.message.contains("cuda"), "{}", e);
        }
    }
}

#[test]
fn a_simulated_engine_has_views_without_data() {
    let mut spec = ModelSpec::new().unwrap();
    let u = spec.add_unit("layer").unwrap();
    spec.add_param(u, &ParamSpec { name: "w", shape: &[2, 3], init: sys::SK_INIT_NORMAL, init_a: 0.0, init_b: 1.0 })
        .unwrap();
    let options = EngineOptions { device: Some(a100s(3)), ..Default::default() };
    let mut engine = Engine::simulated(&spec, &options).unwrap();
    engine.pre_forward(u).unwrap();
    let v = engine.param_view(u, 0).unwrap();
    assert_eq!(v.numel, 6);
    assert_eq!(unsafe { std::slice::from_raw_parts(v.shape, v.ndim as usize) }, &[2, 3]);
    // No slice of simulated memory is ever made.
    let e = engine.param(u, 0).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_FAILED_PRECONDITION, "{}", e);
    assert!(e.message.contains("simulator"), "{}", e);
    engine.post_forward(u).unwrap();
    engine.pre_backward(u).unwrap();
    assert_eq!(engine.grad_view(u, 0).unwrap().numel, 6);
    assert_eq!(engine.grad(u, 0).unwrap_err().code, sys::SK_STATUS_FAILED_PRECONDITION);
    engine.post_backward(u).unwrap();
    engine.finish_backward().unwrap();
    engine.optimizer_step().unwrap();
    assert_eq!(engine.read_param(u, 0, 6).unwrap_err().code, sys::SK_STATUS_FAILED_PRECONDITION);
    // A real group is refused, and a group-less engine needs the simulator.
    let groups = ProcessGroup::local(1, None).unwrap();
    assert_eq!(Engine::new(&spec, &groups[0], &options).unwrap_err().code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert_eq!(Engine::simulated(&spec, &EngineOptions::default()).unwrap_err().code, sys::SK_STATUS_INVALID_ARGUMENT);
}

/// Raw views handed to a closure on the caller's stream (the caller's
/// "kernel"): valid for work enqueued there until the matching post_ call.
struct SendPtr<T>(*mut T);
unsafe impl<T> Send for SendPtr<T> {}

/// One step whose kernels are delayed closures on a caller stream, or run
/// inline (the synchronous protocol); returns the parameter.
fn step_with_kernels(on_stream: bool) -> Vec<f32> {
    let groups = ProcessGroup::local(1, None).unwrap();
    let mut spec = ModelSpec::new().unwrap();
    let u = spec.add_unit("layer").unwrap();
    spec.add_param(u, &ParamSpec { name: "w", shape: &[8], init: sys::SK_INIT_NORMAL, init_a: 0.0, init_b: 1.0 }).unwrap();
    let mut engine = Engine::new(&spec, &groups[0], &EngineOptions::default()).unwrap();
    let stream = Stream::new(&engine).unwrap();
    if on_stream {
        engine.set_stream(Some(&stream)).unwrap();
    }
    let launch = |kernel: Box<dyn FnOnce() + Send>| {
        if on_stream {
            stream
                .enqueue(move || {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    kernel()
                })
                .unwrap();
        } else {
            kernel();
        }
    };
    let saved = std::sync::Arc::new(std::sync::Mutex::new(vec![0.0f32; 8]));
    engine.pre_forward(u).unwrap();
    let w = SendPtr(engine.param_view(u, 0).unwrap().data as *mut f32);
    let s = saved.clone();
    launch(Box::new(move || {
        let w = w;
        let mut s = s.lock().unwrap();
        for i in 0..8 {
            s[i] = 2.0 * unsafe { *w.0.add(i) } + i as f32;
        }
    }));
    engine.post_forward(u).unwrap();
    engine.pre_backward(u).unwrap();
    let g = SendPtr(engine.grad_view(u, 0).unwrap().data as *mut f32);
    let s = saved.clone();
    launch(Box::new(move || {
        let g = g;
        let s = s.lock().unwrap();
        for i in 0..8 {
            unsafe { *g.0.add(i) += s[i] };
        }
    }));
    engine.post_backward(u).unwrap();
    engine.finish_backward().unwrap();
    engine.optimizer_step().unwrap();
    engine.read_param(u, 0, 8).unwrap()
}

#[test]
fn engine_hooks_on_a_caller_stream_match_the_synchronous_protocol() {
    assert_eq!(step_with_kernels(true), step_with_kernels(false));
    let groups = ProcessGroup::local(1, None).unwrap();
    let mut spec = ModelSpec::new().unwrap();
    let u = spec.add_unit("layer").unwrap();
    spec.add_param(u, &ParamSpec { name: "w", shape: &[2], init: sys::SK_INIT_ONES, init_a: 0.0, init_b: 0.0 }).unwrap();
    let mut engine = Engine::new(&spec, &groups[0], &EngineOptions::default()).unwrap();
    let e = Stream::wrap_cuda(&engine, std::ptr::null_mut()).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert!(e.message.contains("cuda engine"), "{}", e);
    engine.set_stream(None).unwrap();
}

#[test]
fn bf16_conversions_round_to_nearest_even_and_widen_exactly() {
    assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
    assert_eq!(Bf16::from_f32(1.0).to_f32(), 1.0);
    // 1 + 2^-8 is halfway between two bf16 values: ties to even (down).
    assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
    // 1 + 3 * 2^-8 is halfway too: ties to even (up).
    assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).to_f32(), 1.0 + 4.0 / 256.0);
    assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    assert_eq!(Bf16::from_f32(f32::INFINITY).to_f32(), f32::INFINITY);
    let v = [0.5f32, -3.0, 1e-3];
    let back = shardkit::from_bf16(&shardkit::to_bf16(&v));
    for (a, b) in v.iter().zip(&back) {
        assert!((a - b).abs() <= a.abs() / 128.0, "{} vs {}", a, b);
    }
}

#[test]
fn collectives_average_broadcast_gather_and_check_peers() {
    run_local_ranks(2, None, |rank, group| {
        assert_eq!(group.mean(rank as f32 + 1.0)?, 1.5);
        let mut m = [rank as f32, -(rank as f32)];
        group.all_reduce(&mut m, ReduceOp::Max)?;
        assert_eq!(m, [1.0, 0.0]);
        let mut b = [Bf16::from_f32(if rank == 1 { 2.5 } else { 0.0 })];
        group.broadcast(&mut b, 1)?;
        assert_eq!(b[0].to_f32(), 2.5);
        assert_eq!(group.all_gather(&[rank as f32])?, vec![0.0, 1.0]);
        group.barrier()?;
        let e = group.broadcast(&mut [0.0f32], 7).unwrap_err();
        assert_eq!(e.code, sys::SK_STATUS_OUT_OF_RANGE);
        Ok(())
    })
    .unwrap();
}

fn small_spec() -> shardkit::Result<ModelSpec> {
    let mut spec = ModelSpec::new()?;
    let u = spec.add_unit("fc")?;
    spec.add_param(u, &ParamSpec { name: "w", shape: &[2, 3], init: sys::SK_INIT_NORMAL, init_a: 0.0, init_b: 1.0 })?;
    spec.add_param(u, &ParamSpec { name: "b", shape: &[3], init: sys::SK_INIT_ZEROS, init_a: 0.0, init_b: 0.0 })?;
    Ok(spec)
}

fn engine_step(e: &mut Engine, g: f32) -> shardkit::Result<()> {
    e.zero_grad()?;
    e.pre_forward(0)?;
    e.post_forward(0)?;
    e.pre_backward(0)?;
    for p in 0..2 {
        for x in e.grad_as::<f32>(0, p)?.iter_mut() {
            *x += g;
        }
    }
    e.post_backward(0)?;
    e.finish_backward()?;
    e.optimizer_step()
}

// set_loss_tokens: 2 ranks counting 1 and 3 tokens, each adding a loss-sum
// gradient of 1 per element: the step's gradient is 2 / 4, not the mean 1.
#[test]
fn engine_set_loss_tokens_divides_by_every_ranks_tokens() {
    let seen = std::sync::Mutex::new(Vec::new());
    run_local_ranks(2, None, |rank, group| {
        let options = EngineOptions {
            optimizer: OptimizerOptions { kind: sys::SK_OPTIMIZER_SGD, lr: 1.0, weight_decay: 0.0, ..Default::default() },
            ..Default::default()
        };
        let mut e = Engine::new(&small_spec()?, &group, &options)?;
        let bad = e.set_loss_tokens(-1).map_err(|err| err.code);
        e.zero_grad()?;
        let n = e.set_loss_tokens(if rank == 0 { 1 } else { 3 })?;
        e.pre_forward(0)?;
        e.post_forward(0)?;
        e.pre_backward(0)?;
        for x in e.grad_as::<f32>(0, 1)?.iter_mut() {
            *x += 1.0;
        }
        e.post_backward(0)?;
        e.finish_backward()?;
        e.optimizer_step()?;
        let b = e.read_param(0, 1, 3)?;
        seen.lock().unwrap().push((bad, n, b));
        Ok(())
    })
    .unwrap();
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 2);
    for (bad, n, b) in &seen {
        assert_eq!(*bad, Err(sys::SK_STATUS_INVALID_ARGUMENT));
        assert_eq!(*n, 4);
        assert_eq!(*b, vec![-0.5; 3]);
    }
}

#[test]
fn engine_rate_groups_write_param_and_checkpoints_with_the_step() {
    let dir = std::env::temp_dir().join(format!("sk-rust-engine-ckpt-{}", std::process::id()));
    // Per rank: b after the lr-0 step, b and w after the 0.1 step, lr, steps,
    // the bf16 view's error code, the f32 view's length. Checked after the
    // ranks return, so that a failed check cannot leave a peer waiting.
    let seen = std::sync::Mutex::new(Vec::new());
    // EngineOptions is not Sync (it may carry a cudaStream_t): one per rank.
    let options = || EngineOptions {
        optimizer: OptimizerOptions { kind: sys::SK_OPTIMIZER_SGD, lr: 0.1, weight_decay: 0.5, ..Default::default() },
        param_groups: vec![ParamGroup::no_decay()],
        ..Default::default()
    };
    run_local_ranks(2, None, |_rank, group| {
        let mut e = Engine::new(&small_spec()?, &group, &options())?;
        e.write_param(0, 0, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
        let written = e.read_param(0, 0, 6)?;
        e.set_lr(0.0)?;
        engine_step(&mut e, 1.0)?;
        let b0 = e.read_param(0, 1, 3)?;
        e.set_lr(0.1)?;
        let lr = e.lr()?;
        engine_step(&mut e, 1.0)?;
        let b1 = e.read_param(0, 1, 3)?;
        let w1 = e.read_param(0, 0, 6)?;
        let steps = e.steps()?;
        e.save_checkpoint(&dir)?;
        e.pre_forward(0)?;
        let bf16_view = e.param_as::<Bf16>(0, 0).map(|_| ()).map_err(|err| err.code);
        let f32_len = e.param_as::<f32>(0, 0).map(|v| v.len());
        e.post_forward(0)?;
        seen.lock().unwrap().push((written, b0, lr, b1, w1, steps, bf16_view, f32_len?));
        Ok(())
    })
    .unwrap();
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 2);
    for (written, b0, lr, b1, w1, steps, bf16_view, f32_len) in &seen {
        assert_eq!(*written, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(*b0, vec![0.0; 3], "a step at lr 0 moved b");
        assert_eq!(*lr, 0.1);
        // b: no decay; w: SGD's L2 decay 0.5.
        for x in b1 {
            assert!((x + 0.1).abs() < 1e-7, "{:?}", b1);
        }
        assert!((w1[0] - (1.0 - 0.1 * (1.0 + 0.5))).abs() < 1e-6, "{:?}", w1);
        assert_eq!(*steps, 2);
        assert_eq!(*bf16_view, Err(sys::SK_STATUS_INVALID_ARGUMENT));
        assert_eq!(*f32_len, 6);
    }
    let groups = ProcessGroup::local(1, None).unwrap();
    let mut e = Engine::new(&small_spec().unwrap(), &groups[0], &options()).unwrap();
    assert_eq!(e.load_checkpoint(&dir).unwrap(), 2);
    assert_eq!(e.steps().unwrap(), 2);
    assert_eq!(e.read_param(0, 0, 6).unwrap(), seen[0].4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_session_follows_warmup_and_cosine_and_set_lr_overrides_it() {
    let options = TrainerOptions { lr_schedule: Some(LrSchedule::warmup_cosine(2, 2, 1e-4)), ..tiny() };
    let mut s = LocalSession::new(&options, 2, None).unwrap();
    let lrs: Vec<f32> = (0..5).map(|_| s.step().unwrap().lr).collect();
    let want = [5e-4f32, 1e-3, 1e-3, 5.5e-4, 1e-4];
    for (got, want) in lrs.iter().zip(&want) {
        assert!((got - want).abs() < 1e-9, "{:?}", lrs);
    }
    s.set_lr(0.0).unwrap();
    assert_eq!(s.step().unwrap().lr, 0.0);
    let bad = TrainerOptions { lr_schedule: Some(LrSchedule::warmup_linear(0, 0, 0.0)), ..tiny() };
    let e = LocalSession::new(&bad, 1, None).unwrap_err();
    assert!(e.message.contains("decay_steps"), "{}", e);
}

#[test]
fn custom_step_runs_an_update_rule_of_ones_own_on_the_shards() {
    let groups = ProcessGroup::local(1, None).unwrap();
    let options = EngineOptions {
        optimizer: OptimizerOptions { kind: sys::SK_OPTIMIZER_SGD, momentum: 0.9, ..Default::default() },
        ..Default::default()
    };
    let mut e = Engine::new(&small_spec().unwrap(), &groups[0], &options).unwrap();
    let b0 = e.read_param(0, 1, 3).unwrap();
    assert_eq!(e.custom_step(|_| Ok(())).unwrap_err().code, sys::SK_STATUS_FAILED_PRECONDITION);
    e.zero_grad().unwrap();
    e.pre_forward(0).unwrap();
    e.post_forward(0).unwrap();
    e.pre_backward(0).unwrap();
    for p in 0..2 {
        for x in e.grad(0, p).unwrap().iter_mut() {
            *x += 1.0;
        }
    }
    e.post_backward(0).unwrap();
    e.finish_backward().unwrap();
    // Lion's sign update with its momentum in the optimizer's state.
    e.custom_step(|shard| {
        assert_eq!(shard.state.len(), 1);
        let shardkit::CustomShard { master, grad, mut state, .. } = shard;
        for i in 0..master.len() {
            let c = 0.9 * state[0][i] + 0.1 * grad[i];
            master[i] -= 0.25 * c.signum() * (c != 0.0) as i32 as f32;
            state[0][i] = 0.99 * state[0][i] + 0.01 * grad[i];
        }
        Ok(())
    })
    .unwrap();
    let b1 = e.read_param(0, 1, 3).unwrap();
    for i in 0..3 {
        assert_eq!(b1[i], b0[i] - 0.25);
    }
    assert_eq!(e.steps().unwrap(), 1);
}

#[test]
fn a_custom_rule_reads_the_layout_declares_its_state_and_calls_collectives_on_the_engines_group() {
    // NO_SHARD over 2 ranks: each rank holds shard 0 of 1 (not shard `rank`);
    // the rule halves "fc.w" by name, so fc.b must not move on any rank.
    let seen = std::sync::Mutex::new(Vec::new());
    run_local_ranks(2, None, |rank, group| {
        let options = EngineOptions {
            fsdp: FsdpOptions { strategy: sys::SK_SHARDING_NO_SHARD, ..Default::default() },
            custom_optimizer: Some(CustomOptimizer { name: "lion".to_string(), state_names: vec!["exp_avg".to_string()] }),
            ..Default::default()
        };
        let dyn_group: &dyn Group = &group;
        let mut e = Engine::new(&small_spec()?, dyn_group, &options)?;
        // Collectives on the &dyn Group the engine was given: i64, f64, f32.
        let mut count = [(1i64 << 40) + rank as i64];
        dyn_group.all_reduce(&mut count, ReduceOp::Sum)?;
        let mut low = [0.5f64 + rank as f64];
        dyn_group.all_reduce(&mut low, ReduceOp::Min)?;
        let gathered = dyn_group.all_gather(&[rank])?;
        let layout = e.shard_layout(0)?;
        let w0 = e.read_param(0, 0, 6)?;
        let b0 = e.read_param(0, 1, 3)?;
        let builtin = engine_step(&mut e, 1.0).unwrap_err().code;
        e.custom_step(|shard| {
            let shardkit::CustomShard { master, state, layout, .. } = shard;
            assert_eq!(state.len(), 1);
            for p in layout.pieces.iter().filter(|p| p.name == "fc.w") {
                for i in 0..p.numel {
                    master[(p.shard_offset + i) as usize] *= 0.5;
                }
            }
            Ok(())
        })?;
        let w1 = e.read_param(0, 0, 6)?;
        let b1 = e.read_param(0, 1, 3)?;
        seen.lock().unwrap().push((count[0], low[0], gathered, layout, builtin, w0, w1, b0, b1));
        Ok(())
    })
    .unwrap();
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 2);
    for (count, low, gathered, layout, builtin, w0, w1, b0, b1) in &seen {
        assert_eq!(*count, (2i64 << 40) + 1);
        assert_eq!(*low, 0.5);
        assert_eq!(*gathered, vec![0, 1]);
        assert_eq!((layout.shard_index, layout.num_shards), (0, 1));
        let names: Vec<&str> = layout.pieces.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["fc.w", "fc.b"]);
        assert_eq!(layout.pieces[0].shape, vec![2, 3]);
        assert_eq!((layout.pieces[1].numel, layout.pieces[1].param_offset), (3, 0));
        assert_eq!(*builtin, sys::SK_STATUS_FAILED_PRECONDITION);
        let half: Vec<f32> = w0.iter().map(|x| x * 0.5).collect();
        assert_eq!(*w1, half);
        assert_eq!(b1, b0);
    }
    let groups = ProcessGroup::local(1, None).unwrap();
    let bad = EngineOptions {
        custom_optimizer: Some(CustomOptimizer { name: "SGD".to_string(), state_names: vec![] }),
        ..Default::default()
    };
    let e = Engine::new(&small_spec().unwrap(), &groups[0], &bad).unwrap_err();
    assert_eq!(e.code, sys::SK_STATUS_INVALID_ARGUMENT);
    assert!(e.message.contains("built-in"), "{}", e);
}

#[test]
fn skip_nonfinite_steps_returns_the_skipped_step() {
    let options = TrainerOptions { skip_nonfinite_steps: true, ..tiny() };
    let mut s = LocalSession::new(&options, 1, None).unwrap();
    s.set_lr(f32::MAX).unwrap();
    let skipped = (0..4).map(|_| s.step().unwrap()).any(|m| m.skipped != 0);
    assert!(skipped, "no step at lr f32::MAX was skipped");
}
