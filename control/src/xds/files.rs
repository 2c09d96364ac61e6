//! The static mode's delivery: a [`Snapshot`] written as files Envoy reads itself
//! (filesystem xDS subscriptions, `path_config_source` in the bootstrap, `crate::envoy::bootstrap`).
//!
//! Each file holds one `DiscoveryResponse` as YAML (`crate::envoy::yaml`; Envoy picks the
//! format by the `.yaml` extension) with exactly the resources the live mode serves over ADS, so the static and the
//! live mode configure Envoy identically by construction. Files are replaced atomically
//! (written beside, then renamed): Envoy watches the directory and reloads on the rename,
//! and never sees half a file.
//!
//! The SDS files of the certificates ([`write_secrets`], one `Secret` per file, as
//! [`crate::envoy::secrets`] names them) are written the same way, in both modes: they hold
//! only file names, so they are written once, and Envoy follows the certificate files itself.

use std::io;
use std::path::Path;

use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::util::pack_any;

use crate::envoy::files::{replace, CLUSTERS_FILE, FILTER_FILE};
use crate::envoy::secrets::{sds_file, SECRET_TYPE_URL};
use crate::envoy::yaml::{from_yaml, to_yaml};

use super::snapshot::{Snapshot, Versioned};
use super::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL};

fn response(
    snapshot: &Snapshot,
    type_url: &str,
    resources: &std::collections::BTreeMap<String, Versioned>,
) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: snapshot.version(),
        type_url: type_url.to_string(),
        resources: resources.values().map(|v| v.resource.clone()).collect(),
        ..Default::default()
    }
}

/// `response` as the YAML of a file, its first line naming `writer`.
fn yaml(response: &DiscoveryResponse, writer: &str) -> io::Result<Vec<u8>> {
    to_yaml(response, writer)
        .map(String::into_bytes)
        .map_err(io::Error::other)
}

/// Write `snapshot` into `dir` (which must exist), the files' first lines naming `writer`. The
/// clusters go first: a filter configuration must never name a cluster Envoy could not have.
pub fn write(dir: &Path, snapshot: &Snapshot, writer: &str) -> io::Result<()> {
    replace(
        dir,
        CLUSTERS_FILE,
        &yaml(
            &response(snapshot, CLUSTER_TYPE_URL, &snapshot.clusters),
            writer,
        )?,
    )?;
    replace(
        dir,
        FILTER_FILE,
        &yaml(
            &response(
                snapshot,
                EXTENSION_CONFIG_TYPE_URL,
                &snapshot.extension_configs,
            ),
            writer,
        )?,
    )
}

/// Write each secret as its SDS file in `dir` (created if missing), its first line naming
/// `writer`, unless the file already holds exactly that secret, whoever wrote it (`bootstrap`
/// and `run` write the same files; a rename makes Envoy reload one, for nothing).
pub fn write_secrets(dir: &Path, secrets: &[Secret], writer: &str) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for secret in secrets {
        let resource = Versioned::new(pack_any(secret.clone()));
        let response = DiscoveryResponse {
            version_info: resource.version,
            type_url: SECRET_TYPE_URL.to_string(),
            resources: vec![resource.resource],
            ..Default::default()
        };
        let path = sds_file(dir, &secret.name);
        let written = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| from_yaml::<DiscoveryResponse>(&text).ok());
        if written.as_ref() == Some(&response) {
            continue;
        }
        let bytes = yaml(&response, writer)?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "secret name"))?;
        replace(dir, name, &bytes)?;
    }
    Ok(())
}

