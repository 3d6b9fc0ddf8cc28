//! Flat token arrays: one long array of token ids in a file, documents ended by a separator
//! token, as nanoGPT's `prepare.py` writes them (`train.bin`, raw uint16) or `numpy.save`
//! (`.npy`, its dtype in the header). Opening walks the file once through the store to find
//! where each document ends (its separator included); then they read like a Megatron index.

use std::io::Read;

use super::idx::{Index, TokenType};
use crate::error::{Error, Result};
use crate::store::{Cancel, Object, Store};

/// Where a file's documents are.
#[derive(Debug)]
pub(crate) enum FileDocs {
    /// A Megatron `.idx`.
    Megatron(Index),
    /// A flat array split at separators.
    Flat(Flat),
}

#[derive(Debug)]
pub(crate) struct Flat {
    ty: TokenType,
    /// Bytes before the first token (an `.npy` header).
    header: u64,
    /// Token offset where each document starts, then the number of tokens.
    starts: Vec<u64>,
}

impl FileDocs {
    pub(crate) fn ty(&self) -> TokenType {
        match self {
            FileDocs::Megatron(i) => i.ty,
            FileDocs::Flat(f) => f.ty,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            FileDocs::Megatron(i) => i.len(),
            FileDocs::Flat(f) => f.starts.len() - 1,
        }
    }

    /// Tokens in document `i`.
    pub(crate) fn size(&self, i: usize) -> u64 {
        match self {
            FileDocs::Megatron(idx) => idx.size(i),
            FileDocs::Flat(f) => f.starts[i + 1] - f.starts[i],
        }
    }

    /// Byte offset of document `i` in the token file.
    pub(crate) fn pointer(&self, i: usize) -> u64 {
        match self {
            FileDocs::Megatron(idx) => idx.pointer(i),
            FileDocs::Flat(f) => f.header + f.starts[i] * f.ty.size() as u64,
        }
    }

    /// Ask the memory system for document `i`'s length (and with `pointer` its offset) ahead
    /// of their use: see [`crate::prefetch`].
    pub(crate) fn prefetch(&self, i: usize, pointer: bool) {
        match self {
            FileDocs::Megatron(idx) => idx.prefetch(i, pointer),
            FileDocs::Flat(f) => crate::prefetch::item(&f.starts, i),
        }
    }
}

impl Flat {
    /// Documents at byte `offsets` (each document's start, then the end) of a file of `size`
    /// bytes whose tokens of `ty` start at byte `header`: each must be in order, within the
    /// file, and a whole number of tokens from the first, and the last the file's end.
    pub(crate) fn from_offsets(
        ty: TokenType,
        offsets: &[u64],
        header: u64,
        size: u64,
    ) -> std::result::Result<Self, String> {
        let item = ty.size() as u64;
        match offsets.first() {
            Some(&first) if first == header => {}
            first => {
                return Err(format!(
                    "its first item starts at byte {}, not {header}, just after its offsets",
                    first.map_or_else(|| "(none)".to_string(), |f| f.to_string())
                ))
            }
        }
        let mut starts = Vec::with_capacity(offsets.len());
        for (i, w) in offsets.windows(2).enumerate() {
            let (a, b) = (w[0], w[1]);
            let why = if b < a {
                "ends before it starts"
            } else if b > size {
                "runs past the end of the file"
            } else if !(b - a).is_multiple_of(item) {
                "is not a whole number of tokens"
            } else {
                continue;
            };
            return Err(format!("item {i} (bytes {a}..{b} of {size}) {why} ({item}-byte tokens)"));
        }
        // The table accounts for the whole file: its last offset is the file's end. A chunk cut
        // short lost part of its last item, silently; bytes past the last item are not its own.
        if let Some(&last) = offsets.last().filter(|&&last| last != size) {
            return Err(format!(
                "its last item ends at byte {last}, not at the file's end ({size}): the file was cut short or has \
                 bytes its offsets do not account for"
            ));
        }
        starts.extend(offsets.iter().map(|o| (o - header) / item));
        Ok(Flat { ty, header, starts })
    }
}

