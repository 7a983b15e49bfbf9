//! examples/c/train_gpt_nccl.c in Rust: one process per GPU under the
//! launcher (or torchrun), the group over NCCL from the environment, the
//! trainer on the group's GPU (cuda:LOCAL_RANK) with bf16 parameters and f32
//! gradient reduction. Needs a libshardkit built with --config=cuda:
//!   launch --nproc_per_node=8 --master_port=0 target/debug/examples/train_gpt_nccl
//! (docs/multi_gpu.md). Rank 0 prints the global batch's loss.
use shardkit::{sys, FsdpOptions, Group, OptimizerOptions, ProcessGroup, Trainer, TrainerOptions};

fn main() -> Result<(), shardkit::Error> {
    let group = ProcessGroup::nccl_from_env()?;
    let rank = group.rank()?;
    let options = TrainerOptions {
        model: Some("gpt-tiny".to_string()),
        fsdp: FsdpOptions {
            strategy: sys::SK_SHARDING_FULL_SHARD,
            param_dtype: sys::SK_DTYPE_BF16,
            reduce_dtype: sys::SK_DTYPE_F32,
            seed: 1234,
            ..Default::default()
        },
        optimizer: OptimizerOptions { kind: sys::SK_OPTIMIZER_ADAMW, lr: 0.01, ..Default::default() },
        batch_size: 2,
        data_seed: 7,
        data_tokens: 64,
        ..Default::default() // device None: the group's GPU
    };
    let mut trainer = Trainer::new(&options, &group)?;
    for step in 1..=8 {
        let m = trainer.step()?;
        if rank == 0 {
            println!("step {} global loss {:.4}", step, m.global_loss);
        }
    }
    Ok(())
}
