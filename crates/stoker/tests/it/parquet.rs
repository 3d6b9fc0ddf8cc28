//! Parquet sources: files written by pyarrow and Hugging Face `datasets`, local and over S3.

#[allow(unused_imports)]
use crate::common;
