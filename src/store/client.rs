//! A small S3 client: PUT, GET, HEAD, ListObjectsV2, DELETE and CreateBucket over hyper +
//! rustls, every request signed (see [`crate::store::signing`]) and bounded in time and size.

use crate::store::signing::{sha256_hex, sign_request, AccessKey, SignError};
use crate::store::xml::{self, ListedObject};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Characters S3 wants percent-encoded in a path segment: everything but `A-Za-z0-9-._~`.
const PATH_SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Prefix of user metadata headers.
const METADATA_PREFIX: &str = "x-amz-meta-";

/// Error bodies are read only this far: they are small XML documents.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// A listing page is at most 1000 keys: a few hundred KiB.
const LIST_BODY_LIMIT: usize = 8 * 1024 * 1024;

/// How the bucket appears in the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Addressing {
    /// `https://endpoint/bucket/key`: what S3-compatible servers (MinIO, Ceph, moto) expect.
    Path,
    /// `https://bucket.endpoint/key`: AWS S3's preferred form.
    VirtualHost,
}

/// Where and how to reach the store.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// `http://host:port` or `https://host[:port]`, without a path.
    pub endpoint: String,
    /// Bucket name.
    pub bucket: String,
    /// Signing region.
    pub region: String,
    /// Access key.
    pub access_key: AccessKey,
    /// PEM file with the CA certificates to trust instead of the system's.
    pub ca_file: Option<std::path::PathBuf>,
    /// Bound of every request, body included.
    pub timeout: Duration,
    /// Bound of opening a connection (None: `timeout`; never more than it): a store that does not
    /// accept connections is known sooner than one that is slow to answer.
    pub connect_timeout: Option<Duration>,
    /// URL form.
    pub addressing: Addressing,
}

/// Why a request to the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The settings cannot work (bad endpoint, unreadable CA file).
    #[error("object store settings: {0}")]
    Settings(String),
    /// Signing failed.
    #[error(transparent)]
    Sign(#[from] SignError),
    /// No answer within the timeout.
    #[error("{operation} {key}: no answer within {seconds}s")]
    Timeout {
        /// S3 operation.
        operation: &'static str,
        /// Object key or prefix.
        key: String,
        /// The timeout.
        seconds: u64,
    },
    /// Connection or protocol failure.
    #[error("{operation} {key}: {message}")]
    Transport {
        /// S3 operation.
        operation: &'static str,
        /// Object key or prefix.
        key: String,
        /// What went wrong (with its causes).
        message: String,
    },
    /// The store answered with an error status.
    #[error("{operation} {key}: HTTP {status} {code}")]
    Status {
        /// S3 operation.
        operation: &'static str,
        /// Object key or prefix.
        key: String,
        /// HTTP status.
        status: u16,
        /// S3 error code, when the body had one.
        code: String,
    },
}

/// An object's metadata (HEAD) or an object with its metadata (GET).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// User metadata, names without `x-amz-meta-`, lowercase.
    pub metadata: BTreeMap<String, String>,
    /// Content length.
    pub size: u64,
    /// Body (empty for HEAD).
    pub body: Bytes,
}

/// One request to send.
struct Call<'a> {
    operation: &'static str,
    method: Method,
    key: &'a str,
    query: &'a [(&'a str, &'a str)],
    extra_headers: &'a [(String, String)],
    body: Bytes,
    body_limit: usize,
}

impl<'a> Call<'a> {
    /// A request without query, extra headers or body.
    fn new(operation: &'static str, method: Method, key: &'a str, body_limit: usize) -> Call<'a> {
        Call { operation, method, key, query: &[], extra_headers: &[], body: Bytes::new(), body_limit }
    }
}

/// A client for one bucket.
#[derive(Clone)]
pub struct S3Client {
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    settings: StoreSettings,
    /// `scheme://authority`, for path-style addressing; with the bucket for virtual-host style.
    base_url: String,
    host: String,
}

