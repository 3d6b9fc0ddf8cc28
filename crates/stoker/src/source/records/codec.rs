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

    /// `data` decompressed, expecting about `hint` bytes out (0: unknown).
    pub(super) fn decompress(self, data: &[u8], hint: usize) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(hint);
        let r = match self {
            Codec::Zstd => zstd::stream::read::Decoder::new(data).and_then(|mut d| d.read_to_end(&mut out)),
            Codec::Gzip => flate2::read::MultiGzDecoder::new(data).read_to_end(&mut out),
            Codec::Bzip2 => bzip2::read::MultiBzDecoder::new(data).read_to_end(&mut out),
            Codec::Brotli => brotli::Decompressor::new(data, 64 << 10).read_to_end(&mut out),
            Codec::Snappy => {
                return snap::raw::Decoder::new().decompress_vec(data).map_err(|e| format!("snappy: {e}"));
            }
        };
        r.map(|_| out).map_err(|e| format!("{self:?} data does not decompress: {e}"))
    }
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
        assert_eq!(Codec::parse("zstd:7").unwrap().decompress(&z, 0).unwrap(), data);
        let s = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(Codec::Snappy.decompress(&s, 0).unwrap(), data);
        for c in [Codec::Zstd, Codec::Gzip, Codec::Bzip2, Codec::Brotli, Codec::Snappy] {
            assert!(c.decompress(b"definitely not compressed data", 0).is_err(), "{c:?}");
        }
        assert!(Codec::parse("lzma").is_none());
    }
}
