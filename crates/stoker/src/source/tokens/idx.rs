//! Megatron's indexed dataset index (`.idx`, header `MMIDIDX`), as Megatron-LM, NeMo and
//! GPT-NeoX write it beside the token file (`.bin`).
//!
//! Layout, all little-endian: the 9-byte header `MMIDIDX\0\0`, a `u64` version (1), a `u8`
//! dtype code, a `u64` sequence count `S`, a `u64` document-index count `D`, then `i32`
//! sizes (tokens per sequence, `S` of them), `i64` pointers (byte offset of each sequence in
//! the `.bin`, `S`), `i64` document indices (`D`: the sequence where each document starts,
//! then `S`), and for multimodal datasets one `i8` mode per sequence. Every count is checked
//! against the file's length before anything is read at it, and every sequence against the
//! `.bin`'s length, so a lying index is an error at open, never a read out of bounds.

use bytes::Bytes;

/// The header every index starts with.
pub(crate) const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
const FIXED: usize = 9 + 8 + 1 + 8 + 8;

/// The length of an index's header (magic, version, token type, counts).
pub(crate) const HEADER: u64 = FIXED as u64;

/// Integer token types the format can hold (its float codes are not tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenType {
    U8,
    I8,
    I16,
    I32,
    I64,
    U16,
    /// Not a Megatron code: the uint32 arrays flat-token writers use for big vocabularies.
    U32,
}

impl TokenType {
    /// The type of Megatron dtype `code`.
    pub(crate) fn from_code(code: u8) -> Result<Self, String> {
        Ok(match code {
            1 => TokenType::U8,
            2 => TokenType::I8,
            3 => TokenType::I16,
            4 => TokenType::I32,
            5 => TokenType::I64,
            8 => TokenType::U16,
            6 | 7 => return Err(format!("dtype code {code} is a float type (float64/float32), not token ids")),
            _ => return Err(format!("unknown dtype code {code} (Megatron's are 1 to 8)")),
        })
    }

    /// Bytes per token.
    pub(crate) fn size(self) -> usize {
        match self {
            TokenType::U8 | TokenType::I8 => 1,
            TokenType::I16 | TokenType::U16 => 2,
            TokenType::I32 | TokenType::U32 => 4,
            TokenType::I64 => 8,
        }
    }

    /// Whether `t` is a value of this type.
    pub(crate) fn holds(self, t: i64) -> bool {
        match self {
            TokenType::U8 => u8::try_from(t).is_ok(),
            TokenType::I8 => i8::try_from(t).is_ok(),
            TokenType::I16 => i16::try_from(t).is_ok(),
            TokenType::U16 => u16::try_from(t).is_ok(),
            TokenType::I32 => i32::try_from(t).is_ok(),
            TokenType::U32 => u32::try_from(t).is_ok(),
            TokenType::I64 => true,
        }
    }

