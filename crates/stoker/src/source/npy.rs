//! `.npy` bytes for array values of formats that store arrays as typed columns (Parquet lists,
//! MDS `ndarray`, LitData numpy/tensor leaves): `numpy.load(io.BytesIO(b))` gives the array
//! back, and the bytes equal what `numpy.save` writes for it.

/// An `.npy` file holding `data` (C order, already in the byte order `descr` names, e.g.
/// `<f4`, `|u1`) with `shape`. The header is laid out as numpy lays it out: a Python dict
/// literal padded with spaces to a multiple of 64 bytes, ending in a newline; format 1.0,
/// or 2.0 (a 4-byte header length) when the header is over 1.0's 65,535 bytes, as numpy
/// chooses (an array of some 20,000 dimensions; the length written in 1.0's two bytes was cut).
pub(crate) fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!("({})", shape.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    // Magic (6) + version (2) + length (2, or 4 in 2.0) + header + '\n', rounded up to 64.
    let padded = |prefix: usize| (prefix + header.len() + 1).next_multiple_of(64) - prefix;
    let v1 = u16::try_from(padded(10)).ok();
    let prefix = if v1.is_some() { 10 } else { 12 };
    let unpadded = prefix + header.len() + 1;
    header.extend(std::iter::repeat_n(' ', unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(prefix + header.len() + data.len());
    match v1 {
        Some(len) => {
            out.extend_from_slice(b"\x93NUMPY\x01\x00");
            out.extend_from_slice(&len.to_le_bytes());
        }
        None => {
            out.extend_from_slice(b"\x93NUMPY\x02\x00");
            out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        }
    }
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}