fn tls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|error| StoreError::Settings(format!("read CA file {}: {error}", path.display())))?;
            for certificate in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                let certificate = certificate
                    .map_err(|error| StoreError::Settings(format!("parse CA file {}: {error}", path.display())))?;
                roots
                    .add(certificate)
                    .map_err(|error| StoreError::Settings(format!("CA file {}: {error}", path.display())))?;
            }
            if roots.is_empty() {
                return Err(StoreError::Settings(format!("CA file {} holds no certificate", path.display())));
            }
        }
        None => {
            // Unreadable system certificates are skipped; a store signed by none of them fails its handshake.
            let (added, _ignored) = roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            tracing::debug!(added, "loaded system CA certificates");
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| StoreError::Settings(format!("TLS: {error}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl S3Client {
    /// Builds a client; nothing is sent yet.
    pub fn new(settings: StoreSettings) -> Result<S3Client, StoreError> {
        let endpoint: hyper::Uri = settings
            .endpoint
            .parse()
            .map_err(|error| StoreError::Settings(format!("endpoint {:?}: {error}", settings.endpoint)))?;
        let scheme = endpoint.scheme_str().unwrap_or_default();
        if scheme != "http" && scheme != "https" {
            return Err(StoreError::Settings(format!(
                "endpoint {:?}: scheme must be http or https",
                settings.endpoint
            )));
        }
        if !matches!(endpoint.path(), "" | "/") || endpoint.query().is_some() {
            return Err(StoreError::Settings(format!("endpoint {:?}: must not have a path", settings.endpoint)));
        }
        let authority = endpoint
            .authority()
            .ok_or_else(|| StoreError::Settings(format!("endpoint {:?}: no host", settings.endpoint)))?
            .as_str();
        if settings.bucket.is_empty()
            || !settings.bucket.bytes().all(|byte| byte.is_ascii_alphanumeric() || b".-_".contains(&byte))
        {
            return Err(StoreError::Settings(format!("bucket {:?}: not a bucket name", settings.bucket)));
        }
        let host = match settings.addressing {
            Addressing::Path => authority.to_string(),
            Addressing::VirtualHost => format!("{}.{authority}", settings.bucket),
        };
        let base_url = format!("{scheme}://{host}");
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_connect_timeout(Some(settings.connect_timeout.unwrap_or(settings.timeout).min(settings.timeout)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(settings.ca_file.as_deref())?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let http = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(https);
        Ok(S3Client { http, settings, base_url, host })
    }

    /// The URL path of `key` (empty key: the bucket itself).
    fn path(&self, key: &str) -> String {
        let encoded: Vec<String> = key
            .split('/')
            .map(|segment| percent_encoding::utf8_percent_encode(segment, PATH_SEGMENT).to_string())
            .collect();
        match self.settings.addressing {
            Addressing::Path if key.is_empty() => format!("/{}", self.settings.bucket),
            Addressing::Path => format!("/{}/{}", self.settings.bucket, encoded.join("/")),
            Addressing::VirtualHost => format!("/{}", encoded.join("/")),
        }
    }

    /// Sends one signed request and returns status, headers and at most `call.body_limit` bytes of body.
    async fn send(&self, call: Call<'_>) -> Result<(StatusCode, hyper::HeaderMap, Bytes), StoreError> {
        let Call { operation, method, key, query, extra_headers, body, body_limit } = call;
        let mut url = format!("{}{}", self.base_url, self.path(key));
        if !query.is_empty() {
            let encoded: Vec<String> = query
                .iter()
                .map(|(name, value)| format!("{name}={}", percent_encoding::utf8_percent_encode(value, PATH_SEGMENT)))
                .collect();
            url = format!("{url}?{}", encoded.join("&"));
        }
        let mut headers: Vec<(&str, &str)> = vec![("host", self.host.as_str())];
        headers.extend(extra_headers.iter().map(|(name, value)| (name.as_str(), value.as_str())));
        let signed = sign_request(
            method.as_str(),
            &url,
            &headers,
            &sha256_hex(&body),
            &self.settings.access_key,
            &self.settings.region,
            SystemTime::now(),
        )?;
        let mut request = Request::builder().method(method).uri(&url);
        for (name, value) in headers.iter().skip(1) {
            request = request.header(*name, *value);
        }
        for (name, value) in &signed {
            request = request.header(*name, value);
        }
        let request = request.body(Full::new(body)).map_err(|error| StoreError::Transport {
            operation,
            key: key.to_string(),
            message: error.to_string(),
        })?;
        let transport = |message: String| StoreError::Transport { operation, key: key.to_string(), message };
        let exchange = async {
            let response = self.http.request(request).await.map_err(|error| transport(error_chain(&error)))?;
            let (parts, body) = response.into_parts();
            let limit = if parts.status.is_success() { body_limit } else { ERROR_BODY_LIMIT };
            let body = Limited::new(body, limit).collect().await.map_err(|error| transport(error.to_string()))?;
            Ok((parts.status, parts.headers, body.to_bytes()))
        };
        let seconds = self.settings.timeout.as_secs();
        tokio::time::timeout(self.settings.timeout, exchange).await.map_err(|_| StoreError::Timeout {
            operation,
            key: key.to_string(),
            seconds,
        })?
    }

    fn status_error(operation: &'static str, key: &str, status: StatusCode, body: &[u8]) -> StoreError {
        let code = xml::error_code(&String::from_utf8_lossy(body)).unwrap_or_default();
        StoreError::Status { operation, key: key.to_string(), status: status.as_u16(), code }
    }

    /// Uploads `body` under `key` with user `metadata` (names without `x-amz-meta-`). The
    /// payload's SHA-256 is signed, so the store rejects a body damaged on the way.
    pub async fn put_object(&self, key: &str, body: Bytes, metadata: &[(&str, &str)]) -> Result<(), StoreError> {
        let headers: Vec<(String, String)> = metadata
            .iter()
            .map(|(name, value)| (format!("{METADATA_PREFIX}{}", name.to_ascii_lowercase()), value.to_string()))
            .collect();
        let (status, _, response) = self
            .send(Call { extra_headers: &headers, body, ..Call::new("PutObject", Method::PUT, key, ERROR_BODY_LIMIT) })
            .await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(Self::status_error("PutObject", key, status, &response))
        }
    }

    /// Downloads `key`; `None` when it does not exist. Bodies over `limit` bytes are refused.
    pub async fn get_object(&self, key: &str, limit: usize) -> Result<Option<Object>, StoreError> {
        let (status, headers, body) = self.send(Call::new("GetObject", Method::GET, key, limit)).await?;
        match status {
            StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => {
                Ok(Some(Object { metadata: metadata(&headers), size: body.len() as u64, body }))
            }
            status => Err(Self::status_error("GetObject", key, status, &body)),
        }
    }

    /// Metadata of `key`; `None` when it does not exist.
    pub async fn head_object(&self, key: &str) -> Result<Option<Object>, StoreError> {
        let (status, headers, body) = self.send(Call::new("HeadObject", Method::HEAD, key, 0)).await?;
        match status {
            StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => {
                let size = headers
                    .get(hyper::header::CONTENT_LENGTH)
                    .and_then(|value| value.to_str().ok()?.parse().ok())
                    .unwrap_or(0);
                Ok(Some(Object { metadata: metadata(&headers), size, body: Bytes::new() }))
            }
            status => Err(Self::status_error("HeadObject", key, status, &body)),
        }
    }

    /// Every object under `prefix`, following continuation tokens, in key order.
    pub async fn list_objects(&self, prefix: &str) -> Result<Vec<ListedObject>, StoreError> {
        Ok(self.list_objects_bounded(prefix, usize::MAX).await?.0)
    }

    /// The first `limit` objects under `prefix` in key order, and whether more exist.
    pub async fn list_objects_bounded(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<(Vec<ListedObject>, bool), StoreError> {
        let mut objects = Vec::new();
        let mut token: Option<String> = None;
        // S3 pages hold at most 1000 keys.
        let page_size = limit.clamp(1, 1000).to_string();
        loop {
            let mut query = vec![("list-type", "2"), ("prefix", prefix), ("max-keys", page_size.as_str())];
            if let Some(token) = &token {
                query.insert(0, ("continuation-token", token.as_str()));
            }
            // The canonical query string is sorted by name; sending it sorted keeps both identical.
            query.sort();
            let (status, _, body) = self
                .send(Call { query: &query, ..Call::new("ListObjectsV2", Method::GET, "", LIST_BODY_LIMIT) })
                .await?;
            if !status.is_success() {
                return Err(Self::status_error("ListObjectsV2", prefix, status, &body));
            }
            let page = xml::parse_list_page(&String::from_utf8_lossy(&body));
            objects.extend(page.objects);
            if objects.len() >= limit {
                let more = objects.len() > limit || page.next_continuation_token.is_some();
                objects.truncate(limit);
                return Ok((objects, more));
            }
            match page.next_continuation_token {
                Some(next) => token = Some(next),
                None => return Ok((objects, false)),
            }
        }
    }

    /// Up to `limit` (at most 1000) objects under `prefix` whose keys sort after `start_after`,
    /// in key order: one request.
    pub async fn list_objects_after(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> Result<Vec<ListedObject>, StoreError> {
        let page_size = limit.clamp(1, 1000).to_string();
        let mut query = vec![
            ("list-type", "2"),
            ("max-keys", page_size.as_str()),
            ("prefix", prefix),
            ("start-after", start_after),
        ];
        // The canonical query string is sorted by name; sending it sorted keeps both identical.
        query.sort();
        let (status, _, body) =
            self.send(Call { query: &query, ..Call::new("ListObjectsV2", Method::GET, "", LIST_BODY_LIMIT) }).await?;
        if !status.is_success() {
            return Err(Self::status_error("ListObjectsV2", prefix, status, &body));
        }
        let mut objects = xml::parse_list_page(&String::from_utf8_lossy(&body)).objects;
        objects.truncate(limit);
        Ok(objects)
    }

    /// Deletes `key`; deleting a missing key succeeds (S3 semantics).
    pub async fn delete_object(&self, key: &str) -> Result<(), StoreError> {
        let (status, _, body) = self.send(Call::new("DeleteObject", Method::DELETE, key, ERROR_BODY_LIMIT)).await?;
        if status.is_success() || status == StatusCode::NOT_FOUND {
            Ok(())
        } else {
            Err(Self::status_error("DeleteObject", key, status, &body))
        }
    }

    /// Creates the bucket (tests and first-time setup); an existing bucket of ours is fine.
    pub async fn create_bucket(&self) -> Result<(), StoreError> {
        let (status, _, body) = self.send(Call::new("CreateBucket", Method::PUT, "", ERROR_BODY_LIMIT)).await?;
        let code = xml::error_code(&String::from_utf8_lossy(&body)).unwrap_or_default();
        if status.is_success() || code == "BucketAlreadyOwnedByYou" {
            Ok(())
        } else {
            Err(StoreError::Status { operation: "CreateBucket", key: String::new(), status: status.as_u16(), code })
        }
    }
}

/// `x-amz-meta-*` headers, prefix removed.
fn metadata(headers: &hyper::HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            let name = name.as_str().strip_prefix(METADATA_PREFIX)?;
            Some((name.to_string(), value.to_str().ok()?.to_string()))
        })
        .collect()
}

/// An error with its sources, for messages that say why a connection failed.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