/// The token type `name` (numpy's names: `uint16`, `int32`, ...).
pub(crate) fn type_named(name: &str) -> Option<TokenType> {
    Some(match name {
        "uint8" => TokenType::U8,
        "int8" => TokenType::I8,
        "int16" => TokenType::I16,
        "uint16" => TokenType::U16,
        "int32" => TokenType::I32,
        "uint32" => TokenType::U32,
        "int64" => TokenType::I64,
        _ => return None,
    })
}

/// An `.npy` header's token type, its own length in bytes and the array's length: a 1-D
/// little-endian integer array in C order.
pub(crate) fn npy_header(b: &[u8]) -> std::result::Result<(TokenType, u64, u64), String> {
    let (text, end) = crate::npy::header_text(b)?;
    let h = crate::npy::parse_dict(text)?;
    let ty = match h.descr.as_str() {
        "|u1" | "<u1" => TokenType::U8,
        "|i1" | "<i1" => TokenType::I8,
        "<i2" => TokenType::I16,
        "<u2" => TokenType::U16,
        "<i4" => TokenType::I32,
        "<u4" => TokenType::U32,
        "<i8" => TokenType::I64,
        d => return Err(format!("dtype {d} is not little-endian integer token ids")),
    };
    if h.fortran_order {
        return Err("it is in Fortran order".into());
    }
    match h.shape.as_slice() {
        [n] => Ok((ty, end as u64, *n)),
        dims => Err(format!("shape {dims:?} is not one-dimensional")),
    }
}

/// A flat file whose documents average fewer tokens than this, once past
/// [`INDEX_SLACK_DOCS`] of them, is refused (see [`walk`]).
const MIN_MEAN_TOKENS: u64 = 4;

/// Documents a flat file may have before [`MIN_MEAN_TOKENS`] applies (512 KiB of index):
/// small files of short documents are fine.
const INDEX_SLACK_DOCS: u64 = 1 << 16;

