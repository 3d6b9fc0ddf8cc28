//! Labels and arrays: integer text to `int64`, `.npy` to raw elements plus dtype and shape.

use super::spec::Dtype;

/// `"7"`, `" 12\n"`, `"-3"` -> the integer; anything else is an error naming what was seen.
pub fn parse_int(data: &[u8]) -> Result<i64, String> {
    let text = std::str::from_utf8(data).map_err(|_| format!("not UTF-8 text: {}", preview(data)))?;
    let t = text.trim();
    t.parse::<i64>().map_err(|_| format!("not an integer: {}", preview(data)))
}

fn preview(data: &[u8]) -> String {
    let head = &data[..data.len().min(24)];
    let more = if data.len() > head.len() { "..." } else { "" };
    format!("{:?}{more} ({} bytes)", String::from_utf8_lossy(head), data.len())
}

/// A parsed `.npy` header: what the payload holds and where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// Element type.
    pub dtype: Dtype,
    /// Whether elements are big-endian (swapped to native when copied out).
    pub big_endian: bool,
    /// Array shape (C order; Fortran order is refused).
    pub shape: Vec<usize>,
    /// Byte offset of the first element.
    pub data_offset: usize,
}

impl NpyHeader {
    /// Payload bytes the header promises.
    pub fn data_bytes(&self) -> Option<usize> {
        self.shape.iter().try_fold(self.dtype.size(), |acc, &d| acc.checked_mul(d))
    }
}

/// Parse the header of a `.npy` file (format versions 1, 2 and 3).
pub fn parse_npy(data: &[u8]) -> Result<NpyHeader, String> {
    let (header, end) = crate::npy::header_text(data)?;
    let dict = crate::npy::parse_dict(header).map_err(|e| format!("the .npy header: {e}"))?;
    if dict.fortran_order {
        return Err("Fortran-order .npy arrays are not supported; save with np.ascontiguousarray".into());
    }
    let shape = dict
        .shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("bad .npy shape entry '{d}'")))
        .collect::<Result<Vec<usize>, String>>()?;
    let descr = dict.descr.as_str();
    let (order, code) = match descr.as_bytes().first() {
        Some(b'<' | b'|' | b'=') => (false, &descr[1..]),
        Some(b'>') => (true, &descr[1..]),
        _ => (false, descr),
    };
    let dtype = match code {
        "b1" => Dtype::Bool,
        "u1" => Dtype::U8,
        "i1" => Dtype::I8,
        "u2" => Dtype::U16,
        "i2" => Dtype::I16,
        "u4" => Dtype::U32,
        "i4" => Dtype::I32,
        "u8" => Dtype::U64,
        "i8" => Dtype::I64,
        "f2" => Dtype::F16,
        "f4" => Dtype::F32,
        "f8" => Dtype::F64,
        other => return Err(format!(".npy dtype '{other}' is not supported (bool, int, uint and float are)")),
    };
    let h = NpyHeader { dtype, big_endian: order && dtype.size() > 1, shape, data_offset: end };
    let want = h.data_bytes().ok_or("the .npy shape overflows")?;
    // A zero anywhere makes the product 0 whatever the rest: each extent must still be one a
    // tensor can have (DLPack's are i64; one past it became a negative dimension in torch),
    // and so must the product of the others.
    let nonzero = h.shape.iter().filter(|&&d| d > 0).try_fold(1usize, |a, &d| a.checked_mul(d));
    if nonzero.is_none_or(|n| n > i64::MAX as usize) {
        return Err(format!("the .npy shape {:?} has more elements than a tensor can", h.shape));
    }
    let have = data.len() - end;
    if have != want {
        return Err(format!("the .npy payload has {have} bytes but its header promises {want}"));
    }
    Ok(h)
}

