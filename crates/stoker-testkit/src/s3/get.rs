//! GetObject bodies streamed in large reads.
//!
//! `s3s-fs` 0.14.1 streams a GetObject body through `ReaderStream::with_capacity(file, 4096)`:
//! one tokio file read (a blocking-pool round trip) per 4 KiB, about 50 MiB/s a stream on
//! our machines, so any benchmark of large reads measured the server. [`LargeReads`] serves
//! every operation with `s3s-fs` and replaces only the body of a successful GetObject with
//! one read in `read_bytes` chunks over the same byte span. Status, headers (ETag,
//! Content-Length, Content-Range, checksums, metadata) and errors (NoSuchKey, InvalidRange)
//! all still come from `s3s-fs`, so nothing but the read size changes.

use std::io::SeekFrom;
use std::path::{Component, Path, PathBuf};

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3Request, S3Response, S3Result, S3};
use s3s_fs::FileSystem;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

/// `s3s-fs` with GetObject bodies read `read_bytes` at a time.
pub(super) struct LargeReads {
    fs: FileSystem,
    /// The served directory, canonical, as `s3s-fs` resolves keys under it.
    root: PathBuf,
    read_bytes: usize,
}

impl LargeReads {
    pub(super) fn new(fs: FileSystem, root: &Path, read_bytes: usize) -> std::io::Result<Self> {
        Ok(Self { fs, root: root.canonicalize()?, read_bytes: read_bytes.max(4096) })
    }

    async fn get_object_large(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let (bucket, key, range) = (req.input.bucket.clone(), req.input.key.clone(), req.input.range);
        // s3s-fs validates the key and range and computes every header; its body is lazy (no
        // byte is read until polled), so dropping it below costs one open file.
        let mut resp = self.fs.get_object(req).await?;
        let Some(path) = object_path(&self.root, &bucket, &key) else {
            // A key s3s-fs accepted but this lexical resolution does not: keep its own body.
            return Ok(resp);
        };
        let mut file = tokio::fs::File::open(&path).await.map_err(|e| s3_error!(e, NoSuchKey))?;
        let len = file.metadata().await.map_err(S3Error::internal_error)?.len();
        let span = match range {
            None => 0..len,
            Some(r) => r.check(len)?,
        };
        if resp.output.content_length != i64::try_from(span.end - span.start).ok() {
            // The file changed between s3s-fs's open and ours: the headers would not match.
            return Err(s3_error!(InternalError, "the object changed while it was being read; retry"));
        }
        file.seek(SeekFrom::Start(span.start)).await.map_err(S3Error::internal_error)?;
        let body = ReaderStream::with_capacity(file.take(span.end - span.start), self.read_bytes);
        resp.output.body = Some(StreamingBlob::wrap(body));
        Ok(resp)
    }
}

/// `root/bucket/key` with `.` and `..` resolved lexically, as `s3s-fs` resolves it (`None` if
/// it would leave `root`).
fn object_path(root: &Path, bucket: &str, key: &str) -> Option<PathBuf> {
    let mut out = root.to_path_buf();
    let mut depth = 0usize;
    for c in Path::new(bucket).join(key).components() {
        match c {
            Component::Normal(part) => {
                out.push(part);
                depth += 1;
            }
            Component::CurDir => {}
            Component::ParentDir => {
                depth = depth.checked_sub(1)?;
                out.pop();
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Implements [`S3`] for [`LargeReads`]: GetObject as above, every operation `s3s-fs`
/// implements forwarded to it unchanged (the rest keep the trait's NotImplemented).
macro_rules! forward_to_s3s_fs {
    ($($op:ident: $input:ident -> $output:ident;)*) => {
        #[async_trait::async_trait]
        impl S3 for LargeReads {
            async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
                self.get_object_large(req).await
            }
            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.fs.$op(req).await
                }
            )*
        }
    };
}

forward_to_s3s_fs! {
    create_bucket: CreateBucketInput -> CreateBucketOutput;
    copy_object: CopyObjectInput -> CopyObjectOutput;
    delete_bucket: DeleteBucketInput -> DeleteBucketOutput;
    delete_object: DeleteObjectInput -> DeleteObjectOutput;
    delete_objects: DeleteObjectsInput -> DeleteObjectsOutput;
    get_bucket_location: GetBucketLocationInput -> GetBucketLocationOutput;
    head_bucket: HeadBucketInput -> HeadBucketOutput;
    head_object: HeadObjectInput -> HeadObjectOutput;
    list_buckets: ListBucketsInput -> ListBucketsOutput;
    list_objects: ListObjectsInput -> ListObjectsOutput;
    list_objects_v2: ListObjectsV2Input -> ListObjectsV2Output;
    put_object: PutObjectInput -> PutObjectOutput;
    create_multipart_upload: CreateMultipartUploadInput -> CreateMultipartUploadOutput;
    upload_part: UploadPartInput -> UploadPartOutput;
    upload_part_copy: UploadPartCopyInput -> UploadPartCopyOutput;
    list_parts: ListPartsInput -> ListPartsOutput;
    complete_multipart_upload: CompleteMultipartUploadInput -> CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput -> AbortMultipartUploadOutput;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_resolve_inside_the_root_only() {
        let root = Path::new("/srv");
        assert_eq!(object_path(root, "b", "a/./c/../d"), Some(PathBuf::from("/srv/b/a/d")));
        assert_eq!(object_path(root, "b", "../b2/x"), Some(PathBuf::from("/srv/b2/x")));
        assert_eq!(object_path(root, "b", "../../x"), None);
        assert_eq!(object_path(root, "b", "/etc/passwd"), None);
    }
}
