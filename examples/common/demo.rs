//! Demo data shared by the examples: deterministic payloads written as WebDataset tar shards
//! (and optionally one file per sample), so every example runs without a dataset at hand.

use std::path::Path;

/// The bytes of sample `i`: deterministic, so a reader can check what it got.
pub fn payload(i: usize, len: usize) -> Vec<u8> {
    stoker_testkit::fixtures::payload(i as u64, len)
}

/// Write `n` samples of `size` bytes (`NNNNNNNNN.bin` plus a `.cls` label) as tar shards of
/// about 256 MiB under `out/tar/`, and with `objects` also one file per sample under
/// `out/objects/`.
pub fn write(out: &Path, n: usize, size: usize, objects: bool) -> std::io::Result<()> {
    let per_shard = ((256 << 20) / (size + 1024)).max(1);
    std::fs::create_dir_all(out.join("tar"))?;
    if objects {
        std::fs::create_dir_all(out.join("objects"))?;
    }
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
            if objects {
                std::fs::write(out.join(format!("objects/{i:09}.bin")), &data)?;
            }
        }
        b.into_inner()?;
    }
    Ok(())
}
