//! The admin interface under `/_admin/` (no auth; loopback only), in front
//! of the S3 service on the same port. No bucket can be named `_admin`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use s3s::service::S3Service;
use s3s::{Body, HttpError, HttpResponse};

use crate::{Listing, Shared};

#[derive(Clone)]
pub(crate) struct Service {
    s3: S3Service,
    shared: Arc<Shared>,
}

impl Service {
    pub(crate) fn new(s3: S3Service, shared: Arc<Shared>) -> Self {
        Service { s3, shared }
    }
}

type Fut = Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = HttpResponse;
    type Error = HttpError;
    type Future = Fut;

    fn call(&self, req: Request<Incoming>) -> Fut {
        match req.uri().path().strip_prefix("/_admin/") {
            Some(cmd) => {
                let (status, body) = admin(&self.shared, req.method(), cmd, req.uri().query().unwrap_or(""));
                let resp = Response::builder()
                    .status(status)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body))
                    .map_err(|e| HttpError::new(Box::new(e)));
                Box::pin(async move { resp })
            }
            None => hyper::service::Service::call(&self.s3, req),
        }
    }
}

fn admin(shared: &Shared, method: &Method, cmd: &str, query: &str) -> (StatusCode, String) {
    let faults = &shared.faults;
    match (method, cmd) {
        (&Method::GET, "stats") => match serde_json::to_string(&shared.counters.snapshot()) {
            Ok(json) => (StatusCode::OK, json),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, error(&e.to_string())),
        },
        (&Method::GET, "faults") => (StatusCode::OK, faults.to_json()),
        (&Method::POST, "reset-stats") => {
            shared.counters.reset();
            ok()
        }
        (&Method::POST, "clear") => {
            faults.clear();
            ok()
        }
        (&Method::POST, "release-stalls") => {
            faults.release_stalls();
            ok()
        }
        (&Method::POST, "faults") => match set_faults(shared, query) {
            Ok(()) => (StatusCode::OK, faults.to_json()),
            Err(msg) => (StatusCode::BAD_REQUEST, error(&msg)),
        },
        _ => (StatusCode::NOT_FOUND, error("no such admin command")),
    }
}

fn ok() -> (StatusCode, String) {
    (StatusCode::OK, "{\"ok\":true}".to_owned())
}

fn error(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

/// `fail=N&status=S`, `cut=N&after=B`, `stall=N&after=B`,
/// `trickle=N&after=B&rate=BYTES_PER_SEC`, `flip=N&after=B`, `stall_all=1|0`,
/// `listing=tagged|untagged|denied`,
/// `delay_ms=D`, `key_filter=SUBSTR` (empty: none); several may be given.
fn set_faults(shared: &Shared, query: &str) -> Result<(), String> {
    let params: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect::<Result<_, String>>()?;
    let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let num = |name: &str, default: u64| -> Result<u64, String> {
        get(name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| format!("{name}: not a number: {v:?}"))
        })
    };
    if let Some((k, _)) = params.iter().find(|(k, _)| {
        ![
            "fail",
            "status",
            "cut",
            "after",
            "stall",
            "stall_all",
            "listing",
            "trickle",
            "rate",
            "flip",
            "delay_ms",
            "key_filter",
        ]
        .contains(&k.as_str())
    }) {
        return Err(format!("unknown parameter {k:?}"));
    }
    if ["cut", "stall", "trickle", "flip"]
        .iter()
        .filter(|k| get(k).is_some())
        .count()
        > 1
    {
        return Err("cut, stall, trickle and flip take one `after` each: set them in separate requests".to_owned());
    }
    let f = &shared.faults;
    // Everything parsed before anything is set.
    let status = u16::try_from(num("status", 503)?).map_err(|_| "status: out of range".to_owned())?;
    if !(100..=999).contains(&status) {
        return Err("status: out of range".to_owned());
    }
    let after = num("after", 0)?;
    let fail = get("fail").map(|_| num("fail", 0)).transpose()?;
    let cut = get("cut").map(|_| num("cut", 0)).transpose()?;
    let stall = get("stall").map(|_| num("stall", 0)).transpose()?;
    let trickle = get("trickle").map(|_| num("trickle", 0)).transpose()?;
    let rate = num("rate", 16 << 10)?;
    let flip = get("flip").map(|_| num("flip", 0)).transpose()?;
    let switch = |name: &str| match get(name) {
        None => Ok(None),
        Some("1" | "true") => Ok(Some(true)),
        Some("0" | "false") => Ok(Some(false)),
        Some(v) => Err(format!("{name}: 1 or 0, not {v:?}")),
    };
    let stall_all = switch("stall_all")?;
    let listing = match get("listing") {
        None => None,
        Some("tagged") => Some(Listing::Tagged),
        Some("untagged") => Some(Listing::Untagged),
        Some("denied") => Some(Listing::Denied),
        Some(v) => return Err(format!("listing: tagged, untagged or denied, not {v:?}")),
    };
    let delay = get("delay_ms").map(|_| num("delay_ms", 0)).transpose()?;
    if let Some(n) = fail {
        f.fail_gets(n, status);
    }
    if let Some(n) = cut {
        f.cut_bodies(n, after);
    }
    if let Some(n) = stall {
        f.stall_gets(n, after);
    }
    if let Some(n) = trickle {
        f.trickle_bodies(n, after, rate);
    }
    if let Some(n) = flip {
        f.flip_bytes(n, after);
    }
    if let Some(on) = stall_all {
        f.stall_all(on);
    }
    if let Some(listing) = listing {
        f.set_listing(listing);
    }
    if let Some(ms) = delay {
        f.delay_gets(Duration::from_millis(ms));
    }
    if let Some(filter) = get("key_filter") {
        f.set_key_filter((!filter.is_empty()).then_some(filter));
    }
    Ok(())
}

/// Percent-decoding (and `+` as a space) of one query component.
fn decode(s: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [bytes.next(), bytes.next()];
                let hex = match hex {
                    [Some(h), Some(l)] => [h, l],
                    _ => return Err(format!("bad escape in {s:?}")),
                };
                let hex = std::str::from_utf8(&hex).map_err(|_| format!("bad escape in {s:?}"))?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad escape in {s:?}"))?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).map_err(|_| format!("not UTF-8: {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn decodes_query_components() {
        assert_eq!(decode("data-%2Fx+y").as_deref(), Ok("data-/x y"));
        assert!(decode("%2").is_err());
        assert!(decode("%zz").is_err());
    }
}
