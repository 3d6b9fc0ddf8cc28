//! Element types of a batch's columns (what decoding writes into them).

use serde::{Deserialize, Serialize};

/// Element types of decoded columns (numpy's names in serde and messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Dtype {
    /// `bool`, one byte.
    Bool,
    /// `uint8`.
    #[serde(rename = "uint8")]
    U8,
    /// `int8`.
    #[serde(rename = "int8")]
    I8,
    /// `uint16`.
    #[serde(rename = "uint16")]
    U16,
    /// `int16`.
    #[serde(rename = "int16")]
    I16,
    /// `uint32`.
    #[serde(rename = "uint32")]
    U32,
    /// `int32`.
    #[serde(rename = "int32")]
    I32,
    /// `uint64`.
    #[serde(rename = "uint64")]
    U64,
    /// `int64`.
    #[serde(rename = "int64")]
    I64,
    /// `float16` (IEEE half).
    #[serde(rename = "float16")]
    F16,
    /// `float32`.
    #[serde(rename = "float32")]
    F32,
    /// `float64`.
    #[serde(rename = "float64")]
    F64,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// numpy's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::U8 => "uint8",
            Dtype::I8 => "int8",
            Dtype::U16 => "uint16",
            Dtype::I16 => "int16",
            Dtype::U32 => "uint32",
            Dtype::I32 => "int32",
            Dtype::U64 => "uint64",
            Dtype::I64 => "int64",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
        }
    }

    /// DLPack's `(type code, bits)`: 0 int, 1 uint, 2 float, 6 bool.
    pub fn dlpack(self) -> (u8, u8) {
        let bits = (self.size() * 8) as u8;
        match self {
            Dtype::Bool => (6, 8),
            Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => (1, bits),
            Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => (0, bits),
            Dtype::F16 | Dtype::F32 | Dtype::F64 => (2, bits),
        }
    }
}
