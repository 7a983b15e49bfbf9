//! The low-level API through the Rust frontend: a linear regression computed
//! here on gathered parameters (same arithmetic and output as
//! examples/c/linear_regression.c).
use shardkit::{sys, Engine, EngineOptions, FsdpOptions, ModelSpec, OptimizerOptions, ParamSpec, ProcessGroup};

const FEATURES: usize = 4;
const BATCH: usize = 8;
const STEPS: i32 = 20;

fn feature(step: i32, i: usize, j: usize) -> f64 {
    ((step as usize * 5 + i * 3 + j * 7) % 11) as f64 / 5.0 - 1.0
}

fn target(step: i32, i: usize) -> f64 {
    let w = [0.5, -1.0, 2.0, 0.25];
    let mut y = 0.0;
    for (j, wj) in w.iter().enumerate() {
        y += wj * feature(step, i, j);
    }
    y + 0.3
}

fn main() -> Result<(), shardkit::Error> {
    let mut spec = ModelSpec::new()?;
    let unit = spec.add_unit("linear")?;
    spec.add_param(unit, &ParamSpec { name: "w", shape: &[FEATURES as i64], init: sys::SK_INIT_NORMAL, init_a: 0.0, init_b: 0.5 })?;
    spec.add_param(unit, &ParamSpec { name: "b", shape: &[1], init: sys::SK_INIT_ZEROS, init_a: 0.0, init_b: 0.0 })?;
    let groups = ProcessGroup::local(1, None)?;
    let options = EngineOptions {
        fsdp: FsdpOptions { seed: 42, ..Default::default() },
        optimizer: OptimizerOptions { kind: sys::SK_OPTIMIZER_SGD, lr: 0.05, ..Default::default() },
        ..Default::default()
    };
    let mut engine = Engine::new(&spec, &groups[0], &options)?;
    drop(spec);
    drop(groups);

    for step in 0..STEPS {
        engine.zero_grad()?;
        let mut err = [0.0f64; BATCH];
        let mut loss = 0.0f64;
        engine.pre_forward(unit)?;
        {
            let w = engine.param(unit, 0)?;
            let b = engine.param(unit, 1)?;
            for (i, e) in err.iter_mut().enumerate() {
                let mut pred = 0.0f64;
                for (j, wj) in w.iter().enumerate() {
                    pred += *wj as f64 * feature(step, i, j);
                }
                pred += b[0] as f64;
                *e = pred - target(step, i);
                loss += *e * *e;
            }
        }
        loss /= BATCH as f64;
        engine.post_forward(unit)?;
        engine.pre_backward(unit)?;
        {
            let gw = engine.grad(unit, 0)?;
            for (j, g_j) in gw.iter_mut().enumerate() {
                let mut g = 0.0f64;
                for (i, e) in err.iter().enumerate() {
                    g += e * feature(step, i, j);
                }
                *g_j = (*g_j as f64 + g * (2.0 / BATCH as f64)) as f32;
            }
        }
        {
            let gb = engine.grad(unit, 1)?;
            let mut g = 0.0f64;
            for e in err.iter() {
                g += e;
            }
            gb[0] = (gb[0] as f64 + g * (2.0 / BATCH as f64)) as f32;
        }
        engine.post_backward(unit)?;
        engine.finish_backward()?;
        engine.optimizer_step()?;
        let loss32 = loss as f32;
        println!("step {} loss {:.6} bits 0x{:08x}", step + 1, loss32, loss32.to_bits());
    }
    let w = engine.read_param(unit, 0, FEATURES)?;
    println!("w {:.4} {:.4} {:.4} {:.4}", w[0], w[1], w[2], w[3]);
    Ok(())
}
