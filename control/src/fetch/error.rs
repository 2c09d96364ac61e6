//! Why a discovery fetch failed, typed the way the metrics count it.

use std::time::Duration;

use crate::discovery::DiscoveryError;

use super::content_type::UnsupportedContentType;

/// The `type` label of `apiserver_peer_discovery_sync_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorType {
    /// No usable connection: refused, unreachable, DNS, TLS handshake or certificate
    /// verification, credentials, or the connection broke mid-answer.
    Connect,
    /// No complete answer within the per-request timeout.
    Timeout,
    /// An HTTP status other than 200 (or 304 to a conditional request).
    Status,
    /// A body over the size limit.
    TooLarge,
    /// An answer we cannot use: not JSON, the wrong kind, an unexpected Content-Type, invalid
    /// names.
    Garbage,
}

impl ErrorType {
    pub const ALL: [ErrorType; 5] = [
        ErrorType::Connect,
        ErrorType::Timeout,
        ErrorType::Status,
        ErrorType::TooLarge,
        ErrorType::Garbage,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ErrorType::Connect => "connect",
            ErrorType::Timeout => "timeout",
            ErrorType::Status => "status",
            ErrorType::TooLarge => "too_large",
            ErrorType::Garbage => "garbage",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Why an answer was garbage.
#[derive(Debug, thiserror::Error)]
pub enum GarbageReason {
    #[error(transparent)]
    ContentType(#[from] UnsupportedContentType),
    #[error(transparent)]
    Document(#[from] DiscoveryError),
    #[error("{0}")]
    Invalid(String),
}

/// A failed discovery fetch. `url` is the full URL of the request that failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {url}: cannot connect: {message}")]
    Connect { url: String, message: String },
    #[error("GET {url}: no complete answer within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error(
        "GET {url}: HTTP {status}{}",
        message.as_ref().map(|m| format!(": {m}")).unwrap_or_default()
    )]
    Status {
        url: String,
        status: u16,
        /// The `message` of a `metav1.Status` body, if there was one.
        message: Option<String>,
    },
    #[error("GET {url}: the answer is larger than the {limit}-byte limit{}", if *.total { " (all legacy documents together)" } else { "" })]
    TooLarge {
        url: String,
        limit: usize,
        /// The limit on the sum of a legacy fetch's documents was hit, not the per-document one.
        total: bool,
    },
    #[error("GET {url}: {reason}")]
    Garbage { url: String, reason: GarbageReason },
}

impl FetchError {
    pub fn error_type(&self) -> ErrorType {
        match self {
            FetchError::Connect { .. } => ErrorType::Connect,
            FetchError::Timeout { .. } => ErrorType::Timeout,
            FetchError::Status { .. } => ErrorType::Status,
            FetchError::TooLarge { .. } => ErrorType::TooLarge,
            FetchError::Garbage { .. } => ErrorType::Garbage,
        }
    }

    pub fn url(&self) -> &str {
        match self {
            FetchError::Connect { url, .. }
            | FetchError::Timeout { url, .. }
            | FetchError::Status { url, .. }
            | FetchError::TooLarge { url, .. }
            | FetchError::Garbage { url, .. } => url,
        }
    }

    pub(crate) fn garbage(url: &str, reason: impl Into<GarbageReason>) -> Self {
        FetchError::Garbage {
            url: url.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid(url: &str, message: impl Into<String>) -> Self {
        Self::garbage(url, GarbageReason::Invalid(message.into()))
    }
}

/// Setting up a fetcher failed (bad URL, unreadable CA file, TLS configuration).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("invalid apiserver URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("reading {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("no PEM CERTIFICATE in {what}")]
    NoCertificate { what: String },
    #[error("{what} is not PEM: {error}")]
    Pem { what: String, error: pem::PemError },
    #[error("loading the kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("building the HTTP client: {0}")]
    Client(#[from] kube::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_labels() {
        let labels: Vec<&str> = ErrorType::ALL.iter().map(|t| t.label()).collect();
        assert_eq!(
            labels,
            vec!["connect", "timeout", "status", "too_large", "garbage"]
        );
        for (i, t) in ErrorType::ALL.iter().enumerate() {
            assert_eq!(t.index(), i);
        }
        let e = FetchError::Status {
            url: "https://10.0.0.2:6443/apis".into(),
            status: 403,
            message: Some("forbidden".into()),
        };
        assert_eq!(e.error_type(), ErrorType::Status);
        assert_eq!(
            e.to_string(),
            "GET https://10.0.0.2:6443/apis: HTTP 403: forbidden"
        );
        let e = FetchError::TooLarge {
            url: "u".into(),
            limit: 10,
            total: true,
        };
        assert!(e.to_string().contains("all legacy documents"), "{e}");
        assert_eq!(
            FetchError::invalid("u", "x").error_type(),
            ErrorType::Garbage
        );
    }
}