/// Walk flat token file `obj` (`header` bytes first, then tokens of `ty`), cutting documents
/// after every `separator`.
pub(crate) fn walk(
    store: &Store,
    obj: &Object,
    ty: TokenType,
    header: u64,
    separator: i64,
    cancel: Cancel,
) -> Result<Flat> {
    let shown = store.describe(obj.path());
    let bytes = obj.size().saturating_sub(header);
    if !bytes.is_multiple_of(ty.size() as u64) {
        return Err(Error::CorruptData {
            shard: shown,
            key: String::new(),
            field: "tokens".into(),
            reason: format!("{bytes} bytes of tokens is not a whole number of {}-byte tokens", ty.size()),
        });
    }
    let mut reader = store.blocking_reader(obj, true, cancel)?;
    std::io::copy(&mut (&mut reader).take(header), &mut std::io::sink()).map_err(|e| Error::io(&shown, e))?;
    let mut starts = vec![0u64];
    let (mut buf, mut at, mut tokens) = (vec![0u8; 1 << 20], 0usize, Vec::with_capacity(1 << 19));
    let mut n = 0u64;
    loop {
        let got = reader.read(&mut buf[at..]).map_err(|e| reader.failure().unwrap_or_else(|| Error::io(&shown, e)))?;
        if got == 0 {
            break;
        }
        let have = at + got;
        let whole = have - have % ty.size();
        tokens.clear();
        ty.extend(&buf[..whole], &mut tokens);
        for (i, &t) in tokens.iter().enumerate() {
            if t == separator {
                // Grown fallibly: where memory runs out this is an error, not an abort.
                if starts.len() == starts.capacity() {
                    starts.try_reserve(starts.len()).map_err(|e| {
                        Error::resource(format!("the document index of {shown}"), std::io::Error::other(e))
                    })?;
                }
                starts.push(n + i as u64 + 1);
            }
        }
        n += tokens.len() as u64;
        // A document costs 8 bytes of index in memory for the source's life. Documents of a
        // token or two on average mean the separator or the token type is wrong (a uint32
        // file read as uint16 with separator=0 ends a document at every high half; a file of
        // zeros split at 0), and the index would take as much memory as the data or more.
        // Against the whole file's tokens, so a file whose short documents come first (sorted
        // by length) is not refused for its start.
        let docs = starts.len() as u64 - 1;
        if docs > INDEX_SLACK_DOCS && docs.saturating_mul(MIN_MEAN_TOKENS) > bytes / ty.size() as u64 {
            return Err(Error::invalid_option(format!(
                "{shown}: {docs} documents in its first {n} tokens (fewer than {MIN_MEAN_TOKENS} tokens a \
                 document; an index of {} bytes): the separator ({separator}) or token_dtype= ({}) is likely \
                 wrong (a uint32 file read as uint16 ends a document at every high half equal to the separator)",
                docs * 8,
                ty.name()
            )));
        }
        buf.copy_within(whole..have, 0);
        at = have - whole;
    }
    if starts.last() != Some(&n) {
        starts.push(n);
    }
    Ok(Flat { ty, header, starts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_headers_as_numpy_writes_them() {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let h = "{'descr': '<u2', 'fortran_order': False, 'shape': (1234,), }          \n";
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        assert_eq!(npy_header(&b).unwrap(), (TokenType::U16, 10 + h.len() as u64, 1234));
        let bad = |h: &str| {
            let mut b = b"\x93NUMPY\x01\x00".to_vec();
            b.extend_from_slice(&(h.len() as u16).to_le_bytes());
            b.extend_from_slice(h.as_bytes());
            npy_header(&b).unwrap_err()
        };
        assert!(bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }").contains("integer"));
        let two = bad("{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }");
        assert!(two.contains("shape [3, 4] is not one-dimensional"), "{two}");
        let negative = bad("{'descr': '<u2', 'fortran_order': False, 'shape': (-5,), }");
        assert!(negative.contains("-5, not a length"), "{negative}");
        assert!(bad("{'descr': '>u2', 'fortran_order': False, 'shape': (3,), }").contains("little-endian"));
        // numpy reads the last copy of a key: 13 uint32 tokens, where the first copy says 26 uint16.
        let twice = "{'descr': '<u2', 'fortran_order': False, 'shape': (26,), 'descr': '<u4', 'shape': (13,), }";
        assert!(bad(twice).contains("descr more than once"), "{}", bad(twice));
        let quoted = "{'descr': '<u2', 'fortran_order': False, 'shape': (26,), \"shape\": (13,), }";
        assert!(bad(quoted).contains("shape more than once"), "{}", bad(quoted));
        assert!(npy_header(b"not numpy at all").is_err());
        // Python's other ways to say a key: joined literals and escapes, which a looser
        // reader would not see as the same key (numpy does); and keys numpy does not write.
        let joined = "{'descr': '<u2', 'fortran_order': False, 'shape': (26,), 'desc' 'r': '<u4', 'sha' 'pe': (13,), }";
        assert!(bad(joined).contains("joins two strings"), "{}", bad(joined));
        let escaped = "{'descr': '<u2', 'fortran_order': False, 'shape': (26,), 'd\\x65scr': '<u4', }";
        assert!(bad(escaped).contains("escape"), "{}", bad(escaped));
        let extra = "{'descr': '<u2', 'fortran_order': False, 'shape': (26,), 'other': 1, }";
        assert!(bad(extra).contains("\"other\""), "{}", bad(extra));
        assert!(bad("{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (3,), }").contains("plain dtype"));
        assert!(bad("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), } x").contains("more after"));
        assert!(bad("{'descr': '<u2', 'shape': (3,), }").contains("no fortran_order"));
        // What numpy writes for 2.x and 1.x alike: the last key's comma optional, padding.
        let plain = "{'descr': '<i4', 'fortran_order': False, 'shape': (7,)}   \n";
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(plain.len() as u16).to_le_bytes());
        b.extend_from_slice(plain.as_bytes());
        assert_eq!(npy_header(&b).unwrap(), (TokenType::I32, 10 + plain.len() as u64, 7));
    }
}
