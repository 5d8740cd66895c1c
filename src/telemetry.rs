//! Logging set-up: `RUST_LOG` filters, text or JSON output.

use crate::cli::LogFormat;
use tracing_subscriber::EnvFilter;

/// Initialises the global subscriber once.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,kube_runtime=warn,kube_client=warn,hyper=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
