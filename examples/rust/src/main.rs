//! examples/rust: stream a greedy completion through the safe wrapper of src/vllm.rs.
//!
//!   make build/libvllm.so
//!   cargo run --manifest-path examples/rust/Cargo.toml -- MODEL.gguf "The capital of France is"

mod vllm;

use std::io::Write;
use std::process::ExitCode;

const FINISH_REASONS: [&str; 6] = [
    "none", "stop", "length", "abort", "error", "repetition",
];

/// Streams the completion to stdout; returns (tokens, finish reason).
fn run(model: &str, prompt: &str) -> Result<(usize, &'static str), vllm::Error> {
    let engine = vllm::Engine::new(model, 1024)?;
    let (mut tokens, mut reason) = (0, "none");
    for event in engine.generate("rust-0", prompt, 32)? {
        let event = event?;
        print!("{}", event.text);
        std::io::stdout().flush().ok();
        tokens += event.token_ids.len();
        if event.finished {
            reason = FINISH_REASONS
                .get(event.finish_reason as usize)
                .copied()
                .unwrap_or("?");
        }
    }
    engine.check_health()?;
    Ok((tokens, reason))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: {} MODEL.gguf PROMPT", args[0]);
        return ExitCode::from(2);
    }
    let result = run(&args[1], &args[2]); // the engine is dropped (freed) inside run
    vllm::shutdown();
    match result {
        Ok((tokens, reason)) => {
            println!("\n[{tokens} tokens, finish={reason}]");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
