//! The compressions and hashes MDS and LitData name in their indexes.

use std::io::Read;

/// A whole-file (or whole-frame) compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Codec {
    Zstd,
    Gzip,
    Bzip2,
    Brotli,
    Snappy,
}

impl Codec {
    /// The codec a name like `zstd`, `zstd:7`, `gz`, `bz2`, `br`, `snappy` stands for.
    pub(super) fn parse(name: &str) -> Option<Codec> {
        Some(match name.split(':').next().unwrap_or(name) {
            "zstd" => Codec::Zstd,
            "gz" | "gzip" => Codec::Gzip,
            "bz2" => Codec::Bzip2,
            "br" => Codec::Brotli,
            "snappy" => Codec::Snappy,
            _ => return None,
        })
    }

    /// `data` decompressed, into at most `limit` bytes; exactly `claimed` when the container
    /// says how many (an index's size, a frame's length). Memory is bounded before a byte is
    /// decompressed: a claim over `limit` is refused at once, and a stream that produces more
    /// than its claim (or than `limit`) is stopped as soon as it does (a decompression bomb).
    pub(super) fn decompress(self, data: &[u8], claimed: Option<usize>, limit: usize) -> Result<Vec<u8>, Inflate> {
        let bound = claimed.unwrap_or(limit);
        if bound > limit {
            return Err(Inflate::OverBudget { claimed: bound, limit });
        }
        if self == Codec::Snappy {
            // Snappy's header states the length: checked before its buffer exists.
            let n = snap::raw::decompress_len(data).map_err(|e| Inflate::Corrupt(format!("snappy: {e}")))?;
            check_len(n, claimed, limit)?;
            let mut out = fallible_vec(n)?;
            out.resize(n, 0);
            let got = snap::raw::Decoder::new()
                .decompress(data, &mut out)
                .map_err(|e| Inflate::Corrupt(format!("snappy: {e}")))?;
            out.truncate(got);
            return Ok(out);
        }
        let mut reader: Box<dyn Read + '_> = match self {
            Codec::Zstd => Box::new(
                zstd::stream::read::Decoder::new(data)
                    .map_err(|e| Inflate::Corrupt(format!("{self:?} data does not decompress: {e}")))?,
            ),
            Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(data)),
            Codec::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(data)),
            Codec::Brotli => Box::new(brotli::Decompressor::new(data, 64 << 10)),
            Codec::Snappy => unreachable!("handled above"),
        };
        // One byte more than allowed tells a stream that goes on from one that ends there.
        let out = read_bounded(&mut reader, bound.saturating_add(1)).map_err(|e| match e {
            Grow::Io(e) => Inflate::Corrupt(format!("{self:?} data does not decompress: {e}")),
            Grow::Alloc(n) => Inflate::OverBudget { claimed: n, limit },
        })?;
        check_len(out.len(), claimed, limit)?;
        Ok(out)
    }
}

/// Why a decompression was refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Inflate {
    /// It claims (or produced) more than the memory allowed for it: `decoded_bytes`.
    OverBudget { claimed: usize, limit: usize },
    /// The data is damaged or lies about its size.
    Corrupt(String),
}

impl Inflate {
    /// The error for `shard` (named as shown): over budget names the option to raise;
    /// damage says what to do.
    pub(super) fn error(self, shard: String, key: String) -> crate::error::Error {
        match self {
            Inflate::OverBudget { claimed, limit } => {
                let part = if key.is_empty() { String::new() } else { format!(" {key}") };
                crate::error::Error::InvalidOption {
                    message: format!(
                        "{shard}{part} decompresses to {claimed} bytes or more (as its index or header says), beyond \
                         the {limit} bytes decoded_bytes allows (or memory could give): if it is that large, raise \
                         decoded_bytes= to read it; if not, its index or header is damaged"
                    ),
                }
            }
            Inflate::Corrupt(why) => crate::error::Error::CorruptData {
                shard,
                key,
                field: String::new(),
                reason: format!("{why}: the file is truncated or damaged; restore it from a good copy"),
            },
        }
    }
}

