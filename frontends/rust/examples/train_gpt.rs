//! Trains gpt-tiny with FULL_SHARD on 2 local ranks through the Rust
//! frontend (same settings and output as examples/c/train_gpt.c).
use shardkit::{sys, FsdpOptions, LocalSession, OptimizerOptions, TrainerOptions};

fn main() -> Result<(), shardkit::Error> {
    let options = TrainerOptions {
        model: Some("gpt-tiny".to_string()),
        fsdp: FsdpOptions { strategy: sys::SK_SHARDING_FULL_SHARD, seed: 1234, ..Default::default() },
        optimizer: OptimizerOptions { kind: sys::SK_OPTIMIZER_ADAMW, lr: 0.01, ..Default::default() },
        batch_size: 2,
        data_seed: 7,
        data_tokens: 64,
        ..Default::default()
    };
    let mut session = LocalSession::new(&options, 2, None)?;
    for step in 1..=8 {
        let m = session.step()?;
        println!("step {} loss {:.6} bits 0x{:08x}", step, m.loss, m.loss.to_bits());
    }
    Ok(())
}
