//! Where a checkpoint's bytes live: a local file, or an object in object storage named by a
//! URL (`s3://bucket/key`). Every API that takes a path takes either; this module tells them
//! apart, with no I/O, so that code below the checkpoint layer (the opener, the shard index,
//! saves, mapped loads) can decide from the value rather than from a string prefix scattered
//! through the code.

use std::path::Path;

/// The URL schemes of object storage understood as object locations.
pub const OBJECT_SCHEMES: &[&str] = &["s3", "gs", "az", "abfs", "abfss"];

/// A location given as a path: a local file, or an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location<'a> {
    /// A path on a local (or mounted) file system.
    File(&'a Path),
    /// An object in object storage.
    Object(ObjectUrl<'a>),
}

/// An object's URL, split: `scheme://bucket/key`. The key may be empty (a bucket's root, as
/// a prefix) and never starts with `/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectUrl<'a> {
    /// The scheme, one of [`OBJECT_SCHEMES`].
    pub scheme: &'a str,
    /// The bucket.
    pub bucket: &'a str,
    /// The key inside the bucket (`""` for the bucket's root).
    pub key: &'a str,
}

impl<'a> Location<'a> {
    /// What `path` names: an object where it is a URL of an [object scheme](OBJECT_SCHEMES)
    /// with a bucket, a file otherwise (a local file may not be named `s3://…`; `./s3:/x`
    /// reaches one that is).
    pub fn of(path: &'a Path) -> Location<'a> {
        match path.to_str().and_then(ObjectUrl::parse) {
            Some(url) => Location::Object(url),
            None => Location::File(path),
        }
    }
}

impl<'a> ObjectUrl<'a> {
    /// `text` split as `scheme://bucket/key`, or `None` when it is not an object URL (another
    /// scheme, or no bucket).
    pub fn parse(text: &'a str) -> Option<ObjectUrl<'a>> {
        let (scheme, rest) = text.split_once("://")?;
        if !OBJECT_SCHEMES.contains(&scheme) {
            return None;
        }
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return None;
        }
        Some(ObjectUrl {
            scheme,
            bucket,
            key,
        })
    }
}

impl std::fmt::Display for ObjectUrl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}/{}", self.scheme, self.bucket, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_urls_are_told_from_paths() {
        let url = |s: &'static str| Location::of(Path::new(s));
        assert_eq!(
            url("s3://bucket/dir/model.safetensors"),
            Location::Object(ObjectUrl {
                scheme: "s3",
                bucket: "bucket",
                key: "dir/model.safetensors"
            })
        );
        assert!(matches!(url("s3://bucket"), Location::Object(u) if u.key.is_empty()));
        for (text, scheme) in [
            ("gs://b/k", "gs"),
            ("az://c/k", "az"),
            ("abfs://c@a.dfs.x/k", "abfs"),
        ] {
            assert!(
                matches!(url(text), Location::Object(u) if u.scheme == scheme && u.key == "k"),
                "{text}"
            );
        }
        for file in [
            "/tmp/s3://x",
            "s3:/b/k",
            "s3:///k",
            "./s3://b/k",
            "hdfs://b/k",
            "model",
        ] {
            assert!(matches!(url(file), Location::File(_)), "{file}");
        }
    }

    #[test]
    fn keys_are_kept_as_written() {
        for (text, key) in [
            ("s3://b//k", "/k"),
            ("s3://b/a//k", "a//k"),
            ("s3://b/a/", "a/"),
        ] {
            assert_eq!(ObjectUrl::parse(text).unwrap().key, key, "{text}");
        }
    }
}