/// Check `n` bytes out against the claim and the limit.
fn check_len(n: usize, claimed: Option<usize>, limit: usize) -> Result<(), Inflate> {
    match claimed {
        Some(c) if n > c => Err(Inflate::Corrupt(format!("it decompresses to more than the {c} bytes it claims"))),
        Some(c) if n < c => Err(Inflate::Corrupt(format!("it decompresses to {n} bytes, not the {c} it claims"))),
        None if n > limit => Err(Inflate::OverBudget { claimed: n, limit }),
        _ => Ok(()),
    }
}

enum Grow {
    Io(std::io::Error),
    /// An allocation of this many bytes failed.
    Alloc(usize),
}

/// At most `max` bytes of `r`: the buffer grows by doubling but never past `max` (so the
/// memory held is at most twice what was read, and never more than `max`), and each growth
/// may fail as an error rather than abort.
fn read_bounded(r: &mut dyn Read, max: usize) -> Result<Vec<u8>, Grow> {
    let mut out: Vec<u8> = Vec::new();
    let mut len = 0usize;
    loop {
        if len == out.len() {
            if len >= max {
                break;
            }
            // Doubling, but straight to `max` once near it: no last realloc of a buffer as big
            // as the limit for the one byte that tells a stream over it.
            let doubled = len.saturating_mul(2).max(64 << 10);
            let grown = if doubled.saturating_add(64 << 10) >= max { max } else { doubled };
            out.try_reserve_exact(grown - len).map_err(|_| Grow::Alloc(grown))?;
            out.resize(grown, 0);
        }
        match r.read(&mut out[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Grow::Io(e)),
        }
    }
    out.truncate(len);
    Ok(out)
}

/// An empty buffer with room for `n` bytes, or an error if the allocation fails.
fn fallible_vec(n: usize) -> Result<Vec<u8>, Inflate> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Inflate::OverBudget { claimed: n, limit: 0 })?;
    Ok(v)
}

