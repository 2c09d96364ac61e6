//! A Kubernetes API group-version, with the core group's rules in one place: the core group is
//! the empty group, its apiVersion is just the version (`v1`), and it lives under `/api`
//! instead of `/apis/<group>`.

use std::fmt;

/// An API group and one of its versions. The core group is `""`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GroupVersion {
    pub group: String,
    pub version: String,
}

/// Why a text is not a group-version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseGroupVersionError(String);

impl fmt::Display for ParseGroupVersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a group-version (GROUP/VERSION, or VERSION for the core group)",
            self.0
        )
    }
}

impl std::error::Error for ParseGroupVersionError {}

impl GroupVersion {
    pub fn new(group: impl Into<String>, version: impl Into<String>) -> Self {
        GroupVersion {
            group: group.into(),
            version: version.into(),
        }
    }

    /// The apiVersion form: `GROUP/VERSION`, or `VERSION` for the core group. No other `/`, no
    /// empty part, no white space.
    pub fn parse(text: &str) -> Result<Self, ParseGroupVersionError> {
        let bad = || ParseGroupVersionError(text.to_string());
        let (group, version) = match text.split_once('/') {
            Some((group, version)) if !group.is_empty() => (group, version),
            Some(_) => return Err(bad()),
            None => ("", text),
        };
        let ok = |s: &str| !s.is_empty() && !s.contains('/') && !s.contains(char::is_whitespace);
        if !ok(version) || (!group.is_empty() && !ok(group)) {
            return Err(bad());
        }
        Ok(GroupVersion::new(group, version))
    }

    /// The core group (`/api/v1`).
    pub fn is_core(&self) -> bool {
        self.group.is_empty()
    }

    /// Where its legacy discovery document and its resources live: `/api/v1` or
    /// `/apis/GROUP/VERSION`.
    pub fn api_path(&self) -> String {
        if self.is_core() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

/// The apiVersion form: `v1`, `apps/v1`.
impl fmt::Display for GroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_core() {
            f.write_str(&self.version)
        } else {
            write!(f, "{}/{}", self.group, self.version)
        }
    }
}

/// A path segment discovery could name: non-empty, at most 253 bytes, no `/`, no whitespace or
/// control characters. The control plane checks discovery documents with this same rule, so
/// whatever it puts into a configuration passes the filter's validation.
pub fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && !s.contains('/')
        && s.chars().all(|c| !c.is_whitespace() && !c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn text_forms_round_trip() {
        for (text, group, version, path) in [
            ("v1", "", "v1", "/api/v1"),
            ("apps/v1", "apps", "v1", "/apis/apps/v1"),
            (
                "resource.k8s.io/v1beta2",
                "resource.k8s.io",
                "v1beta2",
                "/apis/resource.k8s.io/v1beta2",
            ),
        ] {
            let gv = GroupVersion::parse(text).expect(text);
            assert_eq!(gv, GroupVersion::new(group, version));
            assert_eq!(gv.to_string(), text);
            assert_eq!(gv.api_path(), path);
            assert_eq!(gv.is_core(), group.is_empty());
        }
        for bad in ["", "/", "/v1", "apps/", "a/b/c", "apps /v1", "apps/v 1"] {
            assert!(GroupVersion::parse(bad).is_err(), "{bad:?}");
        }
    }
}