    /// numpy's name for it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TokenType::U8 => "uint8",
            TokenType::I8 => "int8",
            TokenType::I16 => "int16",
            TokenType::U16 => "uint16",
            TokenType::I32 => "int32",
            TokenType::U32 => "uint32",
            TokenType::I64 => "int64",
        }
    }

    /// Whether a token of this type can be negative.
    pub(crate) fn signed(self) -> bool {
        matches!(self, TokenType::I8 | TokenType::I16 | TokenType::I32 | TokenType::I64)
    }

    /// Append every token of little-endian `bytes` to `out` as `i32`, or return the first that
    /// is not an int32 id: negative (an id indexes a vocabulary: the file is damaged or not of
    /// token ids), or past `i32::MAX`. One tight loop per type; where a token can miss, a
    /// second loop ORs every token's bits into one word (it vectorizes), and the culprit is
    /// looked for only when that word says there is one. `out` is left as it was on an error.
    pub(crate) fn extend_i32(self, bytes: &[u8], out: &mut Vec<i32>) -> Result<(), i64> {
        let start = out.len();
        match self {
            TokenType::U8 => out.extend(bytes.iter().map(|&b| i32::from(b))),
            TokenType::I8 => out.extend(bytes.iter().map(|&b| i32::from(b as i8))),
            TokenType::I16 => out.extend(bytes.chunks_exact(2).map(|c| i32::from(i16::from_le_bytes([c[0], c[1]])))),
            TokenType::U16 => out.extend(bytes.chunks_exact(2).map(|c| i32::from(u16::from_le_bytes([c[0], c[1]])))),
            TokenType::I32 => out.extend(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            TokenType::U32 | TokenType::I64 => {
                let wide = |c: &[u8]| match self {
                    TokenType::U32 => i64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                    _ => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                };
                let chunks = bytes.chunks_exact(self.size());
                if chunks.clone().fold(0u64, |acc, c| acc | wide(c) as u64) >= 1 << 31 {
                    return Err(chunks.map(wide).find(|&t| t as u64 >= 1 << 31).unwrap_or_default());
                }
                out.extend(chunks.map(|c| wide(c) as i32));
            }
        }
        self.refuse_negative(out, start)
    }

    /// Tokens from `start` on in `out`, just appended: for a signed type, the first negative
    /// one (an id indexes a vocabulary) as the error, with `out` cut back to `start`. ORed, a
    /// negative token leaves the sign bit set (the loop vectorizes).
    pub(crate) fn refuse_negative<T>(self, out: &mut Vec<T>, start: usize) -> Result<(), i64>
    where
        T: Copy + Default + PartialOrd + std::ops::BitOr<Output = T> + Into<i64>,
    {
        let added = &out[start..];
        if self.signed() && added.iter().fold(T::default(), |acc, &t| acc | t) < T::default() {
            let bad = added.iter().copied().find(|&t| t < T::default()).unwrap_or_default();
            out.truncate(start);
            return Err(bad.into());
        }
        Ok(())
    }

    /// Write every token of little-endian `bytes` into `dst` native-endian, `width` bytes each
    /// (2: uint16 ids, 4: int32, 8: int64; `dst` holds exactly as many tokens as `bytes`), or
    /// return the first token that is not an id at that width: a negative one, one past
    /// `u16::MAX` for uint16 ids, one past `i32::MAX` for int32 ids (`dst` then holds what was
    /// copied). One tight loop per type, which the compiler vectorizes, ORing the ids as it
    /// writes them; uint16 tokens as uint16 ids are copied as they are.
    pub(crate) fn write_ne(self, bytes: &[u8], dst: &mut [u8], width: usize) -> Result<(), i64> {
        fn conv<const S: usize>(
            bytes: &[u8],
            dst: &mut [u8],
            width: usize,
            check: bool,
            read: impl Fn(&[u8]) -> i64,
        ) -> Result<(), i64> {
            let tokens = bytes.chunks_exact(S).map(&read);
            if width == 2 {
                // uint16 ids: 0..2^16, so ORed (as u64: a negative one sets the high bits)
                // the tokens reach 2^16 exactly when one of them is not an id; checked before
                // the narrowing copy, which would wrap it.
                if check && tokens.clone().fold(0u64, |acc, t| acc | t as u64) >= 1 << 16 {
                    return Err(tokens.clone().find(|&t| t as u64 >= 1 << 16).unwrap_or_default());
                }
                for (d, t) in dst.chunks_exact_mut(2).zip(tokens) {
                    d.copy_from_slice(&(t as u16).to_ne_bytes());
                }
                return Ok(());
            }
            // An id at this width is 0..2^31 or 0..2^63: a power of two, so the tokens ORed
            // reach it exactly when one of them does.
            let limit: u64 = if width == 8 { 1 << 63 } else { 1 << 31 };
            // int64 tokens can wrap into int32's range when cut: checked before they are.
            if check && S == 8 && width == 4 && tokens.clone().fold(0u64, |acc, t| acc | t as u64) >= limit {
                return Err(tokens.clone().find(|&t| t as u64 >= limit).unwrap_or_default());
            }
            // Otherwise the ids are ORed as they are written, at their own width (one pass;
            // a pass of its own cost a third of the copy): a bad one sets the sign bit,
            // negative or, from uint32, past int32.
            let sign = if width == 8 {
                let mut all = 0u64;
                for (d, t) in dst.chunks_exact_mut(8).zip(tokens.clone()) {
                    all |= t as u64;
                    d.copy_from_slice(&t.to_ne_bytes());
                }
                all >> 63
            } else {
                let mut all = 0u32;
                for (d, t) in dst.chunks_exact_mut(4).zip(tokens.clone()) {
                    all |= t as u32;
                    d.copy_from_slice(&(t as i32).to_ne_bytes());
                }
                u64::from(all >> 31)
            };
            if check && sign != 0 {
                return Err(tokens.clone().find(|&t| t as u64 >= limit).unwrap_or_default());
            }
            Ok(())
        }
        // Unsigned tokens narrower than the ids always fit.
        let check = match width {
            2 => !matches!(self, TokenType::U8 | TokenType::U16),
            4 => self.signed() || self == TokenType::U32,
            _ => self.signed(),
        };
        match self {
            // The file's own width: a copy (little-endian is native on every target Stoker
            // builds for; the loop keeps a big-endian one right).
            TokenType::U16 if width == 2 && cfg!(target_endian = "little") && dst.len() == bytes.len() => {
                dst.copy_from_slice(bytes);
                Ok(())
            }
            TokenType::U8 => conv::<1>(bytes, dst, width, check, |c| i64::from(c[0])),
            TokenType::I8 => conv::<1>(bytes, dst, width, check, |c| i64::from(c[0] as i8)),
            TokenType::I16 => conv::<2>(bytes, dst, width, check, |c| i64::from(i16::from_le_bytes([c[0], c[1]]))),
            TokenType::U16 => conv::<2>(bytes, dst, width, check, |c| i64::from(u16::from_le_bytes([c[0], c[1]]))),
            TokenType::I32 if width == 2 => {
                conv::<4>(bytes, dst, width, check, |c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            }
            // int32 tokens as they are, in a loop of their own: through `conv`'s i64 the
            // int32 ids came 22% slower.
            TokenType::I32 => {
                let tokens = bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                let mut all = 0i32;
                if width == 8 {
                    for (d, t) in dst.chunks_exact_mut(8).zip(tokens.clone()) {
                        all |= t;
                        d.copy_from_slice(&i64::from(t).to_ne_bytes());
                    }
                } else {
                    for (d, t) in dst.chunks_exact_mut(4).zip(tokens.clone()) {
                        all |= t;
                        d.copy_from_slice(&t.to_ne_bytes());
                    }
                }
                match all < 0 {
                    true => Err(tokens.map(i64::from).find(|&t| t < 0).unwrap_or_default()),
                    false => Ok(()),
                }
            }
            TokenType::U32 => {
                conv::<4>(bytes, dst, width, check, |c| i64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            }
            TokenType::I64 => conv::<8>(bytes, dst, width, check, |c| {
                i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
            }),
        }
    }

    /// Append every token of little-endian `bytes` to `out`: one tight loop per type, which
    /// the compiler vectorizes (a match per token does not).
    pub(crate) fn extend(self, bytes: &[u8], out: &mut Vec<i64>) {
        match self {
            TokenType::U8 => out.extend(bytes.iter().map(|&b| i64::from(b))),
            TokenType::I8 => out.extend(bytes.iter().map(|&b| i64::from(b as i8))),
            TokenType::I16 => out.extend(bytes.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes([c[0], c[1]])))),
            TokenType::U16 => out.extend(bytes.chunks_exact(2).map(|c| i64::from(u16::from_le_bytes([c[0], c[1]])))),
            TokenType::I32 => {
                out.extend(bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))))
            }
            TokenType::U32 => {
                out.extend(bytes.chunks_exact(4).map(|c| i64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))))
            }
            TokenType::I64 => out.extend(
                bytes.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
            ),
        }
    }
}

