//! examples/c/framework.c in Rust: a framework's own model (a 2-layer MLP
//! regression) on the engine, FULL_SHARD over the ranks, with warmup +
//! cosine, a no-decay group, the loss averaged across ranks and a sharded
//! checkpoint with the step. Same arithmetic and output as the C program.
//!   framework STEPS [SAVE_AT DIR | resume DIR]
//! One process per rank over gloo when WORLD_SIZE is set (the launcher),
//! else a one-rank local group.
use shardkit::{sys, Engine, EngineOptions, FsdpOptions, Group, ModelSpec, OptimizerOptions, ParamGroup, ParamSpec, ProcessGroup};

const IN: usize = 4;
const HIDDEN: usize = 8;
const GLOBAL_BATCH: usize = 8;
const BASE_LR: f32 = 0.05;
const MIN_LR: f32 = 0.005;
const WARMUP: i64 = 3;
const DECAY: i64 = 12;

/// Warmup then cosine decay (sk_lr_schedule's COSINE formula).
fn lr_at(step: i64) -> f32 {
    if step < WARMUP {
        return BASE_LR * (step + 1) as f32 / WARMUP as f32;
    }
    let p = ((step - WARMUP) as f64 / DECAY as f64).min(1.0);
    (MIN_LR as f64 + (BASE_LR - MIN_LR) as f64 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())) as f32
}

/// Sample i of step s, the same for every world size.
fn sample(s: i64, i: usize) -> ([f32; IN], f32) {
    let mut x = [0.0f32; IN];
    for (k, xk) in x.iter_mut().enumerate() {
        let h = ((s * 7919 + i as i64 * 104729 + k as i64 * 1299709) as u32).wrapping_mul(2654435761u32);
        *xk = ((h >> 8) & 0xffff) as f32 / 32768.0 - 1.0;
    }
    let y = (x[0] + 2.0 * x[1]).sin() - x[2] * x[3];
    (x, y)
}

