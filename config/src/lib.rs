//! vsnap's typed configuration.
//!
//! `runtime`: the TOML file that configures the shim, found through containerd's
//! runtime options (`ConfigPath`, or the inline `ConfigBody`) or the default path.

pub mod reference;
pub mod runtime;
pub mod tenants;

pub use runtime::{
    ConfigError, ConfigSource, HugePages, PagePlacement, RuntimeConfig, DEFAULT_ARTIFACT_ROOT,
    DEFAULT_CONFIG_PATH,
};
pub use tenants::TenantPolicy;
