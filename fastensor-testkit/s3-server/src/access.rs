//! Who may call: every S3 request must be signed, and a SigV4 signature must name the
//! server's region in its credential scope (as AWS answers `AuthorizationHeaderMalformed`
//! when a client signs for the wrong region). s3s verifies the signature itself before this
//! check runs; it does not compare regions. With `--anonymous`, unsigned requests are
//! served too ([`Anyone`]): how a client of Google Cloud Storage's XML API (the same REST
//! protocol) calls an emulator, with authentication turned off.

use http::{HeaderMap, Uri};
use s3s::access::{S3Access, S3AccessContext};
use s3s::{s3_error, S3Result};

/// The access policy: signed requests only, signed for `region`.
#[derive(Debug)]
pub struct SignedForRegion {
    region: String,
}

impl SignedForRegion {
    /// A policy for the server's `--region`.
    pub fn new(region: String) -> Self {
        Self { region }
    }
}

#[async_trait::async_trait]
impl S3Access for SignedForRegion {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_none() {
            return Err(s3_error!(AccessDenied, "Signature is required"));
        }
        match signed_region(cx.headers(), cx.uri()) {
            Some(region) if region != self.region => Err(s3_error!(
                AuthorizationHeaderMalformed,
                "the region '{region}' is wrong; expecting '{}'",
                self.region
            )),
            _ => Ok(()),
        }
    }
}

/// The access policy of `--anonymous`: every request, signed (and verified) or not.
#[derive(Debug)]
pub struct Anyone;

#[async_trait::async_trait]
impl S3Access for Anyone {
    async fn check(&self, _cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        Ok(())
    }
}

/// The region in a SigV4 credential scope (`AK/DATE/REGION/s3/aws4_request`), from the
/// `Authorization` header or a presigned URL's `X-Amz-Credential`; `None` for other
/// signatures (SigV2, POST forms), which carry no region.
fn signed_region(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    if let Some(auth) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let rest = auth.strip_prefix("AWS4-HMAC-SHA256")?;
        let credential = rest
            .split(',')
            .find_map(|part| part.trim().strip_prefix("Credential="))?;
        return credential.split('/').nth(2).map(str::to_owned);
    }
    let query = uri.query()?;
    let credential = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("X-Amz-Credential="))?;
    let credential = credential.replace("%2F", "/").replace("%2f", "/");
    credential.split('/').nth(2).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_region_in_header_and_query_signatures() {
        let mut headers = HeaderMap::new();
        let uri: Uri = "/b/k".parse().unwrap();
        assert_eq!(signed_region(&headers, &uri), None);

        headers.insert(
            http::header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 Credential=ak/20260101/eu-west-3/s3/aws4_request, \
             SignedHeaders=host;x-amz-date, Signature=abc"
                .parse()
                .unwrap(),
        );
        assert_eq!(signed_region(&headers, &uri).as_deref(), Some("eu-west-3"));

        headers.insert(http::header::AUTHORIZATION, "AWS ak:sig".parse().unwrap());
        assert_eq!(signed_region(&headers, &uri), None);

        let presigned: Uri = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&\
                              X-Amz-Credential=ak%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&\
                              X-Amz-Signature=abc"
            .parse()
            .unwrap();
        assert_eq!(
            signed_region(&HeaderMap::new(), &presigned).as_deref(),
            Some("us-east-1")
        );
    }
}