fn main() -> Result<(), shardkit::Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 2 && args.len() != 4 {
        eprintln!("usage: {} STEPS [SAVE_AT DIR | resume DIR]", args[0]);
        std::process::exit(2);
    }
    let steps: i64 = args[1].parse().expect("STEPS");
    let resume = args.len() == 4 && args[2] == "resume";
    let save_at: i64 = if args.len() == 4 && !resume { args[2].parse().expect("SAVE_AT") } else { -1 };
    let dir = args.get(3).cloned();

    let group = if std::env::var_os("WORLD_SIZE").is_some() {
        ProcessGroup::gloo_from_env()?
    } else {
        ProcessGroup::local(1, None)?.remove(0)
    };
    let (rank, world) = (group.rank()? as usize, group.size()? as usize);
    assert_eq!(GLOBAL_BATCH % world, 0, "the world size must divide {}", GLOBAL_BATCH);
    let local_batch = GLOBAL_BATCH / world;

    let mut spec = ModelSpec::new()?;
    let fc1 = spec.add_unit("fc1")?;
    spec.add_param(fc1, &ParamSpec { name: "w", shape: &[IN as i64, HIDDEN as i64], init: sys::SK_INIT_NORMAL, init_a: 0.0, init_b: 0.5 })?;
    spec.add_param(fc1, &ParamSpec { name: "b", shape: &[HIDDEN as i64], init: sys::SK_INIT_ZEROS, init_a: 0.0, init_b: 0.0 })?;
    let fc2 = spec.add_unit("fc2")?;
    spec.add_param(fc2, &ParamSpec { name: "w", shape: &[HIDDEN as i64, 1], init: sys::SK_INIT_NORMAL, init_a: 0.0, init_b: 0.35 })?;
    spec.add_param(fc2, &ParamSpec { name: "b", shape: &[1], init: sys::SK_INIT_ZEROS, init_a: 0.0, init_b: 0.0 })?;
    let options = EngineOptions {
        fsdp: FsdpOptions { strategy: sys::SK_SHARDING_FULL_SHARD, seed: 42, ..Default::default() },
        optimizer: OptimizerOptions { kind: sys::SK_OPTIMIZER_ADAMW, weight_decay: 0.1, ..Default::default() },
        param_groups: vec![ParamGroup::no_decay()], // the biases: weight decay 0
        ..Default::default()
    };
    let mut e = Engine::new(&spec, &group, &options)?;

    let mut step = 0i64;
    if resume {
        step = e.load_checkpoint(dir.as_ref().unwrap())?;
        if rank == 0 {
            println!("resumed at step {} from {}", step, dir.as_ref().unwrap());
        }
    }
    while step < steps {
        e.set_lr(lr_at(step))?;
        e.zero_grad()?;
        let batch: Vec<([f32; IN], f32)> = (0..local_batch).map(|i| sample(step, rank * local_batch + i)).collect();

        // Forward: h = tanh(x w1 + b1), out = h w2 + b2.
        e.pre_forward(fc1)?;
        let h: Vec<[f32; HIDDEN]> = {
            let (w, b) = (e.param(fc1, 0)?, e.param(fc1, 1)?);
            batch
                .iter()
                .map(|(x, _)| {
                    let mut h = [0.0f32; HIDDEN];
                    for j in 0..HIDDEN {
                        let mut a = b[j];
                        for k in 0..IN {
                            a += x[k] * w[k * HIDDEN + j];
                        }
                        h[j] = a.tanh();
                    }
                    h
                })
                .collect()
        };
        e.post_forward(fc1)?;
        e.pre_forward(fc2)?;
        let out: Vec<f32> = {
            let (w, b) = (e.param(fc2, 0)?, e.param(fc2, 1)?);
            h.iter()
                .map(|hi| {
                    let mut o = b[0];
                    for j in 0..HIDDEN {
                        o += hi[j] * w[j];
                    }
                    o
                })
                .collect()
        };
        let mut loss = 0.0f32;
        for (o, (_, y)) in out.iter().zip(&batch) {
            loss += (o - y) * (o - y) / local_batch as f32;
        }
        e.post_forward(fc2)?;

        // Backward of this rank's mean squared error; FSDP averages over ranks.
        let dout: Vec<f32> = out.iter().zip(&batch).map(|(o, (_, y))| 2.0 * (o - y) / local_batch as f32).collect();
        e.pre_backward(fc2)?;
        let w2: Vec<f32> = e.param(fc2, 0)?.to_vec();
        let mut dh = vec![[0.0f32; HIDDEN]; local_batch];
        for i in 0..local_batch {
            e.grad(fc2, 1)?[0] += dout[i]; // gradients are ADDED into the views
            let gw = e.grad(fc2, 0)?;
            for j in 0..HIDDEN {
                gw[j] += h[i][j] * dout[i];
                dh[i][j] = dout[i] * w2[j] * (1.0 - h[i][j] * h[i][j]);
            }
        }
        e.post_backward(fc2)?;
        e.pre_backward(fc1)?;
        for i in 0..local_batch {
            {
                let gb = e.grad(fc1, 1)?;
                for j in 0..HIDDEN {
                    gb[j] += dh[i][j];
                }
            }
            let gw = e.grad(fc1, 0)?;
            for j in 0..HIDDEN {
                for k in 0..IN {
                    gw[k * HIDDEN + j] += batch[i].0[k] * dh[i][j];
                }
            }
        }
        e.post_backward(fc1)?;
        e.finish_backward()?;
        e.optimizer_step()?;

        // The loss of the global batch: the mean of the ranks' (equal) batches.
        let loss = group.mean(loss)?;
        if rank == 0 {
            println!("step {} lr {:.6} loss {:.6}", step + 1, lr_at(step), loss);
        }
        step += 1;
        if step == save_at {
            e.save_checkpoint(dir.as_ref().unwrap())?;
            if rank == 0 {
                println!("saved step {} to {}", save_at, dir.as_ref().unwrap());
            }
        }
    }
    Ok(())
}
