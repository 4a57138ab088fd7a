//! The S3 implementation: s3s-fs's `FileSystem`, every operation delegated,
//! counted, and `GetObject` intercepted for `If-Match` and the faults.

use std::future::Future;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::StatusCode;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use s3s_fs::FileSystem;

use crate::Listing;
use crate::body::{FaultBody, FileBody};
use crate::{Plan, Shared};

pub(crate) struct Store {
    inner: FileSystem,
    /// The directory `inner` serves (canonical).
    root: PathBuf,
    shared: Arc<Shared>,
    region: String,
}

impl Store {
    pub(crate) fn new(inner: FileSystem, root: PathBuf, shared: Arc<Shared>, region: String) -> Self {
        Store {
            inner,
            root,
            shared,
            region,
        }
    }

    /// The object's file, opened, and where its body starts in it, to read
    /// it faster than s3s-fs does; `None` (keep s3s-fs's body) for a key
    /// that is not a plain relative path.
    async fn open_body(&self, bucket: &str, key: &str, out: &GetObjectOutput) -> Option<(std::fs::File, u64)> {
        let plain = |p: &str| !p.is_empty() && Path::new(p).components().all(|c| matches!(c, Component::Normal(_)));
        if !plain(bucket) || !plain(key) {
            return None;
        }
        // `bytes FIRST-LAST/SIZE` for a range; the whole object otherwise.
        let start = match &out.content_range {
            None => 0,
            Some(r) => r.strip_prefix("bytes ")?.split_once('-')?.0.parse().ok()?,
        };
        let file = tokio::fs::File::open(self.root.join(bucket).join(key)).await.ok()?;
        Some((file.into_std().await, start))
    }

    /// As S3 does, refuse a request signed for another region.
    fn check_region<T>(&self, req: &S3Request<T>) -> S3Result<()> {
        match &req.region {
            Some(r) if r.as_str() != self.region => Err(S3Error::with_message(
                S3ErrorCode::AuthorizationHeaderMalformed,
                format!("the region '{}' is wrong; expecting '{}'", r.as_str(), self.region),
            )),
            _ => Ok(()),
        }
    }

    fn count(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

fn injected_error(status: u16) -> S3Error {
    let code = match status {
        503 => S3ErrorCode::SlowDown,
        500 => S3ErrorCode::InternalError,
        429 => S3ErrorCode::Custom("TooManyRequests".into()),
        _ => S3ErrorCode::Custom("InjectedFault".into()),
    };
    let mut e = S3Error::with_message(code, "fault injected by brand-s3-server");
    e.set_status_code(StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE));
    e
}

/// Delegate an operation to the file system, counting it in `$counter`.
/// Written out as `async_trait` expands an `async fn` (it does not see into
/// a macro call inside the impl).
macro_rules! delegate {
    ($($op:ident($input:ident) -> $output:ident, $counter:ident;)*) => {
        $(
            fn $op<'life0, 'async_trait>(
                &'life0 self,
                req: S3Request<$input>,
            ) -> Pin<Box<dyn Future<Output = S3Result<S3Response<$output>>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move {
                    self.count(&self.shared.counters.$counter);
                    self.check_region(&req)?;
                    self.inner.$op(req).await
                })
            }
        )*
    };
}

#[async_trait::async_trait]
impl S3 for Store {
    delegate! {
        create_bucket(CreateBucketInput) -> CreateBucketOutput, other_requests;
        copy_object(CopyObjectInput) -> CopyObjectOutput, other_requests;
        delete_bucket(DeleteBucketInput) -> DeleteBucketOutput, other_requests;
        delete_object(DeleteObjectInput) -> DeleteObjectOutput, other_requests;
        delete_objects(DeleteObjectsInput) -> DeleteObjectsOutput, other_requests;
        get_bucket_location(GetBucketLocationInput) -> GetBucketLocationOutput, other_requests;
        head_bucket(HeadBucketInput) -> HeadBucketOutput, other_requests;
        head_object(HeadObjectInput) -> HeadObjectOutput, head_requests;
        list_buckets(ListBucketsInput) -> ListBucketsOutput, other_requests;
        list_objects(ListObjectsInput) -> ListObjectsOutput, list_requests;
        put_object(PutObjectInput) -> PutObjectOutput, put_requests;
        create_multipart_upload(CreateMultipartUploadInput) -> CreateMultipartUploadOutput, other_requests;
        upload_part(UploadPartInput) -> UploadPartOutput, put_requests;
        upload_part_copy(UploadPartCopyInput) -> UploadPartCopyOutput, other_requests;
        list_parts(ListPartsInput) -> ListPartsOutput, other_requests;
        complete_multipart_upload(CompleteMultipartUploadInput) -> CompleteMultipartUploadOutput, other_requests;
        abort_multipart_upload(AbortMultipartUploadInput) -> AbortMultipartUploadOutput, other_requests;
    }

