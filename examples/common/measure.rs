//! What the benchmarks measure with besides throughput.

/// User + system CPU time of this process so far (Linux `/proc/self/stat`, in clock ticks of
/// 10 ms), 0 where that is not readable.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after its closing paren.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the paren.
    f.get(10).zip(f.get(11)).map_or(0.0, |(u, s)| (u + s) / 100.0)
}

/// The median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Samples per second of one Loader epoch (epoch 0) of `src`, batches of 64.
pub async fn loader_epoch(src: std::sync::Arc<stoker::DynSampleSource>) -> Result<f64, Box<dyn std::error::Error>> {
    use futures::StreamExt;
    let loader = stoker::loader::Loader::new(src, stoker::loader::LoaderConfig::new(64))?;
    let started = std::time::Instant::now();
    let mut stream = loader.epoch(0)?;
    let mut n = 0usize;
    while let Some(b) = stream.next().await {
        n += b?.len();
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Write samples `items` (keys `{i:08}`, field `bin`, `size` patterned bytes each) as one tar
/// at `path`.
pub fn write_tar(path: &std::path::Path, items: std::ops::Range<usize>, size: usize) -> std::io::Result<()> {
    let mut b = tar::Builder::new(std::io::BufWriter::new(std::fs::File::create(path)?));
    for i in items {
        let data: Vec<u8> = (0..size).map(|j| (i * 131 + j * 7) as u8).collect();
        let mut h = tar::Header::new_gnu();
        h.set_size(size as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, format!("{i:08}.bin"), &data[..])?;
    }
    b.into_inner()?;
    Ok(())
}
