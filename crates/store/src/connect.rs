//! A client for an object-storage URL, configured the way users already
//! configure their cloud's tools:
//!
//! * S3: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//!   `AWS_REGION`/`AWS_DEFAULT_REGION`, web identity
//!   (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`), ECS/EKS container
//!   credentials and instance metadata (object_store's chain), and, where
//!   the environment gives no keys, the static keys and region of
//!   `AWS_PROFILE` (default `default`) in `~/.aws/credentials` and
//!   `~/.aws/config` (`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`).
//!   SSO and assume-role profiles are not read. `AWS_ENDPOINT_URL` (or the
//!   profile's `endpoint_url`) names an S3-compatible server (MinIO, Ceph,
//!   R2, s3s): requests are path-style; a plain-HTTP endpoint needs
//!   `AWS_ALLOW_HTTP=true`; one whose certificate a private authority
//!   signed, that authority's PEM in `AWS_CA_BUNDLE` (or the profile's
//!   `ca_bundle`), added to the system's. `SSL_CERT_FILE` replaces the
//!   system's authorities for every scheme (rustls-native-certs).
//! * GCS: `GOOGLE_SERVICE_ACCOUNT`/`GOOGLE_APPLICATION_CREDENTIALS`, else the
//!   metadata server. An emulator: `STORAGE_EMULATOR_HOST` (`host:port` or
//!   a URL, as Google's client libraries take it; requests unsigned), or
//!   `GOOGLE_BASE_URL` with credentials as above (plain HTTP needs
//!   `GOOGLE_ALLOW_HTTP=true`). The server must speak GCS's XML API, which
//!   object_store uses. Azure: `AZURE_STORAGE_ACCOUNT_NAME` with a key, SAS,
//!   client secret, workload or managed identity.
//!
//! object_store's own retries are off (brand's [`get`](crate::get) retries,
//! resumes and counts), and so is its 30 s total timeout, which cut healthy
//! large GETs elsewhere: a GET is bounded by its stall timeout instead.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use brand_format::error::{Error, Result};
use object_store::ObjectStore;
use object_store::{ClientConfigKey, RetryConfig};

use crate::get::policy::GetPolicy;

use crate::location::{ObjectUrl, Scheme};

/// A connected store and the URL it serves.
#[derive(Clone)]
pub struct Connection {
    pub url: ObjectUrl,
    pub store: Arc<dyn ObjectStore>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the store's own Debug: its builder holds the credentials.
        write!(f, "Connection({})", self.url)
    }
}

/// The least stall timeout of an upload's requests (see
/// [`Connection::for_upload`]).
pub const UPLOAD_STALL: Duration = Duration::from_secs(30);

/// How long a connection may take to open.
const CONNECT_TIMEOUT: &str = "10s";

impl Connection {
    /// A client for `url` from the environment. Nothing is sent yet: a
    /// missing bucket or refused credentials show at the first request.
    pub fn new(url: &ObjectUrl, stall: Duration) -> Result<Connection> {
        Self::with_retries(
            url,
            stall,
            RetryConfig {
                max_retries: 0,
                ..Default::default()
            },
        )
    }

    /// A client that retries by itself, as `policy` says (its retries and
    /// backoff, within object_store's 3 minutes a request): for uploads,
    /// whose parts brand does not resume. A part is answered only once it
    /// is all sent, so an upload waits at least [`UPLOAD_STALL`] for it.
    pub fn for_upload(url: &ObjectUrl, policy: &GetPolicy) -> Result<Connection> {
        let retries = RetryConfig {
            max_retries: policy.retries as usize,
            backoff: object_store::BackoffConfig {
                init_backoff: policy.backoff,
                max_backoff: policy.backoff_max,
                base: 2.0,
            },
            ..RetryConfig::default()
        };
        Self::with_retries(url, policy.stall.max(UPLOAD_STALL), retries)
    }

    fn with_retries(url: &ObjectUrl, stall: Duration, retries: RetryConfig) -> Result<Connection> {
        let store = build(url, stall, retries).map_err(|why| Error::config(format!("{url}: {why}")))?;
        Ok(Connection {
            url: url.clone(),
            store,
        })
    }
}

