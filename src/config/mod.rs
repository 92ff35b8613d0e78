//! Server configuration: built-in defaults, then a TOML file, then `LATHE_`-prefixed environment
//! variables (`LATHE_SERVER__LISTEN=0.0.0.0:50051`, sections split by `__`), then command-line
//! flags. Unknown keys are rejected with the key's name. `deploy/lathe.toml` documents every key
//! and holds exactly the built-in defaults (a unit test keeps the two equal).

mod ingest;
mod models;
mod retrieval;
mod server;
mod storage;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

pub use ingest::IngestConfig;
pub use models::{DenseModel, FineModeName, ModelsConfig};
pub use retrieval::{CacheConfig, LimitsConfig, RetrievalConfig};
pub use server::{AuthConfig, LogConfig, LogFormat, ReplicationConfig, ServerConfig, TlsConfig};
pub use storage::{
    DenseConfig, StorageConfig, DENSE_TIER_MERGE_FACTOR, MAX_DENSE_EF_SEARCH,
    MAX_DENSE_LOAD_THREADS, MAX_DENSE_SEAL_VECTORS,
};

/// The documented default configuration, embedded in the binary.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../../deploy/lathe.toml");

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub models: ModelsConfig,
    pub dense: DenseConfig,
    pub limits: LimitsConfig,
    pub ingest: IngestConfig,
    pub retrieval: RetrievalConfig,
    pub cache: CacheConfig,
    pub log: LogConfig,
    pub tls: TlsConfig,
    pub auth: AuthConfig,
    pub replication: ReplicationConfig,
}

/// Values given on the command line; they override the file and the environment.
#[derive(Clone, Debug, Default)]
pub struct ConfigOverrides {
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub models_dir: Option<PathBuf>,
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(String);

/// `Ok` when `ok` holds, else the error `message` (which names the field and its range).
fn check(ok: bool, message: &str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError(message.to_string()))
    }
}

impl Config {
    /// Defaults, then `file` (when given), then `LATHE_*` variables, then `overrides`.
    pub fn load(file: Option<&Path>, overrides: &ConfigOverrides) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "file {} does not exist",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file(path));
        }
        // Only LATHE_<SECTION>__<KEY> names are configuration: Kubernetes injects LATHE_PORT and
        // friends for a Service named `lathe`, and scripts use LATHE_MODELS_DIR and the like.
        figment = figment.merge(
            Env::prefixed("LATHE_")
                .filter(|key| key.as_str().contains("__"))
                .split("__"),
        );
        if let Some(listen) = overrides.listen {
            figment = figment.merge(Serialized::default("server.listen", listen));
        }
        if let Some(data_dir) = &overrides.data_dir {
            figment = figment.merge(Serialized::default("storage.data_dir", data_dir));
        }
        if let Some(models_dir) = &overrides.models_dir {
            figment = figment.merge(Serialized::default("models.dir", models_dir));
        }
        if let Some(format) = overrides.log_format {
            figment = figment.merge(Serialized::default("log.format", format));
        }
        let config: Config = figment
            .extract()
            .map_err(|error| ConfigError(error.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document on top of the defaults (no environment, no flags).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(text))
            .extract()
            .map_err(|error| ConfigError(error.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    pub fn cpu_threads(&self) -> usize {
        if self.server.cpu_threads > 0 {
            return self.server.cpu_threads;
        }
        std::thread::available_parallelism().map_or(2, |n| n.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_default_file_is_exactly_the_built_in_default() {
        let parsed = Config::from_toml(DEFAULT_CONFIG_TOML).expect("deploy/lathe.toml must load");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn an_otlp_endpoint_needs_the_otel_feature() {
        let result = Config::from_toml("[log]\notlp_endpoint = \"http://127.0.0.1:4317\"\n");
        if cfg!(feature = "otel") {
            assert!(result.is_ok(), "{result:?}");
        } else {
            let error = result.unwrap_err().to_string();
            assert!(
                error.contains("log.otlp_endpoint") && error.contains("without the otel feature"),
                "{error}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        let error = Config::from_toml("[server]\nlisten_addr = \"0.0.0.0:1\"\n").unwrap_err();
        assert!(error.to_string().contains("listen_addr"), "{error}");
    }

    #[test]
    fn invalid_values_are_rejected_with_the_key() {
        let error = Config::from_toml("[limits]\nmax_top_k = 0\n").unwrap_err();
        assert!(error.to_string().contains("limits.max_top_k"), "{error}");
        let error = Config::from_toml("[dense]\nef_search = 0\n").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("dense.ef_search must be in 1..=4096"),
            "{error}"
        );
        let error = Config::from_toml("[dense]\nload_threads = 257\n").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("dense.load_threads must be in 0..=256"),
            "{error}"
        );
        assert!(Config::from_toml("[dense]\nload_threads = 1\n").is_ok());
        for (key, value) in [
            ("ambiguous_gap", "1.5"),
            ("ambiguous_gap", "nan"),
            ("ambiguous_diversity", "-0.1"),
        ] {
            let error = Config::from_toml(&format!("[retrieval]\n{key} = {value}\n")).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains(&format!("retrieval.{key} must be in 0..=1")),
                "{error}"
            );
        }
        assert!(Config::from_toml("[retrieval]\nambiguous_diversity = 0.0\n").is_ok());
        let error = Config::from_toml("[dense]\nseal_vectors = 100\nmax_segment_vectors = 399\n")
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("dense.max_segment_vectors must be 0 (no limit) or at least 4"),
            "{error}"
        );
        assert!(
            Config::from_toml("[dense]\nseal_vectors = 100\nmax_segment_vectors = 400\n").is_ok()
        );
        for tokens in [255, 65_537] {
            let error =
                Config::from_toml(&format!("[models]\ninference_batch_tokens = {tokens}\n"))
                    .unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("models.inference_batch_tokens must lie in 256..=65536"),
                "{error}"
            );
        }
        assert!(Config::from_toml("[models]\ninference_batch_tokens = 256\n").is_ok());
        for threads in [0, 9] {
            let error = Config::from_toml(&format!("[storage]\nindexing_threads = {threads}\n"))
                .unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("storage.indexing_threads must be in 1..=8"),
                "{error}"
            );
        }
        assert!(Config::from_toml("[storage]\nindexing_threads = 8\n").is_ok());
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API returns its own error type
    fn environment_overrides_the_file_and_flags_override_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "lathe.toml",
                "[storage]\ndata_dir = \"/from/file\"\n[limits]\nmax_top_k = 50\n",
            )?;
            jail.set_env("LATHE_LIMITS__MAX_TOP_K", "20");
            jail.set_env("LATHE_STORAGE__DATA_DIR", "/from/env");
            jail.set_env("LATHE_PORT", "tcp://10.0.0.1:50051");
            let overrides = ConfigOverrides {
                data_dir: Some(PathBuf::from("/from/flag")),
                ..ConfigOverrides::default()
            };
            let config = Config::load(Some(Path::new("lathe.toml")), &overrides).expect("loads");
            assert_eq!(config.limits.max_top_k, 20);
            assert_eq!(config.storage.data_dir, PathBuf::from("/from/flag"));
            Ok(())
        });
    }
}