/// Copy the payload of a parsed `.npy` into `out`, swapping to native byte order if needed.
pub(super) fn copy_npy(h: &NpyHeader, data: &[u8], out: &mut [u8]) {
    let src = &data[h.data_offset..];
    out.copy_from_slice(src);
    let size = h.dtype.size();
    if h.big_endian == cfg!(target_endian = "little") && size > 1 {
        for e in out.chunks_exact_mut(size) {
            e.reverse();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    /// The `.npy` bytes the formats' array columns become parse back here.
    fn headers_written_by_sources_are_numpys_and_parse_back() {
        // numpy.save(b, np.arange(3, dtype='<f4')) starts exactly so.
        let b = crate::source::npy::npy("<f4", &[3], &[0u8; 12]);
        let want = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
        assert_eq!(&b[..want.len()], want);
        assert_eq!((b.len() - 12) % 64, 0);
        assert_eq!(b[b.len() - 13], b'\n');
        // Where the data starts, as `numpy.save` of float32 zeros puts it (numpy 2.x): its
        // spare spaces after the dict and its 1 to 64 bytes of padding.
        for (shape, offset) in [(vec![3usize], 128), (vec![1; 15], 192), (vec![2, 3], 128), (vec![], 128)] {
            let b = crate::source::npy::npy("<f4", &shape, &vec![0u8; shape.iter().product::<usize>() * 4]);
            assert_eq!(parse_npy(&b).unwrap().data_offset, offset, "{shape:?}");
        }
        // A header past 65,535 bytes (25,000 dimensions) is written as format 2.0.
        let many = vec![1usize; 25_000];
        let b = crate::source::npy::npy("|u1", &many, &[7]);
        assert_eq!(&b[6..8], b"\x02\x00");
        let h = parse_npy(&b).unwrap();
        assert_eq!((h.shape.len(), h.data_offset % 64, &b[h.data_offset..]), (25_000, 0, &[7u8][..]));
        for (shape, n) in [(vec![2usize, 3], 6usize), (vec![], 1), (vec![0], 0)] {
            let b = crate::source::npy::npy("<i8", &shape, &vec![1u8; n * 8]);
            let h = parse_npy(&b).unwrap();
            assert_eq!(h.shape, shape);
            assert_eq!(h.data_offset % 64, 0);
            assert_eq!(b.len() - h.data_offset, n * 8);
        }
    }

    fn npy(descr: &str, shape: &str, payload: &[u8]) -> Vec<u8> {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut v = b"\x93NUMPY\x01\x00".to_vec();
        v.extend((h.len() as u16).to_le_bytes());
        v.extend(h.as_bytes());
        v.extend(payload);
        v
    }

    #[test]
    fn ints_parse_with_whitespace_and_refuse_the_rest() {
        assert_eq!(parse_int(b"7"), Ok(7));
        assert_eq!(parse_int(b" 12\n"), Ok(12));
        assert_eq!(parse_int(b"-3"), Ok(-3));
        assert!(parse_int(b"seven").unwrap_err().contains("seven"));
        assert!(parse_int(b"").is_err());
        assert!(parse_int(&[0xff, 0xfe]).unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn npy_headers_shapes_and_byte_order() {
        let f = npy("<f4", "(2, 3)", &[0u8; 24]);
        let h = parse_npy(&f).unwrap();
        assert_eq!((h.dtype, h.shape.clone(), h.big_endian), (Dtype::F32, vec![2, 3], false));
        assert_eq!(h.data_offset % 64, 0);
        let s = npy("|u1", "()", &[9]);
        assert_eq!(parse_npy(&s).unwrap().shape, Vec::<usize>::new());
        let one = npy("<i8", "(4,)", &[0u8; 32]);
        assert_eq!(parse_npy(&one).unwrap().shape, vec![4]);
        let be = npy(">i2", "(2,)", &[0, 1, 0, 2]);
        let h = parse_npy(&be).unwrap();
        let mut out = [0u8; 4];
        copy_npy(&h, &be, &mut out);
        assert_eq!([i16::from_ne_bytes([out[0], out[1]]), i16::from_ne_bytes([out[2], out[3]])], [1, 2]);
        assert!(parse_npy(&npy("<f4", "(2, 3)", &[0u8; 20])).unwrap_err().contains("promises 24"));
        assert!(parse_npy(&npy("<c8", "(1,)", &[0u8; 8])).unwrap_err().contains("c8"));
        assert!(parse_npy(b"garbage").is_err());
        let mut f = npy("<f4", "(1,)", &[0u8; 4]);
        f.truncate(20);
        assert!(parse_npy(&f).is_err());
        // A zero extent beside one no tensor can have (DLPack's extents are i64).
        for shape in ["(0, 9223372036854775808)", "(0, 18446744073709551615)", "(0, 4294967296, 4294967296)"] {
            let e = parse_npy(&npy("<u1", shape, &[])).unwrap_err();
            assert!(e.contains("more elements than a tensor"), "{shape}: {e}");
        }
        assert_eq!(parse_npy(&npy("<u1", "(0, 9223372036854775807)", &[])).unwrap().shape, [0, i64::MAX as usize]);
        // A key given again (numpy reads the last) in any of Python's spellings: 26 uint16
        // values or 13 uint32, the same 52 bytes, so only the header can tell.
        for again in ["'descr': '<u4', 'shape': (13,)", "'desc' 'r': '<u4'", "\"descr\": '<u4'"] {
            let h = format!("{{'descr': '<u2', 'fortran_order': False, 'shape': (26,), {again}, }}");
            let mut f = b"\x93NUMPY\x01\x00".to_vec();
            f.extend_from_slice(&(h.len() as u16).to_le_bytes());
            f.extend_from_slice(h.as_bytes());
            f.extend_from_slice(&[0u8; 52]);
            assert!(parse_npy(&f).unwrap_err().contains("the .npy header"), "{again}");
        }
    }
}
