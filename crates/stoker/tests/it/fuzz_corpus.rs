//! The fuzz targets' corpora (`fuzz/corpus/TARGET`: the checked-in seeds and whatever a
//! `fuzz/run.sh` run added) replayed through the same entry points (`stoker::fuzzing`) on
//! every test run, each input with a fixed set of seeded mutations (flipped, overwritten,
//! inserted and removed bytes, cuts, splices of two inputs). An input that once broke a
//! parser stays fixed without the suite building the instrumented targets; the coverage-guided
//! search is `fuzz/run.sh` (fuzz/README.md).

use std::path::{Path, PathBuf};

use stoker_testkit::rng::XorShift64;

/// Mutations tried per corpus input (the checked-in corpora hold 2 to 12 inputs each).
const MUTATIONS: usize = 600;
/// Cases a target runs at most: a corpus a long `fuzz/run.sh` grew in a working tree (tens
/// of thousands of inputs, not committed) is sampled evenly, with fewer mutations each.
const MAX_CASES: usize = 8000;

/// The inputs of a target's corpus in name order (an empty input where it has none: the
/// mutations then build inputs from nothing), thinned evenly to at most `MAX_CASES / 4`.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    if files.is_empty() {
        return vec![(dir.join("(none)"), Vec::new())];
    }
    let stride = files.len().div_ceil(MAX_CASES / 4);
    files.into_iter().step_by(stride).map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

/// One mutation of `input`, `other` (another corpus input) for splices.
fn mutate(input: &[u8], other: &[u8], rng: &mut XorShift64) -> Vec<u8> {
    let mut m = input.to_vec();
    let at = |rng: &mut XorShift64, len: usize| if len == 0 { 0 } else { rng.up_to(len as u64 - 1) as usize };
    for _ in 0..=rng.up_to(3) {
        match rng.up_to(6) {
            0 if !m.is_empty() => {
                let i = at(rng, m.len());
                m[i] ^= 1 << rng.up_to(7);
            }
            1 if !m.is_empty() => {
                let i = at(rng, m.len());
                m[i] = [0x00, 0xff, 0x7f, 0x80, rng.next_u64() as u8][rng.up_to(4) as usize];
            }
            2 => m.truncate(at(rng, m.len() + 1)),
            3 => {
                let i = at(rng, m.len() + 1);
                let n = 1 + rng.up_to(16) as usize;
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                m.splice(i..i, bytes);
            }
            4 if !m.is_empty() => {
                let i = at(rng, m.len());
                let end = (i + 1 + rng.up_to(64) as usize).min(m.len());
                m.drain(i..end);
            }
            5 if !other.is_empty() => {
                let (i, j) = (at(rng, m.len() + 1), at(rng, other.len()));
                m.truncate(i);
                m.extend_from_slice(&other[j..]);
            }
            _ => {
                // A little-endian length or offset field set to something large.
                if m.len() >= 8 {
                    let i = at(rng, m.len() - 7);
                    m[i..i + 8].copy_from_slice(&(rng.next_u64() >> rng.up_to(63)).to_le_bytes());
                }
            }
        }
    }
    m
}

fn replay(target: &str, run: fn(&[u8])) {
    let inputs = corpus(target);
    let mutations = MUTATIONS.min(MAX_CASES / inputs.len() - 1);
    let seed = target.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let mut rng = XorShift64::new(seed);
    for (k, (path, input)) in inputs.iter().enumerate() {
        let other = &inputs[(k + 1) % inputs.len()].1;
        let mut cases = vec![input.clone()];
        cases.extend((0..mutations).map(|_| mutate(input, other, &mut rng)));
        for (n, case) in cases.iter().enumerate() {
            if std::panic::catch_unwind(|| run(case)).is_err() {
                let kept = std::env::temp_dir().join(format!("stoker-fuzz-{target}-{k}-{n}"));
                std::fs::write(&kept, case).unwrap();
                panic!(
                    "fuzz target {target} failed on {} (mutation {n}); the input is in {} (replay it with \
                     fuzz/run.sh or add it to the corpus)",
                    path.display(),
                    kept.display()
                );
            }
        }
    }
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                replay(stringify!($name), stoker::fuzzing::$name);
            }
        )*

        /// Every corpus directory has its test here.
        #[test]
        fn every_corpus_is_replayed() {
            let known = [$(stringify!($name)),*];
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
            for e in std::fs::read_dir(&root).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                assert!(known.contains(&name.as_str()), "fuzz/corpus/{name} has no replay in tests/it/fuzz_corpus.rs");
            }
        }
    };
}

targets!(
    uri,
    tar_index,
    sidecar,
    manifest,
    decode,
    resync,
    ranges,
    parquet_footer,
    records_index,
    parquet_pages,
    records_codec,
    token_index,
    tfrecord,
    hdf5,
);
