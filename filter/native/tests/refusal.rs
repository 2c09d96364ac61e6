//! The module in a host that is not the Envoy it was built for: this test process, which
//! exports none of Envoy's callbacks. `on_program_init` returns null, which makes Envoy unload
//! the module and refuse the configuration naming it, instead of the module crashing on its
//! first callback. (Its own process: the crate's unit tests install a fake host.)

#![allow(clippy::expect_used, clippy::indexing_slicing)]

use skewgate_native::ffi::{refusal, refusal_message, Callbacks};
use skewgate_native::hooks::envoy_dynamic_module_on_program_init;

#[test]
fn a_host_without_envoys_callbacks_is_refused_with_the_missing_one_named() {
    let missing = refusal().expect("refused");
    assert_eq!(missing, Callbacks::NAMES[0]);
    assert!(envoy_dynamic_module_on_program_init().is_null());
    let message = refusal_message(missing);
    for part in [missing, "Envoy 1.40", "v0.2.0", "--data-plane wasm"] {
        assert!(message.contains(part), "{message}");
    }
}