    /// s3s-fs's listing, with each object's entity tag as S3's has (s3s-fs
    /// leaves it out), unless the faults ask for a listing untagged or
    /// refused.
    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.count(&self.shared.counters.list_requests);
        self.check_region(&req)?;
        let listing = self.shared.faults.listing();
        if listing == Listing::Denied {
            self.count(&self.shared.counters.errors_injected);
            return Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "listing refused by brand-s3-server",
            ));
        }
        let bucket = req.input.bucket.clone();
        let template = req.clone().map_input(|_| ());
        let mut resp = self.inner.list_objects_v2(req).await?;
        if listing == Listing::Untagged {
            for object in resp.output.contents.iter_mut().flatten() {
                object.e_tag = None;
            }
            return Ok(resp);
        }
        for object in resp.output.contents.iter_mut().flatten() {
            let Some(key) = object.key.clone().filter(|_| object.e_tag.is_none()) else {
                continue;
            };
            let head = HeadObjectInput::builder()
                .bucket(bucket.clone())
                .key(key)
                .build()
                .map_err(|e| S3Error::with_message(S3ErrorCode::InternalError, e.to_string()))?;
            let head = self.inner.head_object(template.clone().map_input(|()| head)).await?;
            object.e_tag = head.output.e_tag;
        }
        Ok(resp)
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let counters = &self.shared.counters;
        self.count(&counters.get_requests);
        self.check_region(&req)?;
        let faults = &self.shared.faults;
        // Subscribed before anything waits, so a release from now on counts.
        let mut release = faults.stall_signal();
        let (delay, stall_first, fail, matched) = faults.take(&req.input.key);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if stall_first {
            self.count(&counters.errors_injected);
            // An error here is the sender gone: the server is stopping.
            let _ = release.changed().await;
        }
        if let Some(status) = fail {
            self.count(&counters.errors_injected);
            return Err(injected_error(status));
        }

        // s3s-fs ignores If-Match on GET: compare with the object's ETag.
        if let Some(cond) = &req.input.if_match {
            let head = HeadObjectInput::builder()
                .bucket(req.input.bucket.clone())
                .key(req.input.key.clone())
                .build()
                .map_err(|e| S3Error::with_message(S3ErrorCode::InternalError, e.to_string()))?;
            let head = self.inner.head_object(req.clone().map_input(|_| head)).await?;
            let matches = cond.is_any()
                || cond
                    .as_etag()
                    .zip(head.output.e_tag.as_ref())
                    .is_some_and(|(want, have)| want.strong_cmp(have));
            if !matches {
                return Err(S3Error::new(S3ErrorCode::PreconditionFailed));
            }
        }
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let mut resp = self.inner.get_object(req).await?;
        let len = resp.output.content_length.and_then(|n| u64::try_from(n).ok());
        if let Some(len) = len
            && let Some((file, start)) = self.open_body(&bucket, &key, &resp.output).await
        {
            resp.output.body = Some(StreamingBlob::new(FileBody::new(file, start, len)));
        }
        let plan = if matched { faults.take_body() } else { Plan::Serve };
        Ok(self.wrap(resp, plan, release))
    }
}

impl Store {
    fn wrap(
        &self,
        mut resp: S3Response<GetObjectOutput>,
        plan: Plan,
        release: tokio::sync::watch::Receiver<u64>,
    ) -> S3Response<GetObjectOutput> {
        if !matches!(plan, Plan::Serve) {
            self.count(&self.shared.counters.errors_injected);
        }
        if let Some(blob) = resp.output.body.take() {
            let body = FaultBody::new(blob, plan, release, Arc::clone(&self.shared));
            resp.output.body = Some(StreamingBlob::new(body));
        }
        resp
    }
}