/// A parsed index: its bytes are kept and read in place, so a corpus of a hundred million
/// documents costs the index file's size once, not a second copy in vectors.
#[derive(Clone, Debug)]
pub(crate) struct Index {
    bytes: Bytes,
    pub(crate) ty: TokenType,
    sequences: usize,
}

impl Index {
    /// Parse and check `bytes` (a whole `.idx`) against `bin_len`, the length of its `.bin`.
    /// Errors say what is wrong, for the caller to name the file.
    pub(crate) fn parse(bytes: Bytes, bin_len: u64) -> Result<Self, String> {
        let (ty, s, d) = Self::header(&bytes, bytes.len() as u64)?;
        let sequences = s as usize;
        let index = Index { bytes, ty, sequences };
        index.check(d as usize, bin_len)?;
        Ok(index)
    }

    /// Check the header at the start of `head` (its first [`HEADER`] bytes or more) against
    /// the index file's length `len`: the counts it gives must need exactly that many bytes.
    /// Checked before the file is read whole: a file of a valid header and gigabytes of
    /// anything after it is refused at its first bytes. Its token type and counts.
    pub(crate) fn header(head: &[u8], len: u64) -> Result<(TokenType, u64, u64), String> {
        if head.len() < FIXED {
            return Err(format!("{len} bytes, shorter than the {FIXED}-byte header"));
        }
        if &head[..9] != MAGIC {
            return Err("it does not start with MMIDIDX (not a Megatron indexed dataset index)".into());
        }
        let version = u64_at(head, 9);
        if version != 1 {
            return Err(format!("version {version}; only version 1 is known"));
        }
        let ty = TokenType::from_code(head[17])?;
        let (s, d) = (u64_at(head, 18), u64_at(head, 26));
        // Checked in u128: a lying count cannot overflow into a small total.
        let need = FIXED as u128 + u128::from(s) * 12 + u128::from(d) * 8;
        let len = u128::from(len);
        if need != len && need + u128::from(s) != len {
            return Err(format!(
                "its counts ({s} sequences, {d} document indices) need {need} bytes (or {} with sequence modes) but \
                 the file has {len}",
                need + u128::from(s)
            ));
        }
        Ok((ty, s, d))
    }

