//! What a failed request means: object_store's error read for its cause
//! (a status, an S3 code, a refused connection, a TLS handshake), whether
//! another attempt can help, and what the user should check; the error
//! that names the object, the range and the last cause.

use std::ops::Range;

use brand_format::error::Error;

use crate::connect::redact;

/// Why one attempt failed.
#[derive(Debug)]
pub(super) struct Failure {
    /// For the counters: a status ("503"), "connect", "tls", "reset", "stall", "cut", "slow", "range".
    pub(super) cause: String,
    pub(super) retryable: bool,
    pub(super) kind: std::io::ErrorKind,
    pub(super) what: String,
}

impl Failure {
    pub(super) fn new(
        cause: impl Into<String>,
        retryable: bool,
        kind: std::io::ErrorKind,
        what: impl Into<String>,
    ) -> Self {
        Failure {
            cause: cause.into(),
            retryable,
            kind,
            what: what.into(),
        }
    }

    pub(super) fn throttle(&self) -> bool {
        self.cause == "503" || self.cause == "429"
    }
}

/// What an object_store error means here. Its text names the request (no
/// credentials: they travel in headers, and query strings are redacted).
pub(super) fn classify(e: &object_store::Error) -> Failure {
    use std::io::ErrorKind as K;
    let text = redact(&e.to_string());
    let code = s3_code(&text);
    let with_code = |what: &str| match &code {
        Some(c) => format!("{what} ({c})"),
        None => what.to_string(),
    };
    match e {
        object_store::Error::NotFound { .. } => {
            let what = if text.contains("NoSuchBucket") {
                "the bucket does not exist"
            } else {
                "no such object"
            };
            Failure::new("404", false, K::NotFound, with_code(what))
        }
        object_store::Error::Precondition { .. } => Failure::new(
            "412",
            false,
            K::InvalidData,
            "the object changed since the dataset was opened (its entity tag differs)",
        ),
        // A server that ignores Range (a plain HTTP file server) or answers
        // other bytes than asked will do so every time.
        object_store::Error::NotSupported { .. } => Failure::new(
            "range",
            false,
            K::Unsupported,
            "the server does not answer byte ranges (HTTP Range; it sent the whole object): \
             brand reads a dataset only from a server that does",
        ),
        _ if text.contains("non-partial response")
            || text.contains("Content-Range")
            || text.contains("CONTENT_RANGE")
            || (text.contains("Requested ") && text.contains(", got ")) =>
        {
            Failure::new(
                "range",
                false,
                K::InvalidData,
                format!("the store answered other bytes than the range asked for: {text}"),
            )
        }
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => Failure::new(
            "403",
            false,
            K::PermissionDenied,
            with_code("access refused: check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, …)"),
        ),
        _ => {
            let status = http_status(&text).or_else(|| {
                if text.contains("SlowDown") {
                    Some(503)
                } else if text.contains("InternalError") {
                    Some(500)
                } else {
                    None
                }
            });
            match status {
                Some(401 | 403) => Failure::new(
                    "403",
                    false,
                    K::PermissionDenied,
                    with_code("access refused: check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, …)"),
                ),
                Some(s) => {
                    // 501 and 505 say what the server cannot do, every time.
                    let retryable = (s >= 500 && s != 501 && s != 505) || s == 429 || s == 408;
                    // A HEAD's answer has no body to name the cause: S3 answers a
                    // request signed for another region than the bucket's 400
                    // (AuthorizationHeaderMalformed) or 301.
                    let hint = match (s, code.as_deref()) {
                        (400, None | Some("AuthorizationHeaderMalformed")) | (301, _) => {
                            "; with S3, most often AWS_REGION is not the bucket's region"
                        }
                        _ => "",
                    };
                    Failure::new(
                        s.to_string(),
                        retryable,
                        K::Other,
                        format!("{}{hint}", with_code(&format!("the store answered {s}"))),
                    )
                }
                None => {
                    // object_store's text stops at "error sending request":
                    // the cause (refused, DNS, TLS, reset) is further down.
                    let text = redact(&with_sources(e));
                    if let Some(hint) = tls_refused(&text) {
                        Failure::new("tls", false, K::InvalidData, format!("{text}: {hint}"))
                    } else if refused(e) {
                        Failure::new("connect", true, K::ConnectionRefused, text)
                    } else {
                        Failure::new("reset", true, K::ConnectionReset, text)
                    }
                }
            }
        }
    }
}