/// Read back what [`write`] wrote.
pub fn read(dir: &Path) -> io::Result<Snapshot> {
    let decode = |name: &str, type_url: &str| -> io::Result<Vec<Versioned>> {
        let text = std::fs::read_to_string(dir.join(name))?;
        let response: DiscoveryResponse =
            from_yaml(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if response.type_url != type_url {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name} holds {}, not {type_url}", response.type_url),
            ));
        }
        Ok(response.resources.into_iter().map(Versioned::new).collect())
    };
    Ok(Snapshot::from_versioned(
        decode(CLUSTERS_FILE, CLUSTER_TYPE_URL)?,
        decode(FILTER_FILE, EXTENSION_CONFIG_TYPE_URL)?,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;
    use crate::discovery::ServedApis;
    use crate::envoy::Address;
    use crate::routing::{self, Peer};
    use crate::xds::SnapshotInputs;

    #[test]
    fn the_files_hold_exactly_the_snapshot() {
        let mut served = ServedApis::new();
        served.add_resource("x.io", "v1", "widgets").expect("valid");
        let plan = routing::RoutingPlan::of_table(routing::build(
            &ServedApis::new(),
            "a",
            &[Peer {
                id: "b".into(),
                served,
            }],
            routing::RetainedRoutes::NONE,
            &BTreeSet::new(),
            routing::LocalFreshness::Current,
        ));
        let local = Address::parse("127.0.0.1:6443").expect("address");
        let peers = [(
            "b".to_string(),
            Address::parse("10.0.0.2:6444").expect("address"),
        )];
        let snapshot = Snapshot::from_plan(
            &plan,
            &SnapshotInputs {
                filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
                local: &local,
                peers: &peers,
                upstream_sds: None,
            },
        )
        .expect("snapshot");
        let dir = std::env::temp_dir().join(format!("skewgate-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        write(&dir, &snapshot, "test").expect("write");
        let back = read(&dir).expect("read");
        // The same resources, field for field (read back, an `Any`'s bytes are in field-number
        // order, so the versions, hashes of those bytes, may differ: Envoy never sees them).
        let as_yaml = |resources: &std::collections::BTreeMap<String, Versioned>| {
            to_yaml(
                &DiscoveryResponse {
                    resources: resources.values().map(|v| v.resource.clone()).collect(),
                    ..Default::default()
                },
                "test",
            )
            .expect("YAML")
        };
        assert_eq!(as_yaml(&back.clusters), as_yaml(&snapshot.clusters));
        assert_eq!(
            as_yaml(&back.extension_configs),
            as_yaml(&snapshot.extension_configs)
        );
        // Nothing half-written is left behind.
        let names: BTreeSet<String> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            BTreeSet::from([CLUSTERS_FILE.to_string(), FILTER_FILE.to_string()])
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn each_secret_is_one_sds_file() {
        use crate::envoy::secrets::{serving_secrets, PROXY_CLIENT_SECRET, SERVING_SECRET};
        use crate::envoy::ServingTls;
        let dir = std::env::temp_dir().join(format!("skewgate-sds-{}", std::process::id()));
        let serving = ServingTls {
            cert_file: "/pki/apiserver.crt".into(),
            key_file: "/pki/apiserver.key".into(),
            client_ca_file: Some("/pki/ca.crt".into()),
        };
        let secrets = serving_secrets(&serving).expect("secrets");
        write_secrets(&dir, &secrets, "test").expect("write");
        let file = sds_file(&dir, SERVING_SECRET);
        let response: DiscoveryResponse =
            from_yaml(&std::fs::read_to_string(&file).expect("read")).expect("YAML");
        assert_eq!(response.type_url, SECRET_TYPE_URL);
        assert_eq!(
            response.resources.len(),
            1,
            "Envoy wants one secret per file"
        );
        let back = <Secret as prost::Message>::decode(response.resources[0].value.as_slice())
            .expect("secret");
        assert_eq!(back, secrets[0]);
        assert_eq!(
            response.version_info,
            Versioned::new(pack_any(back)).version
        );
        // The same secrets again, by another command (`bootstrap`, then `run`): the files are
        // left alone (Envoy would reload on a rename).
        let inode = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).expect("metadata").ino()
        };
        let before = inode(&file);
        write_secrets(&dir, &secrets, "another").expect("write");
        assert_eq!(inode(&file), before);
        let names: BTreeSet<String> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            BTreeSet::from([
                "skewgate-client-ca.yaml".to_string(),
                "skewgate-serving.yaml".to_string()
            ])
        );
        assert!(!names.contains(&format!("{PROXY_CLIENT_SECRET}.yaml")));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