fn build(url: &ObjectUrl, stall: Duration, retries: RetryConfig) -> std::result::Result<Arc<dyn ObjectStore>, String> {
    // Twice the stall timeout: get.rs's own stall timeout fires first and names it.
    let read_timeout = format!("{}ms", stall.as_millis().saturating_mul(2).max(1));
    let client = [
        (ClientConfigKey::ConnectTimeout, CONNECT_TIMEOUT.to_string()),
        // The whole request: long, because a GET is bounded by its stall
        // timeout (read_timeout here, and get.rs's per frame) instead.
        (ClientConfigKey::Timeout, "1h".to_string()),
        (ClientConfigKey::ReadTimeout, read_timeout),
        (ClientConfigKey::PoolIdleTimeout, "30s".to_string()),
    ];
    let clean = |e: object_store::Error| redact(&e.to_string());
    macro_rules! from_env {
        ($builder:ty, $key:ty) => {{
            let mut b = <$builder>::from_env();
            for (k, v) in client {
                b = b.with_config(<$key>::Client(k), v);
            }
            Arc::new(
                b.with_url(url.root.clone())
                    .with_retry(retries.clone())
                    .build()
                    .map_err(clean)?,
            )
        }};
    }
    let store: Arc<dyn ObjectStore> = match url.scheme {
        Scheme::S3 => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as K};
            let mut b = AmazonS3Builder::from_env();
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            let p = aws_profile();
            if env("AWS_ACCESS_KEY_ID").is_none()
                && env("AWS_WEB_IDENTITY_TOKEN_FILE").is_none()
                && env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_none()
                && env("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_none()
            {
                if let (Some(id), Some(secret)) = (p.get("aws_access_key_id"), p.get("aws_secret_access_key")) {
                    b = b.with_access_key_id(id).with_secret_access_key(secret);
                    if let Some(t) = p.get("aws_session_token") {
                        b = b.with_token(t);
                    }
                }
                if env("AWS_REGION").is_none()
                    && env("AWS_DEFAULT_REGION").is_none()
                    && let Some(r) = p.get("region")
                {
                    b = b.with_region(r);
                }
                if env("AWS_ENDPOINT_URL").is_none()
                    && env("AWS_ENDPOINT").is_none()
                    && let Some(e) = p.get("endpoint_url")
                {
                    b = b.with_endpoint(e);
                }
            }
            if let Some(region) = env("AWS_DEFAULT_REGION").filter(|_| env("AWS_REGION").is_none()) {
                b = b.with_region(region);
            }
            let endpoint = b.get_config_value(&K::Endpoint).unwrap_or_default();
            let allow_http = b
                .get_config_value(&K::Client(ClientConfigKey::AllowHttp))
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            if endpoint.to_ascii_lowercase().starts_with("http://") && !allow_http {
                return Err(format!(
                    "the endpoint {} is plain HTTP; set AWS_ALLOW_HTTP=true to allow it",
                    redact(&endpoint)
                ));
            }
            // The client's settings whole, as from_env read them, with
            // brand's and the CA bundle's over them (root certificates have
            // no config key: only a whole ClientOptions carries them).
            let mut opts = object_store::ClientOptions::new();
            // vars_os: env::vars panics on a variable that is not UTF-8.
            for (key, value) in std::env::vars_os() {
                if let (Some(key), Some(value)) = (key.to_str(), value.to_str())
                    && key.starts_with("AWS_")
                    && let Ok(K::Client(k)) = key.to_ascii_lowercase().parse::<K>()
                {
                    opts = opts.with_config(k, value);
                }
            }
            for (k, v) in client {
                opts = opts.with_config(k, v);
            }
            // As the AWS CLI and boto3 take it: the environment's, else the
            // profile's. Added to the system's authorities, not instead.
            let bundle = match (env("AWS_CA_BUNDLE"), p.get("ca_bundle")) {
                (Some(path), _) => Some((path, "AWS_CA_BUNDLE".to_string())),
                (None, Some(path)) => Some((path.clone(), format!("ca_bundle of the AWS profile {}", profile_name()))),
                (None, None) => None,
            };
            if let Some((path, named_by)) = bundle {
                for cert in ca_bundle(std::path::Path::new(&path), &named_by)? {
                    opts = opts.with_root_certificate(cert);
                }
            }
            Arc::new(
                b.with_client_options(opts)
                    .with_url(url.root.clone())
                    .with_bucket_name(url.bucket())
                    .with_retry(retries.clone())
                    .build()
                    .map_err(clean)?,
            )
        }
        Scheme::Gcs => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey as K};
            let mut b = GoogleCloudStorageBuilder::from_env();
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            match (env("GOOGLE_BASE_URL"), env("STORAGE_EMULATOR_HOST")) {
                // Google's own client libraries send an emulator's requests,
                // unsigned, to STORAGE_EMULATOR_HOST; so does brand, unless
                // GOOGLE_BASE_URL names the server itself.
                (None, Some(host)) => {
                    let base = if host.contains("://") {
                        host
                    } else {
                        format!("http://{host}")
                    };
                    b = b
                        .with_config(K::BaseUrl, base.trim_end_matches('/'))
                        .with_config(K::SkipSignature, "true");
                }
                // object_store allows plain HTTP for GCS by default; a bearer
                // token must not cross it unasked, as S3's keys do not.
                (Some(base), _)
                    if base.to_ascii_lowercase().starts_with("http://")
                        && !env("GOOGLE_ALLOW_HTTP").is_some_and(|v| v.eq_ignore_ascii_case("true")) =>
                {
                    return Err(format!(
                        "the endpoint {} is plain HTTP; set GOOGLE_ALLOW_HTTP=true to allow it",
                        redact(&base)
                    ));
                }
                _ => {}
            }
            if b.get_config_value(&K::SkipSignature)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
            {
                // object_store 0.14 skips the signature on GETs, HEADs,
                // listings and DELETEs but still asks the metadata server for
                // a token to PUT with: an empty one, as `disable_oauth` gives.
                b = b.with_credentials(Arc::new(object_store::StaticCredentialProvider::new(
                    object_store::gcp::GcpCredential { bearer: String::new() },
                )));
            }
            for (k, v) in client {
                b = b.with_config(K::Client(k), v);
            }
            Arc::new(
                b.with_url(url.root.clone())
                    .with_retry(retries.clone())
                    .build()
                    .map_err(clean)?,
            )
        }
        // Azure: its builder from the environment, the client settings over it.
        Scheme::Azure => from_env!(
            object_store::azure::MicrosoftAzureBuilder,
            object_store::azure::AzureConfigKey
        ),
        Scheme::Http => {
            let mut opts = object_store::ClientOptions::new();
            for (k, v) in client {
                opts = opts.with_config(k, v);
            }
            if url.root.starts_with("http://") {
                opts = opts.with_allow_http(true);
            }
            Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(url.root.clone())
                    .with_client_options(opts)
                    .with_retry(retries.clone())
                    .build()
                    .map_err(clean)?,
            )
        }
    };
    Ok(store)
}

