//! SigV4 signing of S3 requests with `aws-sigv4`, configured the way S3 wants it: the path
//! encoded once and not normalised, and the payload's SHA-256 sent in `x-amz-content-sha256`.

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use std::time::SystemTime;

/// An access key pair. `Debug` never shows the secret.
#[derive(Clone)]
pub struct AccessKey {
    /// Access key id.
    pub id: String,
    /// Secret access key.
    pub secret: String,
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("AccessKey").field("id", &self.id).field("secret", &"<redacted>").finish()
    }
}

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
#[error("sign request: {0}")]
pub struct SignError(String);

/// Hex SHA-256 of `data` (ring's assembly implementation).
pub fn sha256_hex(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Signs a request: returns the headers to add (`authorization`, `x-amz-date`,
/// `x-amz-content-sha256`). `headers` are the ones to cover by the signature, `host` included;
/// `payload_sha256` is the hex SHA-256 of the body.
pub fn sign_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    payload_sha256: &str,
    key: &AccessKey,
    region: &str,
    time: SystemTime,
) -> Result<Vec<(&'static str, String)>, SignError> {
    let identity = Credentials::new(&key.id, &key.secret, None, None, "dbservice-operator").into();
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("s3")
        .time(time)
        .settings(settings)
        .build()
        .map_err(|error| SignError(error.to_string()))?
        .into();
    let request = SignableRequest::new(
        method,
        url,
        headers.iter().copied(),
        SignableBody::Precomputed(payload_sha256.to_string()),
    )
    .map_err(|error| SignError(error.to_string()))?;
    let (instructions, _signature) = sign(request, &params).map_err(|error| SignError(error.to_string()))?.into_parts();
    let (signed_headers, _query) = instructions.into_parts();
    Ok(signed_headers.into_iter().map(|header| (header.name(), header.value().to_string())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn key() -> AccessKey {
        AccessKey { id: "AKIDEXAMPLE".into(), secret: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into() }
    }

    #[test]
    fn sha256_of_nothing() {
        assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn signed_put_has_the_s3_header_shape() {
        // 2026-11-30T22:00:00Z
        let time = UNIX_EPOCH + Duration::from_secs(1_796_076_000);
        let body_hash = sha256_hex(b"segment");
        let headers = sign_request(
            "PUT",
            "http://127.0.0.1:9000/bucket/p/s/wal/00000001/000000010000000000000001.zst",
            &[("host", "127.0.0.1:9000"), ("x-amz-meta-dbservice-sha256", "abc")],
            &body_hash,
            &key(),
            "eu-west-1",
            time,
        )
        .unwrap();
        let get = |name: &str| headers.iter().find(|(header, _)| *header == name).map(|(_, value)| value.as_str());
        assert_eq!(get("x-amz-date"), Some("20261130T220000Z"));
        assert_eq!(get("x-amz-content-sha256"), Some(body_hash.as_str()));
        let authorization = get("authorization").expect("authorization header");
        assert!(
            authorization.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/eu-west-1/s3/aws4_request, \
                 SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-meta-dbservice-sha256, Signature="
            ),
            "{authorization}"
        );
        let signature = authorization.rsplit("Signature=").next().unwrap();
        assert_eq!(signature.len(), 64);
        assert!(signature.bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert!(!authorization.contains(&key().secret), "the secret never leaves the signer");
    }

    /// The "GET Object" example of AWS's "Signature Calculations for the Authorization Header"
    /// (sigv4-header-based-auth.html): our settings must reproduce AWS's published signature.
    #[test]
    fn reproduces_the_aws_documentation_example() {
        let key =
            AccessKey { id: "AKIAIOSFODNN7EXAMPLE".into(), secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into() };
        let headers = sign_request(
            "GET",
            "https://examplebucket.s3.amazonaws.com/test.txt",
            &[("host", "examplebucket.s3.amazonaws.com"), ("range", "bytes=0-9")],
            &sha256_hex(b""),
            &key,
            "us-east-1",
            UNIX_EPOCH + Duration::from_secs(1_369_353_600),
        )
        .unwrap();
        let authorization = &headers.iter().find(|(name, _)| *name == "authorization").unwrap().1;
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn the_signature_depends_on_the_payload() {
        let time = UNIX_EPOCH + Duration::from_secs(1_796_076_000);
        let sign_body = |body: &[u8]| {
            sign_request("PUT", "http://h/b/k", &[("host", "h")], &sha256_hex(body), &key(), "us-east-1", time)
                .unwrap()
                .into_iter()
                .find(|(name, _)| *name == "authorization")
                .unwrap()
                .1
        };
        assert_ne!(sign_body(b"one"), sign_body(b"two"));
        assert_eq!(sign_body(b"one"), sign_body(b"one"));
    }

    #[test]
    fn debug_output_hides_the_secret() {
        assert!(!format!("{:?}", key()).contains("EXAMPLEKEY"));
    }
}
