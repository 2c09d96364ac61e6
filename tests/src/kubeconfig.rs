//! Kubeconfigs for kubectl and other clients: plain HTTP, and TLS with a [`Credential`].

use std::path::{Path, PathBuf};

use crate::pki::CertFiles;

/// A minimal kubeconfig for a plain-HTTP server.
pub fn kubeconfig_yaml(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skewgate\n  cluster:\n    server: {server}\n\
         contexts:\n- name: skewgate\n  context:\n    cluster: skewgate\n    user: tester\n\
         current-context: skewgate\nusers:\n- name: tester\n  user: {{}}\n"
    )
}

/// How a kubeconfig user authenticates.
#[derive(Clone, Debug)]
pub enum Credential {
    /// No credentials. kubectl then prompts for a basic-auth user name on stdin (and fails
    /// with `EOF` under [`kubectl`](fn@crate::kubectl)); other clients go anonymous.
    Anonymous,
    ClientCert {
        cert_file: PathBuf,
        key_file: PathBuf,
    },
    Token(String),
}

impl Credential {
    pub fn cert(files: &CertFiles) -> Self {
        Credential::ClientCert {
            cert_file: files.cert_file.clone(),
            key_file: files.key_file.clone(),
        }
    }
}

/// A kubeconfig for a TLS server: trusts `ca_file`, optionally verifies the server as
/// `tls_server_name` (e.g. `kubernetes.default.svc`), and authenticates with `credential`.
pub fn kubeconfig_tls(
    server: &str,
    ca_file: &Path,
    tls_server_name: Option<&str>,
    credential: &Credential,
) -> String {
    // JSON strings are YAML scalars: paths and tokens need no further escaping.
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let qp = |p: &Path| q(&p.to_string_lossy());
    let mut cluster = format!(
        "    server: {}\n    certificate-authority: {}\n",
        q(server),
        qp(ca_file)
    );
    if let Some(name) = tls_server_name {
        cluster.push_str(&format!("    tls-server-name: {}\n", q(name)));
    }
    let user = match credential {
        Credential::Anonymous => "  user: {}\n".to_string(),
        Credential::ClientCert {
            cert_file,
            key_file,
        } => format!(
            "  user:\n    client-certificate: {}\n    client-key: {}\n",
            qp(cert_file),
            qp(key_file)
        ),
        Credential::Token(t) => format!("  user:\n    token: {}\n", q(t)),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skewgate\n  cluster:\n{cluster}\
         contexts:\n- name: skewgate\n  context:\n    cluster: skewgate\n    user: tester\n\
         current-context: skewgate\nusers:\n- name: tester\n{user}"
    )
}
