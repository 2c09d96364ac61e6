//! Which apiservers and Envoys were running when, as the driver records them (`--running`), to
//! tell an avoidable 503 from an unavoidable one and to find the requests an Envoy restart cut.
//!
//! The file has one line per change, appended by the driver:
//! `<unix ms> <node> apiserver ready <version>` (the node's apiserver answered `/readyz` 200 and
//! runs `k8s-<version>`), `<unix ms> <node> apiserver stopped`, `<unix ms> <node> envoy ready`
//! (the node's Envoy answered), `<unix ms> <node> envoy stopped`. The driver writes `ready`
//! after it saw the answer and `stopped` before it sends the signal, so the records are
//! conservative both ways: a component counts as up only while it certainly was, and as down
//! from the moment it may have begun to go. Lines that do not parse are skipped.

use std::collections::BTreeSet;

use crate::truth::Catalog;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Apiserver,
    Envoy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub at_ms: u64,
    pub node: String,
    pub component: Component,
    /// `Some(version)` for an apiserver that became ready, `Some("")` for an Envoy that did,
    /// `None` for a stop.
    pub ready: Option<String>,
}

/// Every recorded change, in time order.
#[derive(Default, Debug)]
pub struct Running {
    events: Vec<Event>,
}

impl Running {
    pub fn parse(text: &str) -> Self {
        let mut events: Vec<Event> = text.lines().filter_map(parse_line).collect();
        events.sort_by_key(|e| e.at_ms);
        Running { events }
    }

    fn of<'s, 'n>(
        &'s self,
        node: &'n str,
        c: Component,
    ) -> impl Iterator<Item = &'s Event> + use<'s, 'n> {
        self.events
            .iter()
            .filter(move |e| e.node == node && e.component == c)
    }

    /// The version a node's component ran throughout `[t0, t1]` (`""` for an Envoy), if it
    /// was up for all of it: ready at or before `t0` and not stopped before `t1`.
    pub fn up_throughout(&self, node: &str, c: Component, t0: u64, t1: u64) -> Option<&str> {
        let last = self.of(node, c).filter(|e| e.at_ms <= t0).last()?;
        let version = last.ready.as_deref()?;
        let stopped = self
            .of(node, c)
            .any(|e| e.at_ms > t0 && e.at_ms <= t1 && e.ready.is_none());
        (!stopped).then_some(version)
    }

    /// Whether the node's Envoy was down (stopped and not yet ready again) at some moment of
    /// `[t0, t1]`.
    pub fn envoy_down_during(&self, node: &str, t0: u64, t1: u64) -> bool {
        let events: Vec<&Event> = self.of(node, Component::Envoy).collect();
        events.iter().enumerate().any(|(i, e)| {
            e.ready.is_none()
                && e.at_ms <= t1
                && events
                    .iter()
                    .skip(i + 1)
                    .find(|n| n.ready.is_some())
                    .is_none_or(|back| back.at_ms >= t0)
        })
    }

    /// The nodes whose apiserver served `gvr` throughout `[t0, t1]` and could be reached from
    /// `from`'s Envoy all that time: its own apiserver on loopback, a peer's through the peer's
    /// Envoy (the peer port), so a peer counts only while its Envoy was up too.
    pub fn servers(
        &self,
        catalog: &Catalog,
        from: &str,
        gvr: &str,
        t0: u64,
        t1: u64,
    ) -> BTreeSet<String> {
        let nodes: BTreeSet<&str> = self.events.iter().map(|e| e.node.as_str()).collect();
        nodes
            .into_iter()
            .filter(|node| {
                self.up_throughout(node, Component::Apiserver, t0, t1)
                    .is_some_and(|v| catalog.serves(&BTreeSet::from([v.to_string()]), gvr))
                    && (*node == from
                        || self.up_throughout(node, Component::Envoy, t0, t1).is_some())
            })
            .map(str::to_string)
            .collect()
    }
}