    /// Every sequence inside the `.bin`, with a non-negative size; document indices rising
    /// from 0 to the sequence count.
    fn check(&self, d: usize, bin_len: u64) -> Result<(), String> {
        let item = self.ty.size() as u128;
        for i in 0..self.sequences {
            let size = i32_at(&self.bytes, FIXED + 4 * i);
            let ptr = i64_at(&self.bytes, FIXED + 4 * self.sequences + 8 * i);
            if size < 0 || ptr < 0 {
                return Err(format!("sequence {i} has size {size} at byte {ptr}"));
            }
            // A pointer inside a token would read every token of the document shifted, each
            // one's bytes half from its neighbour: ids, but not the document's.
            if !(ptr as u128).is_multiple_of(item) {
                return Err(format!(
                    "sequence {i} starts at byte {ptr}, inside a token ({item}-byte tokens): the .idx's pointers \
                     are not the .bin's"
                ));
            }
            let end = ptr as u128 + size as u128 * item;
            if end > u128::from(bin_len) {
                return Err(format!(
                    "sequence {i} ({size} tokens at byte {ptr}) ends at byte {end}, past the end of the .bin \
                     ({bin_len} bytes): the .idx and .bin disagree"
                ));
            }
        }
        let docs_at = FIXED + 12 * self.sequences;
        let mut last = -1i64;
        for j in 0..d {
            let v = i64_at(&self.bytes, docs_at + 8 * j);
            if v < last || v > self.sequences as i64 || (j == 0 && v != 0) {
                return Err(format!("document index {j} is {v}, out of order or past {} sequences", self.sequences));
            }
            last = v;
        }
        Ok(())
    }

