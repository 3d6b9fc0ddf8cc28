//! `.npy` bytes for array values of formats that store arrays as typed columns (Parquet lists,
//! MDS `ndarray`, LitData numpy/tensor leaves): `numpy.load(io.BytesIO(b))` gives the array
//! back, and the bytes equal what `numpy.save` writes for it.

/// An `.npy` file holding `data` (C order, already in the byte order `descr` names, e.g.
/// `<f4`, `|u1`) with `shape`, laid out as `numpy.save` lays it out: the header's dict literal,
/// numpy's spare spaces after it (21 less the digits of the first dimension, room for an
/// array grown in place), then spaces to a multiple of 64 bytes with 1 to 64 of them, and a
/// newline. Format 1.0; 2.0 (a four-byte header length) when the header does not fit 1.0's two
/// bytes, as numpy's writer chooses: a shape of thousands of dimensions, which numpy itself
/// cannot hold (at most 64), but Stoker's own reader parses.
pub(crate) fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    /// numpy's `GROWTH_AXIS_MAX_DIGITS`.
    const GROWTH: usize = 21;
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!("({})", shape.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    if let Some(first) = shape.first() {
        header.extend(std::iter::repeat_n(' ', GROWTH.saturating_sub(first.to_string().len())));
    }
    // Magic (6) + version (2) + length (2, or 4 in 2.0) + header + padding + '\n'.
    let pad = |prefix: usize| 64 - (prefix + header.len() + 1) % 64;
    let v1 = u16::try_from(header.len() + 1 + pad(10)).ok();
    let prefix = if v1.is_some() { 10 } else { 12 };
    header.extend(std::iter::repeat_n(' ', pad(prefix)));
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
