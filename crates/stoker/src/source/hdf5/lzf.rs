//! LZF decompression (Marc Lehmann's format, as h5py's `lzf` filter writes it): literal runs
//! and back references, bounded by the size the chunk announces.

/// The bytes `input` decompresses to, at most `max` of them; why not, for damaged input.
pub(super) fn decompress(input: &[u8], max: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(max.min(input.len().saturating_mul(8)));
    let mut ip = 0;
    while ip < input.len() {
        let ctrl = usize::from(input[ip]);
        ip += 1;
        if ctrl < 32 {
            // A literal run of ctrl + 1 bytes.
            let len = ctrl + 1;
            let lit = input.get(ip..ip + len).ok_or("a literal run past the end of the input")?;
            if out.len() + len > max {
                return Err(format!("more than the {max} bytes announced"));
            }
            out.extend_from_slice(lit);
            ip += len;
        } else {
            // A back reference: length in the top 3 bits (7 means one more length byte),
            // distance in the low 5 and the next byte.
            let mut len = ctrl >> 5;
            if len == 7 {
                len += usize::from(*input.get(ip).ok_or("a reference cut short")?);
                ip += 1;
            }
            let low = usize::from(*input.get(ip).ok_or("a reference cut short")?);
            ip += 1;
            let back = ((ctrl & 0x1f) << 8) + low + 1;
            let len = len + 2;
            let from = out.len().checked_sub(back).ok_or("a reference before the start of the output")?;
            if out.len() + len > max {
                return Err(format!("more than the {max} bytes announced"));
            }
            // Byte by byte: the source may overlap what is being written (a repeated run).
            for k in 0..len {
                let b = out[from + k];
                out.push(b);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_overlapping_references() {
        // "abc" literal, then a reference 3 back of length 6 ("abcabc"), then "d".
        let data = [2, b'a', b'b', b'c', (4 << 5), 2, 0, b'd'];
        assert_eq!(decompress(&data, 100).unwrap(), b"abcabcabcd");
        // A long reference: length byte after a 7.
        let long = [0, b'x', (7 << 5), 10, 0];
        assert_eq!(decompress(&long, 100).unwrap(), vec![b'x'; 1 + 7 + 10 + 2]);
        assert!(decompress(&data, 5).unwrap_err().contains("announced"));
        assert!(decompress(&[2, b'a'], 100).unwrap_err().contains("literal"));
        assert!(decompress(&[(1 << 5), 0], 100).unwrap_err().contains("before the start"));
        assert!(decompress(&[0, b'a', (1 << 5)], 100).unwrap_err().contains("cut short"));
    }
}
