#![no_main]

use stoker::store::ranges::{check, Policy};

// Input: gap, cap and part size (one u16 each, 0 meaning "none" for the cap), then ranges
// as (start, length) u16 pairs scaled by the first byte: small numbers make merges, overlaps
// and repeats likely; a scale near the top tests the arithmetic at u64's end.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<7>() else { return };
    let word = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]) as u64;
    let base = if head[0] >= 0xf0 { u64::MAX - (1 << 20) } else { 0 };
    let gap = if word(1) == 0xffff { u64::MAX } else { word(1) };
    let cap = if word(3) == 0 { u64::MAX } else { word(3) };
    let part = word(5).max(1);
    let ranges: Vec<_> = rest
        .chunks_exact(4)
        .map(|c| {
            let start = base + u16::from_le_bytes([c[0], c[1]]) as u64;
            start..start.saturating_add(u16::from_le_bytes([c[2], c[3]]) as u64 % 4096)
        })
        .collect();
    check(&ranges, &Policy::new(gap, cap), part);
});
