//! Write a demo dataset: the same samples as WebDataset tar shards and as one file per
//! sample, ready to upload to a bucket (the docker-compose MinIO recipe uses it).
//!
//! ```text
//! cargo run --release -p stoker-examples --example make_demo -- OUT_DIR [--samples 16384] [--size 65536]
//! ```

use std::path::PathBuf;

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
    let per_shard = ((256 << 20) / (size + 1024)).max(1);
    let run = || -> std::io::Result<()> {
        std::fs::create_dir_all(out.join("tar"))?;
        std::fs::create_dir_all(out.join("objects"))?;
        for (s, chunk) in (0..n).collect::<Vec<_>>().chunks(per_shard).enumerate() {
            let file = std::fs::File::create(out.join(format!("tar/shard-{s:06}.tar")))?;
            let mut b = tar::Builder::new(std::io::BufWriter::new(file));
            for &i in chunk {
                let data = payload(i, size);
                let mut h = tar::Header::new_gnu();
                h.set_size(size as u64);
                h.set_mode(0o644);
                b.append_data(&mut h, format!("{i:09}.bin"), &data[..])?;
                let mut c = tar::Header::new_gnu();
                let label = format!("{}", i % 1000);
                c.set_size(label.len() as u64);
                c.set_mode(0o644);
                b.append_data(&mut c, format!("{i:09}.cls"), label.as_bytes())?;
                std::fs::write(out.join(format!("objects/{i:09}.bin")), &data)?;
            }
            b.into_inner()?;
        }
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("error: writing the demo dataset to {}: {e}", out.display());
        std::process::exit(1);
    }
    println!("wrote {n} samples of {size} bytes to {} (tar/ and objects/)", out.display());
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    let seed = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len).map(|j| (seed.rotate_left((j % 64) as u32) as u8) ^ (j as u8)).collect()
}
