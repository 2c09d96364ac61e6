//! Every certificate, key and CA Envoy uses reaches it through SDS from files, rendered here
//! and only here: the listener's serving certificate and the client CA (the bootstrap,
//! [`super::bootstrap`]), the peer CA and the proxy-client certificate (the clusters,
//! [`super::resources`]), in both modes.
//!
//! Why SDS: Envoy reads a certificate given inline in a TLS context (`filename` in
//! `common_tls_context`) once, when it creates the listener or cluster, so a renewed certificate
//! would need a restart. A `Secret` delivered by SDS that names files is watched instead
//! (Envoy's "SDS key rotation"): when a file is replaced, Envoy reads the files again, checks
//! that the certificate and key match, and uses them for new connections; connections already
//! open (watches, exec sessions) keep going. Measured on Envoy 1.40 (`tests/tests/identity.rs`
//! and docs/ARCHITECTURE.md, "Envoy 1.40 facts"): a rename into the directory and, with
//! `watch_modify`, an in-place rewrite (what `kubeadm certs renew` does) both take effect
//! within a second; a certificate that does not match its key, or does not parse, is refused
//! with a warning and the previous one stays.
//!
//! Each secret is one SDS file `<dir>/<name>.yaml` (a `DiscoveryResponse` as YAML holding that one
//! `Secret`, which holds only file names: no key material is ever copied), written by
//! [`crate::xds::files::write_secrets`]: by `render-static` beside the bootstrap, and in the live
//! mode by `bootstrap --sds-dir` (the listener's) and `run --sds-dir` (the clusters'). The TLS
//! contexts name the secrets with [`sds_secret_config`]: the same protobuf for the clusters and
//! for the bootstrap's listener.

use std::path::Path;

use envoy_types::pb::envoy::config::core::v3::{
    config_source::ConfigSourceSpecifier, data_source, ApiVersion, ConfigSource, DataSource,
    PathConfigSource, WatchedDirectory,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, CertificateValidationContext, SdsSecretConfig, Secret, TlsCertificate,
};

use super::{checked_path, EnvoyError, ServingTls, UpstreamTls};

/// The listener's certificate and key (kube-apiserver's `--tls-cert-file`/`--tls-private-key-file`).
pub const SERVING_SECRET: &str = "skewgate-serving";
/// The CA client certificates are verified against (`--client-ca-file`).
pub const CLIENT_CA_SECRET: &str = "skewgate-client-ca";
/// The CA apiservers are verified against (`--peer-ca-file`).
pub const PEER_CA_SECRET: &str = "skewgate-peer-ca";
/// The certificate `-identity` clusters present (`--proxy-client-cert-file`/`-key-file`).
pub const PROXY_CLIENT_SECRET: &str = "skewgate-proxy-client";

/// Type URL of SDS resources.
pub const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// The SDS file of secret `name` in `dir`.
pub fn sds_file(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}.{}", super::yaml::EXTENSION))
}

/// How a TLS context names secret `name`: read from its SDS file in `dir` (which must be
/// absolute: Envoy resolves paths against its own working directory). Envoy watches that file
/// for renames into its place; the secret's own files are watched as [`secret`] says.
pub fn sds_secret_config(dir: &Path, name: &str) -> Result<SdsSecretConfig, EnvoyError> {
    let file = sds_file(dir, name);
    let path = checked_path(&file, "the SDS directory")?;
    if !file.is_absolute() {
        return Err(EnvoyError::RelativeSdsDir(path.to_string()));
    }
    Ok(SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            config_source_specifier: Some(ConfigSourceSpecifier::PathConfigSource(
                PathConfigSource {
                    path: path.to_string(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
    })
}

fn file(path: &Path, what: &'static str) -> Result<DataSource, EnvoyError> {
    Ok(DataSource {
        specifier: Some(data_source::Specifier::Filename(
            checked_path(path, what)?.to_string(),
        )),
        ..Default::default()
    })
}

/// The directory Envoy watches for a secret's files: their common parent, with modifications
/// as well as renames (kubeadm rewrites certificates in place; kubelet-style rotation renames).
/// Files in different directories: Envoy's default, each parent watched for renames only.
fn watched_directory(paths: &[&Path]) -> Result<Option<WatchedDirectory>, EnvoyError> {
    let mut parents = paths.iter().map(|p| p.parent());
    let Some(Some(first)) = parents.next() else {
        return Ok(None);
    };
    if first.as_os_str().is_empty() || parents.any(|p| p != Some(first)) {
        return Ok(None);
    }
    Ok(Some(WatchedDirectory {
        path: checked_path(first, "a certificate directory")?.to_string(),
        watch_modify: true,
    }))
}

fn tls_certificate(
    name: &str,
    cert: &Path,
    key: &Path,
    what: [&'static str; 2],
) -> Result<Secret, EnvoyError> {
    Ok(Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(file(cert, what[0])?),
            private_key: Some(file(key, what[1])?),
            watched_directory: watched_directory(&[cert, key])?,
            ..Default::default()
        })),
    })
}

fn trusted_ca(name: &str, ca: &Path, what: &'static str) -> Result<Secret, EnvoyError> {
    Ok(Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::ValidationContext(
            CertificateValidationContext {
                trusted_ca: Some(file(ca, what)?),
                watched_directory: watched_directory(&[ca])?,
                ..Default::default()
            },
        )),
    })
}

