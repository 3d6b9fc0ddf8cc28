//! `.npy` bytes for array values of formats that store arrays as typed columns (Parquet lists,
//! MDS `ndarray`, LitData numpy/tensor leaves): `numpy.load(io.BytesIO(b))` gives the array
//! back, and the bytes equal what `numpy.save` writes for it.

/// An `.npy` (format 1.0) file holding `data` (C order, already in the byte order `descr`
/// names, e.g. `<f4`, `|u1`) with `shape`. The header is laid out as numpy lays it out: a
/// Python dict literal padded with spaces to a multiple of 64 bytes, ending in a newline.
pub(crate) fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!("({})", shape.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n', rounded up to 64.
    let unpadded = 10 + header.len() + 1;
    header.extend(std::iter::repeat_n(' ', unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_numpys_and_parse_back() {
        // numpy.save(b, np.arange(3, dtype='<f4')) starts exactly so.
        let b = npy("<f4", &[3], &[0u8; 12]);
        let want = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
        assert_eq!(&b[..want.len()], want);
        assert_eq!((b.len() - 12) % 64, 0);
        assert_eq!(b[b.len() - 13], b'\n');
        for (shape, n) in [(vec![2usize, 3], 6usize), (vec![], 1), (vec![0], 0)] {
            let b = npy("<i8", &shape, &vec![1u8; n * 8]);
            let h = crate::decode::parse_npy(&b).unwrap();
            assert_eq!(h.shape, shape);
            assert_eq!(h.data_offset % 64, 0);
            assert_eq!(b.len() - h.data_offset, n * 8);
        }
    }
}
