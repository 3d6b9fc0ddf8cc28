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