    /// Number of sequences (Megatron's GPT datasets read each as one document).
    pub(crate) fn len(&self) -> usize {
        self.sequences
    }

    /// Tokens in sequence `i` (`i < len()`).
    pub(crate) fn size(&self, i: usize) -> u64 {
        i32_at(&self.bytes, FIXED + 4 * i) as u64
    }

    /// Byte offset of sequence `i` in the `.bin` (`i < len()`).
    pub(crate) fn pointer(&self, i: usize) -> u64 {
        i64_at(&self.bytes, FIXED + 4 * self.sequences + 8 * i) as u64
    }

    /// Ask the memory system for sequence `i`'s length (and with `pointer` its offset) ahead
    /// of [`size`](Self::size) and [`pointer`](Self::pointer): see [`crate::prefetch`].
    pub(crate) fn prefetch(&self, i: usize, pointer: bool) {
        crate::prefetch::item(&self.bytes, FIXED + 4 * i);
        if pointer {
            crate::prefetch::item(&self.bytes, FIXED + 4 * self.sequences + 8 * i);
        }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

/// An index for `sizes` (tokens per sequence) of type code `code`, sequences back to back, one
/// document per sequence: what Megatron's `IndexedDatasetBuilder` writes.
pub(crate) fn write(code: u8, sizes: &[u64], item: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(FIXED + sizes.len() * 20 + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&1u64.to_le_bytes());
    out.push(code);
    out.extend_from_slice(&(sizes.len() as u64).to_le_bytes());
    out.extend_from_slice(&(sizes.len() as u64 + 1).to_le_bytes());
    for &s in sizes {
        out.extend_from_slice(&(s as i32).to_le_bytes());
    }
    let mut at = 0u64;
    for &s in sizes {
        out.extend_from_slice(&(at as i64).to_le_bytes());
        at += s * item as u64;
    }
    for d in 0..=sizes.len() {
        out.extend_from_slice(&(d as i64).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `write_ne` (the mapped path's copy into the batch) gives what `extend` and
    /// `extend_i32` give, for every type at both widths, and refuses the same tokens.
    #[test]
    fn writing_native_ids_equals_widening_into_vectors() {
        let types = [
            TokenType::U8,
            TokenType::I8,
            TokenType::I16,
            TokenType::U16,
            TokenType::I32,
            TokenType::U32,
            TokenType::I64,
        ];
        for ty in types {
            let bytes: Vec<u8> = (0..ty.size() * 37).map(|i| (i * 151 % 256) as u8).collect();
            let n = bytes.len() / ty.size();
            let mut wide = Vec::new();
            ty.extend(&bytes, &mut wide);
            let mut dst = vec![0u8; n * 8];
            match wide.iter().copied().find(|&t| t < 0) {
                Some(negative) => assert_eq!(ty.write_ne(&bytes, &mut dst, 8), Err(negative), "{ty:?} as int64"),
                None => {
                    ty.write_ne(&bytes, &mut dst, 8).unwrap();
                    let got: Vec<i64> =
                        dst.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect();
                    assert_eq!(got, wide, "{ty:?} as int64");
                }
            }
            let mut narrow = Vec::new();
            let want = ty.extend_i32(&bytes, &mut narrow);
            let mut dst = vec![0u8; n * 4];
            let got = ty.write_ne(&bytes, &mut dst, 4);
            assert_eq!(got.is_err(), want.is_err(), "{ty:?} as int32");
            if let (Err(a), Err(b)) = (got, want) {
                assert_eq!(a, b, "{ty:?}: the same token refused");
            } else {
                let got: Vec<i32> = dst.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect();
                assert_eq!(got, narrow, "{ty:?} as int32");
            }
        }
        // uint16 ids: the first token outside 0..65,536 refused, from every type, the rest as
        // widened, also through a buffer of uint16 tokens.
        for ty in types {
            for small in [false, true] {
                // Small tokens (0 to 2: only each token's low byte set) fit from every type;
                // the others hold ids past 65,535 or negative ones, except uint8 and uint16.
                let byte = |i: usize| match small {
                    true => (i % 3) as u8 * u8::from(i.is_multiple_of(ty.size())),
                    false => (i * 151 % 256) as u8,
                };
                let bytes: Vec<u8> = (0..ty.size() * 41).map(byte).collect();
                let n = bytes.len() / ty.size();
                let mut wide = Vec::new();
                ty.extend(&bytes, &mut wide);
                let mut dst = vec![0u8; n * 2];
                let got = ty.write_ne(&bytes, &mut dst, 2);
                let mut buf = super::super::TokenBuf::with_capacity(2, 0);
                let buffered = buf.extend(ty, &bytes);
                match wide.iter().copied().find(|&t| u16::try_from(t).is_err()) {
                    Some(bad) => {
                        assert_eq!(got, Err(bad), "{ty:?} as uint16");
                        assert_eq!(buffered, Err(bad), "{ty:?} into a uint16 buffer");
                        assert_eq!(buf, super::super::TokenBuf::U16(Vec::new()), "nothing appended on an error");
                    }
                    None => {
                        got.unwrap();
                        let ids: Vec<i64> =
                            dst.chunks_exact(2).map(|c| i64::from(u16::from_ne_bytes([c[0], c[1]]))).collect();
                        assert_eq!(ids, wide, "{ty:?} as uint16");
                        buffered.unwrap();
                        let mut out = vec![0u8; n * 2];
                        buf.write_ne(0..n, &mut out).unwrap();
                        assert_eq!(out, dst, "{ty:?}: the buffer gives what the copy gave");
                    }
                }
            }
        }
        // Tokens that fit int32 ids from the wide types convert.
        let small: Vec<u8> = [5u32, 70_000, i32::MAX as u32].iter().flat_map(|t| t.to_le_bytes()).collect();
        let mut dst = vec![0u8; 12];
        TokenType::U32.write_ne(&small, &mut dst, 4).unwrap();
        assert_eq!(i32::from_ne_bytes(dst[4..8].try_into().unwrap()), 70_000);
    }

    #[test]
    fn a_written_index_reads_back() {
        let idx = Index::parse(Bytes::from(write(8, &[3, 0, 5], 2)), 16).unwrap();
        assert_eq!((idx.len(), idx.ty), (3, TokenType::U16));
        assert_eq!((idx.size(0), idx.size(1), idx.size(2)), (3, 0, 5));
        assert_eq!((idx.pointer(0), idx.pointer(1), idx.pointer(2)), (0, 6, 6));
    }

    #[test]
    fn lying_indexes_are_refused() {
        let good = write(8, &[3, 5], 2);
        // The .bin is shorter than the sequences claim.
        assert!(Index::parse(Bytes::from(good.clone()), 15).unwrap_err().contains("past the end of the .bin"));
        // A huge sequence count: refused by length, nothing allocated.
        let mut huge = good.clone();
        huge[18..26].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Index::parse(Bytes::from(huge), 16).unwrap_err().contains("need"));
        // A negative size.
        let mut neg = good.clone();
        neg[FIXED..FIXED + 4].copy_from_slice(&(-1i32).to_le_bytes());
        assert!(Index::parse(Bytes::from(neg), 16).unwrap_err().contains("size -1"));
        // Float tokens, another magic, truncation.
        let mut float = good.clone();
        float[17] = 7;
        assert!(Index::parse(Bytes::from(float), 16).unwrap_err().contains("float"));
        assert!(Index::parse(Bytes::from(&b"NOTANIDX-and-more-bytes-than-the-header"[..]), 16).is_err());
        assert!(Index::parse(Bytes::from(good[..good.len() - 3].to_vec()), 16).is_err());
        // A pointer one byte into a token.
        let mut odd = good.clone();
        let at = FIXED + 4 * 2 + 8;
        odd[at..at + 8].copy_from_slice(&7i64.to_le_bytes());
        assert!(Index::parse(Bytes::from(odd), 16).unwrap_err().contains("inside a token"));
        // Document indices out of order.
        let mut docs = good;
        let at = FIXED + 12 * 2 + 8;
        docs[at..at + 8].copy_from_slice(&5i64.to_le_bytes());
        assert!(Index::parse(Bytes::from(docs), 16).unwrap_err().contains("document index"));
    }

    #[test]
    fn token_types_read_little_endian() {
        let b = [0xff, 0xff, 0x01, 0x00];
        let read = |ty: TokenType| {
            let mut v = Vec::new();
            ty.extend(&b, &mut v);
            v
        };
        assert_eq!(read(TokenType::U16), [65535, 1]);
        assert_eq!(read(TokenType::I16), [-1, 1]);
        assert_eq!(read(TokenType::I32), [0x0001ffff]);
        assert_eq!(read(TokenType::I8), [-1, -1, 1, 0]);
    }

    /// Straight to int32 ids: the same values as through `i64` for every type, and the first
    /// token that is not an int32 id (negative, or past `i32::MAX`) named, whatever its place.
    #[test]
    fn tokens_widen_to_int32_as_to_int64_and_refuse_what_does_not_fit() {
        let types = [TokenType::U8, TokenType::I8, TokenType::I16, TokenType::U16, TokenType::I32, TokenType::U32];
        let b: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
        for ty in types.into_iter().chain([TokenType::I64]) {
            let (mut wide, mut narrow) = (Vec::new(), Vec::new());
            ty.extend(&b, &mut wide);
            match ty.extend_i32(&b, &mut narrow) {
                Ok(()) => assert_eq!(narrow.iter().map(|&t| i64::from(t)).collect::<Vec<_>>(), wide, "{ty:?}"),
                Err(bad) => {
                    assert!(!matches!(ty, TokenType::U8 | TokenType::U16), "{ty:?}");
                    let first = wide.iter().copied().find(|&t| t < 0 || t > i64::from(i32::MAX));
                    assert_eq!(Some(bad), first, "{ty:?}");
                    assert!(narrow.is_empty(), "{ty:?}: nothing appended on an error");
                }
            }
        }
        let le = |v: &[i64]| v.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>();
        let mut out = Vec::new();
        assert_eq!(TokenType::I64.extend_i32(&le(&[0, 5, i64::from(i32::MAX)]), &mut out), Ok(()));
        assert_eq!(out, [0, 5, i32::MAX]);
        // A negative id anywhere, from any signed type, at either width.
        for at in 0..9 {
            let mut v = vec![7i64; 9];
            v[at] = -3;
            assert_eq!(TokenType::I64.extend_i32(&le(&v), &mut Vec::new()), Err(-3), "at {at}");
            assert_eq!(TokenType::I64.write_ne(&le(&v), &mut [0u8; 72], 8), Err(-3), "at {at}");
            let i16s: Vec<u8> = v.iter().flat_map(|&t| (t as i16).to_le_bytes()).collect();
            assert_eq!(TokenType::I16.extend_i32(&i16s, &mut Vec::new()), Err(-3), "at {at}");
            assert_eq!(TokenType::I16.write_ne(&i16s, &mut [0u8; 36], 4), Err(-3), "at {at}");
        }
        for at in 0..9 {
            let mut v = vec![7i64; 9];
            v[at] = 1 << 31;
            assert_eq!(TokenType::I64.extend_i32(&le(&v), &mut Vec::new()), Err(1 << 31), "at {at}");
        }
        let big = [0x00, 0x00, 0x00, 0x80]; // uint32 2^31
        assert_eq!(TokenType::U32.extend_i32(&big, &mut Vec::new()), Err(1 << 31));
    }
}
