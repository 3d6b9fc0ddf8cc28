//! Typed scalars of MDS and LitData columns as the text Stoker hands them over as.

/// Little-endian integer of `descr`'s width (`<i8`, `|u1`, ...) as decimal text.
pub(crate) fn int_text(descr: &str, v: &[u8]) -> Option<String> {
    Some(match (descr, v.len()) {
        ("|i1", 1) => (v[0] as i8).to_string(),
        ("|u1", 1) => v[0].to_string(),
        ("<i2", 2) => i16::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<u2", 2) => u16::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<i4", 4) => i32::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<u4", 4) => u32::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<i8", 8) => i64::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<u8", 8) => u64::from_le_bytes(v.try_into().ok()?).to_string(),
        _ => return None,
    })
}

/// Little-endian float of `descr`'s width as its shortest round-trip text.
pub(crate) fn float_text(descr: &str, v: &[u8]) -> Option<String> {
    Some(match (descr, v.len()) {
        ("<f2", 2) => f16_to_f32(u16::from_le_bytes(v.try_into().ok()?)).to_string(),
        ("<f4", 4) => f32::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<f8", 8) => f64::from_le_bytes(v.try_into().ok()?).to_string(),
        _ => return None,
    })
}

/// IEEE half to single precision (exact: every half is a single).
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let (sign, exp, frac) = ((h >> 15) as u32, ((h >> 10) & 0x1f) as u32, (h & 0x3ff) as u32);
    let bits = match (exp, frac) {
        (0, 0) => sign << 31,
        (0, f) => {
            // Subnormal: normalise.
            let shift = f.leading_zeros() - 21;
            ((sign << 31) | ((113 - shift) << 23)) | ((f << (shift + 13)) & 0x7f_ffff)
        }
        (0x1f, f) => (sign << 31) | (0xff << 23) | (f << 13),
        (e, f) => (sign << 31) | ((e + 112) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_widen_exactly() {
        for (h, want) in
            [(0x3c00u16, 1.0f32), (0xc000, -2.0), (0x3555, 0.333_251_95), (0x0001, 5.960_464_5e-8), (0x7bff, 65504.0)]
        {
            assert_eq!(f16_to_f32(h), want, "{h:#x}");
        }
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    }

    #[test]
    fn numbers_become_text() {
        assert_eq!(int_text("<i8", &(-42i64).to_le_bytes()).unwrap(), "-42");
        assert_eq!(int_text("|u1", &[200]).unwrap(), "200");
        assert!(int_text("<i4", &[1, 2]).is_none());
        assert_eq!(float_text("<f8", &0.1f64.to_le_bytes()).unwrap(), "0.1");
        assert_eq!(float_text("<f4", &2.0f32.to_le_bytes()).unwrap(), "2");
    }
}