/// The listener's secrets: [`SERVING_SECRET`], and [`CLIENT_CA_SECRET`] with a client CA.
pub fn serving_secrets(tls: &ServingTls) -> Result<Vec<Secret>, EnvoyError> {
    let mut out = vec![tls_certificate(
        SERVING_SECRET,
        &tls.cert_file,
        &tls.key_file,
        ["the serving certificate path", "the serving key path"],
    )?];
    if let Some(ca) = &tls.client_ca_file {
        out.push(trusted_ca(CLIENT_CA_SECRET, ca, "the client CA path")?);
    }
    Ok(out)
}

/// The clusters' secrets: [`PEER_CA_SECRET`] and [`PROXY_CLIENT_SECRET`].
pub fn upstream_secrets(tls: &UpstreamTls) -> Result<Vec<Secret>, EnvoyError> {
    Ok(vec![
        trusted_ca(PEER_CA_SECRET, &tls.peer_ca_file, "the peer CA path")?,
        tls_certificate(
            PROXY_CLIENT_SECRET,
            &tls.proxy_client_cert_file,
            &tls.proxy_client_key_file,
            [
                "the proxy-client certificate path",
                "the proxy-client key path",
            ],
        )?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filename(d: &Option<DataSource>) -> Option<&str> {
        match d.as_ref()?.specifier.as_ref()? {
            data_source::Specifier::Filename(f) => Some(f),
            _ => None,
        }
    }

    #[test]
    fn secrets_name_the_files_and_watch_their_directory() {
        let serving = ServingTls {
            cert_file: "/etc/kubernetes/pki/apiserver.crt".into(),
            key_file: "/etc/kubernetes/pki/apiserver.key".into(),
            client_ca_file: Some("/etc/kubernetes/pki/ca.crt".into()),
        };
        let secrets = serving_secrets(&serving).expect("secrets");
        assert_eq!(secrets.len(), 2);
        assert_eq!(secrets[0].name, SERVING_SECRET);
        let Some(secret::Type::TlsCertificate(cert)) = &secrets[0].r#type else {
            panic!("a certificate");
        };
        assert_eq!(
            filename(&cert.certificate_chain),
            Some("/etc/kubernetes/pki/apiserver.crt")
        );
        assert_eq!(
            filename(&cert.private_key),
            Some("/etc/kubernetes/pki/apiserver.key")
        );
        assert_eq!(
            cert.watched_directory,
            Some(WatchedDirectory {
                path: "/etc/kubernetes/pki".into(),
                watch_modify: true
            })
        );
        assert!(cert
            .certificate_chain
            .as_ref()
            .expect("chain")
            .watched_directory
            .is_none());
        assert_eq!(secrets[1].name, CLIENT_CA_SECRET);
        let Some(secret::Type::ValidationContext(ca)) = &secrets[1].r#type else {
            panic!("a validation context");
        };
        assert_eq!(filename(&ca.trusted_ca), Some("/etc/kubernetes/pki/ca.crt"));
        assert_eq!(
            ca.watched_directory
                .as_ref()
                .map(|w| (w.path.as_str(), w.watch_modify)),
            Some(("/etc/kubernetes/pki", true))
        );
        // No client CA: no secret for it.
        let without = ServingTls {
            client_ca_file: None,
            ..serving.clone()
        };
        assert_eq!(serving_secrets(&without).expect("secrets").len(), 1);

        // Certificate and key in different directories: Envoy's default watch of each.
        let upstream = UpstreamTls {
            peer_ca_file: "/etc/kubernetes/pki/ca.crt".into(),
            proxy_client_cert_file: "/etc/kubernetes/pki/front-proxy-client.crt".into(),
            proxy_client_key_file: "/etc/kubernetes/keys/front-proxy-client.key".into(),
        };
        let secrets = upstream_secrets(&upstream).expect("secrets");
        let names: Vec<&str> = secrets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, [PEER_CA_SECRET, PROXY_CLIENT_SECRET]);
        let Some(secret::Type::TlsCertificate(cert)) = &secrets[1].r#type else {
            panic!("a certificate");
        };
        assert_eq!(cert.watched_directory, None);
        assert_eq!(
            filename(&cert.private_key),
            Some("/etc/kubernetes/keys/front-proxy-client.key")
        );

        let bad = UpstreamTls {
            peer_ca_file: "/etc/ca\n.crt".into(),
            ..upstream
        };
        assert!(matches!(upstream_secrets(&bad), Err(EnvoyError::Unsafe(_))));
    }

    #[test]
    fn the_bootstrap_and_the_clusters_name_secrets_alike() {
        let dir = Path::new("/var/lib/skewgate/sds");
        for name in [
            SERVING_SECRET,
            CLIENT_CA_SECRET,
            PEER_CA_SECRET,
            PROXY_CLIENT_SECRET,
        ] {
            let proto = sds_secret_config(dir, name).expect("proto");
            assert_eq!(proto.name, name);
            let source = proto.sds_config.expect("a config source");
            assert_eq!(source.resource_api_version, ApiVersion::V3 as i32);
            let Some(ConfigSourceSpecifier::PathConfigSource(path)) =
                source.config_source_specifier
            else {
                panic!("a file");
            };
            let want = format!("/var/lib/skewgate/sds/{name}.yaml");
            assert_eq!(path.path, want);
            assert!(path.watched_directory.is_none() && path.poll_interval.is_none());
        }
        assert!(matches!(
            sds_secret_config(Path::new("relative/dir"), SERVING_SECRET),
            Err(EnvoyError::RelativeSdsDir(_))
        ));
        assert!(matches!(
            sds_secret_config(Path::new("/a\"b"), SERVING_SECRET),
            Err(EnvoyError::Unsafe(_))
        ));
    }
}
