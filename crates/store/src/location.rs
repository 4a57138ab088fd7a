//! Where a dataset is: a local directory or an object-storage URL.

use std::path::PathBuf;

use brand_format::error::{Error, Result};

/// A dataset's location as the user gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Dir(PathBuf),
    Url(ObjectUrl),
}

/// Which store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `s3://bucket/prefix` (AWS, or an S3-compatible server at `AWS_ENDPOINT_URL`).
    S3,
    /// `gs://bucket/prefix`.
    Gcs,
    /// `az://container/prefix` (the account from `AZURE_STORAGE_ACCOUNT_NAME`).
    Azure,
    /// `https://host/path` (or `http://`): read only.
    Http,
}

/// An object-storage URL: the store, the bucket (or host, for HTTP) and the
/// prefix the dataset's objects live under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectUrl {
    pub scheme: Scheme,
    /// `s3://bucket`, `gs://bucket`, `az://container` or `https://host[:port]`.
    pub root: String,
    /// The path under the root, without leading or trailing slashes.
    pub prefix: String,
}

impl Location {
    /// [`parse`](Self::parse) of a path argument (a URL given on a command
    /// line arrives as one); a path that is not UTF-8 is a path.
    pub fn of_path(p: &std::path::Path) -> Result<Location> {
        match p.to_str() {
            Some(text) => Self::parse(text),
            None => Ok(Location::Dir(p.to_path_buf())),
        }
    }

    /// A URL with one of the schemes of [`Scheme`], else a path. A URL with
    /// credentials in it (`user:pass@`) or a query string is refused: either
    /// would be a secret printed in every error that names an object.
    pub fn parse(text: &str) -> Result<Location> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(Location::Dir(PathBuf::from(text)));
        };
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "s3" | "s3a" => Scheme::S3,
            "gs" | "gcs" => Scheme::Gcs,
            "az" | "azure" | "abfs" | "abfss" => Scheme::Azure,
            "http" | "https" => Scheme::Http,
            _ => {
                return Err(Error::config(format!(
                    "{scheme}://…: not a store brand reads (s3://, gs://, az://, https://) nor a path"
                )));
            }
        };
        let shown = format!("{}://…", text.split_once("://").map_or("", |p| p.0));
        if rest.contains('?') || rest.contains('#') {
            return Err(Error::config(format!(
                "{shown}: a dataset URL takes no query string or fragment (credentials belong in the environment)"
            )));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.contains('@') {
            return Err(Error::config(format!(
                "{shown}: a dataset URL takes no user or password (credentials belong in the environment)"
            )));
        }
        if authority.is_empty() {
            return Err(Error::config(format!("{text}: no bucket in the URL")));
        }
        let scheme_text = text.split_once("://").map_or("", |p| p.0).to_ascii_lowercase();
        let root = match scheme {
            Scheme::S3 => format!("s3://{authority}"),
            Scheme::Gcs => format!("gs://{authority}"),
            Scheme::Azure => format!("az://{authority}"),
            Scheme::Http => format!("{scheme_text}://{authority}"),
        };
        let prefix = path.trim_matches('/').to_string();
        Ok(Location::Url(ObjectUrl { scheme, root, prefix }))
    }
}

impl ObjectUrl {
    /// The URL of the dataset (its root and prefix).
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            self.root.clone()
        } else {
            format!("{}/{}", self.root, self.prefix)
        }
    }

    /// The object path of `name` under the prefix, as the store names it.
    pub fn object(&self, name: &str) -> object_store::path::Path {
        if self.prefix.is_empty() {
            object_store::path::Path::from(name)
        } else {
            object_store::path::Path::from(format!("{}/{name}", self.prefix))
        }
    }

    /// The full URL of `name` under the prefix (for errors and logs).
    pub fn object_url(&self, name: &str) -> String {
        format!("{}/{name}", self.url())
    }

    /// The bucket (or container, or host).
    pub fn bucket(&self) -> &str {
        self.root.split_once("://").map_or(&self.root, |p| p.1)
    }
}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_urls() {
        assert_eq!(Location::parse("/a/b").unwrap(), Location::Dir("/a/b".into()));
        assert_eq!(Location::parse("rel/dir").unwrap(), Location::Dir("rel/dir".into()));
        let Location::Url(u) = Location::parse("s3://bkt/sets/ds/").unwrap() else {
            panic!("not a url")
        };
        assert_eq!(
            (u.scheme, u.bucket(), u.prefix.as_str()),
            (Scheme::S3, "bkt", "sets/ds")
        );
        assert_eq!(u.object_url("manifest.toml"), "s3://bkt/sets/ds/manifest.toml");
        assert_eq!(u.object("index.bin").as_ref(), "sets/ds/index.bin");
        let Location::Url(u) = Location::parse("gs://b").unwrap() else {
            panic!()
        };
        assert_eq!((u.scheme, u.url()), (Scheme::Gcs, "gs://b".to_string()));
        assert_eq!(u.object("x").as_ref(), "x");
        let Location::Url(u) = Location::parse("https://host:8080/d/e").unwrap() else {
            panic!()
        };
        assert_eq!(
            (u.scheme, u.root.as_str(), u.prefix.as_str()),
            (Scheme::Http, "https://host:8080", "d/e")
        );
    }

    #[test]
    fn secrets_in_urls_are_refused_without_being_repeated() {
        for bad in ["s3://AKIA:SECRET@bkt/ds", "https://h/ds?sig=SECRET"] {
            let e = Location::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("SECRET"), "{e}");
        }
        assert!(Location::parse("ftp://x/y").is_err());
        assert!(Location::parse("s3:///ds").is_err());
    }
}