/// The keys of the profile `AWS_PROFILE` (default `default`): the
/// credentials file's section over the config file's (`[profile NAME]`
/// there, `[default]` for the default). Unreadable files give nothing.
fn aws_profile() -> HashMap<String, String> {
    let name = profile_name();
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let file = |var: &str, default: &str| std::env::var_os(var).map(PathBuf::from).unwrap_or(home.join(default));
    let config_section = if name == "default" {
        "default".to_string()
    } else {
        format!("profile {name}")
    };
    let mut keys = ini_section(&file("AWS_CONFIG_FILE", ".aws/config"), &config_section);
    keys.extend(ini_section(
        &file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"),
        &name,
    ));
    keys
}

fn profile_name() -> String {
    std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string())
}

/// The certificates of a PEM bundle `named_by` names (a private
/// authority's, for an S3-compatible server on HTTPS).
fn ca_bundle(path: &std::path::Path, named_by: &str) -> std::result::Result<Vec<object_store::Certificate>, String> {
    let what = |why: String| format!("{} ({named_by}): {why}", path.display());
    let pem = std::fs::read(path).map_err(|e| what(e.to_string()))?;
    let certs = object_store::Certificate::from_pem_bundle(&pem).map_err(|e| what(e.to_string()))?;
    if certs.is_empty() {
        return Err(what(
            "no certificate in it (PEM: -----BEGIN CERTIFICATE-----)".to_string(),
        ));
    }
    Ok(certs)
}

/// `key = value` lines of `[section]` in an INI file.
fn ini_section(path: &std::path::Path, section: &str) -> HashMap<String, String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return HashMap::new();
    };
    parse_ini_section(&text, section)
}

fn parse_ini_section(text: &str, section: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// `text` with the query string of every URL in it replaced: a signed or
/// SAS URL carries its secret there. Messages from the HTTP client name
/// the request's URL.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ')')
            .unwrap_or(tail.len());
        let url = &tail[..end];
        match url.split_once('?') {
            Some((base, _)) => {
                out.push_str(base);
                out.push_str("?<redacted>");
            }
            None => out.push_str(url),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_read_by_section() {
        let text = "[default]\naws_access_key_id = A\n# c\n[profile other]\nregion=eu-west-1\n[other]\naws_secret_access_key = S\n";
        let d = parse_ini_section(text, "default");
        assert_eq!(d.get("aws_access_key_id").map(String::as_str), Some("A"));
        assert_eq!(d.len(), 1);
        assert_eq!(
            parse_ini_section(text, "profile other")
                .get("region")
                .map(String::as_str),
            Some("eu-west-1")
        );
        assert_eq!(parse_ini_section(text, "other").len(), 1);
    }

    #[test]
    fn query_strings_are_redacted() {
        let s = redact("error sending request for url (https://a.blob/x?sig=SECRET&se=1): reset");
        assert_eq!(s, "error sending request for url (https://a.blob/x?<redacted>): reset");
        assert_eq!(redact("no url here"), "no url here");
        assert_eq!(redact("http://h/p and s3://b/k"), "http://h/p and s3://b/k");
    }
}