fn parse_line(line: &str) -> Option<Event> {
    let mut parts = line.split_whitespace();
    let at_ms = parts.next()?.parse().ok()?;
    let node = parts.next()?.to_string();
    let component = match parts.next()? {
        "apiserver" => Component::Apiserver,
        "envoy" => Component::Envoy,
        _ => return None,
    };
    let ready = match (parts.next()?, component) {
        ("stopped", _) => None,
        ("ready", Component::Envoy) => Some(String::new()),
        ("ready", Component::Apiserver) => Some(parts.next()?.to_string()),
        _ => return None,
    };
    Some(Event {
        at_ms,
        node,
        component,
        ready,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const RECORD: &str = "\
100 node-1 apiserver ready 1.30
100 node-2 apiserver ready 1.30
110 node-1 envoy ready
110 node-2 envoy ready
1000 node-1 apiserver stopped
2000 node-1 apiserver ready 1.33
3000 node-2 envoy stopped
3500 node-2 envoy ready
4000 node-2 apiserver stopped
4000 node-2 garbage
node-2 apiserver ready 1.33
";

    fn servers(r: &Running, from: &str, gvr: &str, t0: u64, t1: u64) -> Vec<String> {
        let cat = Catalog::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/discovery"))
            .expect("fixtures");
        r.servers(&cat, from, gvr, t0, t1).into_iter().collect()
    }

    #[test]
    fn up_only_from_ready_until_stopped() {
        let r = Running::parse(RECORD);
        assert_eq!(r.events.len(), 9, "the two bad lines are skipped");
        let a = Component::Apiserver;
        assert_eq!(r.up_throughout("node-1", a, 50, 60), None, "before ready");
        assert_eq!(r.up_throughout("node-1", a, 100, 999), Some("1.30"));
        assert_eq!(
            r.up_throughout("node-1", a, 900, 1000),
            None,
            "stopped at its end"
        );
        assert_eq!(r.up_throughout("node-1", a, 1500, 1600), None);
        assert_eq!(
            r.up_throughout("node-1", a, 1900, 2100),
            None,
            "ready after start"
        );
        assert_eq!(r.up_throughout("node-1", a, 2000, 9000), Some("1.33"));
        assert_eq!(r.up_throughout("node-3", a, 2000, 9000), None, "never seen");
    }

    #[test]
    fn envoy_down_from_stop_to_ready() {
        let r = Running::parse(RECORD);
        assert!(!r.envoy_down_during("node-2", 200, 2999));
        assert!(
            r.envoy_down_during("node-2", 2900, 3000),
            "in flight at the stop"
        );
        assert!(r.envoy_down_during("node-2", 3200, 3300));
        assert!(
            r.envoy_down_during("node-2", 3400, 3500),
            "ends at the ready"
        );
        assert!(!r.envoy_down_during("node-2", 3501, 9000));
        assert!(!r.envoy_down_during("node-1", 0, 9000));
        let never_back = Running::parse("10 node-3 envoy ready\n20 node-3 envoy stopped\n");
        assert!(never_back.envoy_down_during("node-3", 5000, 6000));
    }

    #[test]
    fn a_peer_serves_only_while_its_envoy_is_up() {
        let r = Running::parse(RECORD);
        // Both 1.30: pods everywhere; node-1 down → only node-2.
        assert_eq!(
            servers(&r, "node-1", "v1/pods", 200, 300),
            ["node-1", "node-2"]
        );
        assert_eq!(servers(&r, "node-1", "v1/pods", 1200, 1300), ["node-2"]);
        // 1.33-only resource: node-1 once it is ready on 1.33; 1.30-only: node-2 alone.
        let v1beta2 = "resource.k8s.io/v1beta2/resourceclaims";
        assert!(servers(&r, "node-2", v1beta2, 1200, 1300).is_empty());
        assert_eq!(servers(&r, "node-2", v1beta2, 2100, 2200), ["node-1"]);
        let v1alpha2 = "resource.k8s.io/v1alpha2/resourceclaims";
        assert_eq!(servers(&r, "node-1", v1alpha2, 2100, 2200), ["node-2"]);
        // node-2's Envoy restarting: its apiserver is out of node-1's reach, not of its own.
        assert!(servers(&r, "node-1", v1alpha2, 3100, 3200).is_empty());
        assert_eq!(servers(&r, "node-2", v1alpha2, 3100, 3200), ["node-2"]);
        assert!(servers(&r, "node-1", v1alpha2, 4100, 4200).is_empty());
    }
}
