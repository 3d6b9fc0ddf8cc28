//! Write a demo dataset: the same samples as WebDataset tar shards and as one file per
//! sample, ready to upload to a bucket (the docker-compose MinIO recipe uses it).
//!
//! ```text
//! cargo run --release -p stoker-examples --example make_demo -- OUT_DIR [--samples 16384] [--size 65536]
//! ```

use std::path::PathBuf;

#[path = "common/demo.rs"]
mod demo;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let Some(out) = args.first().filter(|a| !a.starts_with("--")).map(PathBuf::from) else {
        eprintln!("usage: make_demo OUT_DIR [--samples 16384] [--size 65536]");
        std::process::exit(2);
    };
    let (n, size) = (value("--samples", 16384), value("--size", 65536));
    let run = || demo::write(&out, n, size, true);
    if let Err(e) = run() {
        eprintln!("error: writing the demo dataset to {}: {e}", out.display());
        std::process::exit(1);
    }
    println!("wrote {n} samples of {size} bytes to {} (tar/ and objects/)", out.display());
}