/// The hex digest `algo` (as MosaicML Streaming names hashes: hashlib's and xxhash's names)
/// gives for `data`; `None` for an algorithm this build does not know.
pub(super) fn hex_digest(algo: &str, data: &[u8]) -> Option<String> {
    use sha1::Digest;
    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
    Some(match algo {
        "sha1" => hex(&sha1::Sha1::digest(data)),
        "sha224" => hex(&sha2::Sha224::digest(data)),
        "sha256" => hex(&sha2::Sha256::digest(data)),
        "sha384" => hex(&sha2::Sha384::digest(data)),
        "sha512" => hex(&sha2::Sha512::digest(data)),
        "md5" => hex(&md5::Md5::digest(data)),
        "xxh32" => format!("{:08x}", twox_hash::XxHash32::oneshot(0, data)),
        "xxh64" => format!("{:016x}", twox_hash::XxHash64::oneshot(0, data)),
        "xxh3_64" => format!("{:016x}", twox_hash::XxHash3_64::oneshot(data)),
        "xxh3_128" | "xxh128" => format!("{:032x}", twox_hash::XxHash3_128::oneshot(data)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_the_reference_values() {
        assert_eq!(hex_digest("sha1", b"abc").unwrap(), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(hex_digest("md5", b"").unwrap(), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(hex_digest("xxh64", b"").unwrap(), "ef46db3751d8e999");
        assert_eq!(hex_digest("xxh32", b"").unwrap(), "02cc5d05");
        assert!(hex_digest("whirlpool", b"").is_none());
    }

    #[test]
    fn codecs_round_trip_and_garbage_is_an_error() {
        let data = b"hello hello hello hello".repeat(50);
        let z = zstd::stream::encode_all(&data[..], 3).unwrap();
        assert_eq!(Codec::parse("zstd:7").unwrap().decompress(&z, None, 1 << 20).unwrap(), data);
        assert_eq!(Codec::Zstd.decompress(&z, Some(data.len()), 1 << 20).unwrap(), data);
        let s = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(Codec::Snappy.decompress(&s, None, 1 << 20).unwrap(), data);
        for c in [Codec::Zstd, Codec::Gzip, Codec::Bzip2, Codec::Brotli, Codec::Snappy] {
            assert!(c.decompress(b"definitely not compressed data", None, 1 << 20).is_err(), "{c:?}");
        }
        assert!(Codec::parse("lzma").is_none());
    }

    #[test]
    fn a_legacy_zstd_frame_is_an_error_naming_zstd() {
        // zstd is built without its pre-2016 (v0.1-v0.7) decoders: a frame with v0.7's magic
        // number (0xFD2FB527, little-endian) is refused as damage, not decoded and not a panic.
        let mut legacy = vec![0x27, 0xB5, 0x2F, 0xFD];
        legacy.extend_from_slice(&[0u8; 60]);
        let e = Codec::Zstd.decompress(&legacy, None, 1 << 20).unwrap_err();
        assert!(matches!(&e, Inflate::Corrupt(w) if w.contains("Zstd")), "{e:?}");
    }

    #[test]
    fn bombs_and_lies_are_stopped_within_the_limit() {
        // 64 MiB of zeros compress to a few KB.
        let bomb = zstd::stream::encode_all(&vec![0u8; 64 << 20][..], 19).unwrap();
        assert!(bomb.len() < 10 << 10);
        // Over the budget: stopped at the limit, not decompressed whole.
        let e = Codec::Zstd.decompress(&bomb, None, 1 << 20).unwrap_err();
        assert!(matches!(e, Inflate::OverBudget { limit, .. } if limit == 1 << 20), "{e:?}");
        // A claim smaller than what comes out: damage, found at the claim.
        let e = Codec::Zstd.decompress(&bomb, Some(1000), 1 << 30).unwrap_err();
        assert!(matches!(&e, Inflate::Corrupt(w) if w.contains("more than the 1000")), "{e:?}");
        // A claim over the budget: refused before decompressing.
        let e = Codec::Zstd.decompress(&bomb, Some(usize::MAX / 2), 1 << 20).unwrap_err();
        assert!(matches!(e, Inflate::OverBudget { .. }), "{e:?}");
        // A claim bigger than what comes out: damage too.
        let small = zstd::stream::encode_all(&b"abc"[..], 3).unwrap();
        assert!(matches!(Codec::Zstd.decompress(&small, Some(10), 100), Err(Inflate::Corrupt(_))));
        // Snappy's own header is held to the limit before its buffer exists.
        let s = snap::raw::Encoder::new().compress_vec(&vec![0u8; 4 << 20]).unwrap();
        assert!(matches!(Codec::Snappy.decompress(&s, None, 1 << 20), Err(Inflate::OverBudget { .. })));
        for c in [Codec::Gzip, Codec::Bzip2, Codec::Brotli] {
            let mut z = Vec::new();
            {
                use std::io::Write;
                let zeros = vec![0u8; 8 << 20];
                match c {
                    Codec::Gzip => {
                        let mut w = flate2::write::GzEncoder::new(&mut z, flate2::Compression::best());
                        w.write_all(&zeros).unwrap();
                        w.finish().unwrap();
                    }
                    Codec::Bzip2 => {
                        let mut w = bzip2::write::BzEncoder::new(&mut z, bzip2::Compression::best());
                        w.write_all(&zeros).unwrap();
                        w.finish().unwrap();
                    }
                    _ => {
                        let mut w = brotli::CompressorWriter::new(&mut z, 4096, 9, 22);
                        w.write_all(&zeros).unwrap();
                    }
                }
            }
            assert!(matches!(c.decompress(&z, None, 1 << 20), Err(Inflate::OverBudget { .. })), "{c:?}");
        }
    }
}
