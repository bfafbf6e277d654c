//! How objects are read and written: request and part sizes, requests in flight, retries.

use fastensor_core::size::parse_size;
use fastensor_core::{Error, ErrorKind, Result};
use std::time::Duration;

/// How objects are moved. [`ObjectConfig::from_env`] reads the `FASTENSOR_S3_*` variables
/// over the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectConfig {
    /// Bytes one ranged GET asks for (the last of a read may be shorter).
    pub request_bytes: u64,
    /// Requests (GETs and part uploads) in flight at once per bucket.
    pub concurrency: usize,
    /// Bytes of each part of a multipart upload but the last; at least 5 MiB (S3's minimum),
    /// and an object has at most 10 000 parts, so the default (16 MiB) writes objects up to
    /// 156 GiB; set it higher for larger ones.
    pub part_bytes: u64,
    /// Tries of one request after the first, with exponential backoff, on throttling,
    /// server errors and dropped connections.
    pub retries: usize,
    /// Longest time one request is retried for.
    pub retry_timeout: Duration,
}

/// S3's smallest part but the last.
pub const MIN_PART_BYTES: u64 = 5 << 20;
/// S3's most parts in one upload.
pub const MAX_PARTS: u64 = 10_000;

impl Default for ObjectConfig {
    fn default() -> Self {
        ObjectConfig {
            request_bytes: 8 << 20,
            concurrency: 16,
            part_bytes: 16 << 20,
            retries: 10,
            retry_timeout: Duration::from_secs(180),
        }
    }
}

impl ObjectConfig {
    /// The defaults, each replaced by its environment variable where set:
    /// `FASTENSOR_S3_REQUEST_BYTES`, `FASTENSOR_S3_CONCURRENCY`, `FASTENSOR_S3_PART_BYTES`
    /// (sizes as `8M`, `16MiB` or bytes), `FASTENSOR_S3_RETRIES`. A value that does not
    /// parse, or is out of range, is [`ErrorKind::InvalidInput`] naming the variable.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any variable lookup.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut config = ObjectConfig::default();
        let bad =
            |name: &str, why: String| Error::new(ErrorKind::InvalidInput, format!("{name}: {why}"));
        let size = |name: &str| -> Result<Option<u64>> {
            var(name)
                .map(|v| parse_size(&v).map_err(|e| bad(name, e)))
                .transpose()
        };
        let count = |name: &str| -> Result<Option<usize>> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse::<usize>()
                        .map_err(|e| bad(name, format!("`{v}` is not a count: {e}")))
                })
                .transpose()
        };
        if let Some(v) = size("FASTENSOR_S3_REQUEST_BYTES")? {
            config.request_bytes = v;
        }
        if let Some(v) = count("FASTENSOR_S3_CONCURRENCY")? {
            config.concurrency = v;
        }
        if let Some(v) = size("FASTENSOR_S3_PART_BYTES")? {
            config.part_bytes = v;
        }
        if let Some(v) = count("FASTENSOR_S3_RETRIES")? {
            config.retries = v;
        }
        config
            .check()
            .map_err(|e| bad("FASTENSOR_S3_*", e.to_string()))?;
        Ok(config)
    }

    /// Refuses settings no server takes: empty requests, no concurrency, parts under 5 MiB.
    pub fn check(&self) -> Result<()> {
        let refuse = |why: String| Err(Error::new(ErrorKind::InvalidInput, why));
        if self.request_bytes == 0 {
            return refuse("request_bytes must be at least 1".into());
        }
        if self.concurrency == 0 {
            return refuse("concurrency must be at least 1".into());
        }
        if self.part_bytes < MIN_PART_BYTES {
            return refuse(format!(
                "part_bytes {} is under S3's 5 MiB minimum part",
                self.part_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn variables_replace_defaults() {
        let c = ObjectConfig::from_vars(vars(&[
            ("FASTENSOR_S3_REQUEST_BYTES", "4M"),
            ("FASTENSOR_S3_CONCURRENCY", "32"),
            ("FASTENSOR_S3_PART_BYTES", "64MiB"),
        ]))
        .unwrap();
        assert_eq!(
            (c.request_bytes, c.concurrency, c.part_bytes),
            (4 << 20, 32, 64 << 20)
        );
        assert_eq!(c.retries, ObjectConfig::default().retries);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for bad in [
            &[("FASTENSOR_S3_CONCURRENCY", "many")][..],
            &[("FASTENSOR_S3_CONCURRENCY", "0")][..],
            &[("FASTENSOR_S3_PART_BYTES", "1M")][..],
            &[("FASTENSOR_S3_REQUEST_BYTES", "x")][..],
        ] {
            let pairs: &'static [(&str, &str)] = bad;
            let e = ObjectConfig::from_vars(vars(pairs)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(e.to_string().contains("FASTENSOR_S3_"), "{e}");
        }
    }
}