/// What went wrong in a request, as a message names it: the cause found
/// under object_store's text (refused, DNS, TLS) and what to check.
pub(crate) fn describe(e: &object_store::Error) -> String {
    classify(e).what
}

/// What to do about a TLS handshake that failed (rustls's words in
/// `text`), or `None` for another failure. It fails the same way every
/// time, so it is not retried: before, ten retries took 20 s to say
/// "UnknownIssuer" under a cause of "reset".
fn tls_refused(text: &str) -> Option<&'static str> {
    if text.contains("invalid peer certificate") {
        Some(
            "the server's TLS certificate is not trusted; one a private authority signed needs that \
             authority's certificate named: AWS_CA_BUNDLE=FILE (s3://) or SSL_CERT_FILE=FILE (any URL)",
        )
    } else if [
        "received corrupt message",
        "received fatal alert",
        "peer is incompatible",
        "peer misbehaved",
    ]
    .iter()
    .any(|m| text.contains(m))
    {
        Some(
            "no TLS handshake with the server; one that serves plain HTTP is named http:// \
             (with AWS_ALLOW_HTTP=true or GOOGLE_ALLOW_HTTP=true)",
        )
    } else {
        None
    }
}

/// An error's text followed by each of its sources' that adds to it.
fn with_sources(e: &(dyn std::error::Error + 'static)) -> String {
    chain(e).skip(1).fold(e.to_string(), |text, s| {
        let more = s.to_string();
        if text.contains(&more) {
            text
        } else {
            format!("{text}: {more}")
        }
    })
}

/// An error and its sources, outermost first.
fn chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |s| s.source())
}

/// Whether a connection could not be made at all (refused, or no such host).
fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    chain(e).any(|s| {
        s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| matches!(io.kind(), K::ConnectionRefused | K::HostUnreachable))
            || s.to_string().contains("dns error")
    })
}

/// The HTTP status in object_store's "status code: 503 …" text.
fn http_status(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

/// An S3 error code (`<Code>SlowDown</Code>`) in a message.
fn s3_code(text: &str) -> Option<String> {
    let start = text.find("<Code>")? + "<Code>".len();
    let end = text[start..].find("</Code>")? + start;
    Some(text[start..end].to_string())
}

pub(super) fn object_error(url: &str, range: Option<&Range<u64>>, f: &Failure, retries: u32) -> Error {
    let range = range
        .map(|r| format!("bytes {}..{}: ", r.start, r.end))
        .unwrap_or_default();
    let tail = if retries > 0 {
        format!(" (after {retries} retries; last cause: {})", f.cause)
    } else {
        String::new()
    };
    Error::io(url, std::io::Error::new(f.kind, format!("{range}{}{tail}", f.what)))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn tls_handshakes_that_fail_are_told_apart_from_resets() {
        let cert = "error sending request: client error (Connect): invalid peer certificate: UnknownIssuer";
        assert!(tls_refused(cert).is_some_and(|h| h.contains("AWS_CA_BUNDLE")));
        let plain = "client error (Connect): received corrupt message of type InvalidContentType";
        assert!(tls_refused(plain).is_some_and(|h| h.contains("http://")));
        assert_eq!(
            tls_refused("client error (SendRequest): connection reset by peer"),
            None
        );
    }

    #[test]
    fn statuses_and_codes_are_found_in_messages() {
        assert_eq!(
            http_status(
                "Error performing GET x in 1ms - Server returned non-2xx status code: 503 Service Unavailable: "
            ),
            Some(503)
        );
        assert_eq!(http_status("connection reset"), None);
        assert_eq!(
            s3_code("<Error><Code>SlowDown</Code></Error>").as_deref(),
            Some("SlowDown")
        );
    }
}
