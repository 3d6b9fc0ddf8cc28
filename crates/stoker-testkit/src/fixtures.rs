//! Test data every crate shares, so a fixture is written once.

/// Sample `i`'s bytes, `len` of them, into `out` (cleared first): distinct per sample and
/// incompressible (splitmix64), so no layer can shortcut them, and a reader can check what it got.
pub fn payload_into(i: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(len);
    let mut x = i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    while out.len() < len {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let take = (len - out.len()).min(8);
        out.extend_from_slice(&z.to_le_bytes()[..take]);
    }
}

/// Sample `i`'s bytes, `len` of them (see [`payload_into`]).
pub fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    payload_into(i, len, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_deterministic_distinct_and_sized() {
        assert_eq!(payload(3, 100), payload(3, 100));
        assert_ne!(payload(3, 100), payload(4, 100));
        assert_eq!(payload(7, 13).len(), 13);
        assert!(payload(0, 0).is_empty());
        // A prefix of a longer payload: readers may check a truncated read against it.
        assert_eq!(payload(9, 20)[..11], payload(9, 11)[..]);
    }
}
