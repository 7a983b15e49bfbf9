//! examples/c/finetune.c in Rust (docs/finetune.md): import a Hugging Face
//! directory, fine-tune it on a JSONL whose prompt tokens are labelled -100,
//! evaluate on a held-out JSONL, export a directory transformers loads. One
//! process per rank over gloo; same settings and output as the C program.
//!   launch --nproc_per_node=2 --master_port=0 \
//!       target/debug/examples/finetune MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR
use shardkit::{sys, Dataset, Group, LrSchedule, OptimizerOptions, ProcessGroup, Trainer, TrainerOptions, WeightLayout};

fn print_loss(what: &str, loss: f32) {
    println!("{} loss {} bits 0x{:08x}", what, g9(loss), loss.to_bits());
}

/// C's "%.9g" of an f32 (widened to f64, as printf does).
fn g9(x: f32) -> String {
    let v = x as f64;
    let exp = if v == 0.0 { 0 } else { v.abs().log10().floor() as i32 };
    if (-4..9).contains(&exp) {
        let s = format!("{:.*}", (8 - exp).max(0) as usize, v);
        if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
    } else {
        format!("{:.8e}", v)
    }
}

fn main() -> Result<(), shardkit::Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: {} MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR", args[0]);
        std::process::exit(2);
    }
    let model_dir = &args[1];
    let mut out_dir = args[4].clone();
    if !out_dir.ends_with('/') {
        out_dir.push('/'); // written as a directory
    }

    let group = ProcessGroup::gloo_from_env()?; // RANK, WORLD_SIZE, ...
    let rank = group.rank()?;
    let options = TrainerOptions {
        model: Some(model_dir.clone()), // its config.json gives the shape
        optimizer: OptimizerOptions {
            kind: sys::SK_OPTIMIZER_ADAMW,
            lr: 5e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            ..Default::default()
        },
        lr_schedule: Some(LrSchedule::warmup_cosine(2, 6, 5e-4)),
        batch_size: 2, // rows per rank per step
        seq_len: 16,
        clip_grad_norm: 1.0,
        skip_init: true, // no random weights: the load below brings them
        dataset: Some(Dataset {
            paths: vec![args[2].clone().into()], // input_ids + labels (-100 = not trained)
            format: sys::SK_DATASET_FORMAT_JSONL,
            sequential: true, // file order
            eval_paths: vec![args[3].clone().into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut trainer = Trainer::new(&options, &group)?;
    trainer.load_state_dict(model_dir, WeightLayout::HfLlama)?;
    let eval = trainer.evaluate(1000)?; // one pass over the eval file
    if rank == 0 {
        print_loss("eval before", eval);
    }
    for step in 1..=8 {
        let m = trainer.step()?;
        if rank == 0 {
            print_loss(&format!("step {}", step), m.global_loss);
        }
    }
    let eval = trainer.evaluate(1000)?;
    if rank == 0 {
        print_loss("eval after", eval);
    }
    trainer.save_state_dict(&out_dir, WeightLayout::HfLlama)?;
    Ok(())
}
