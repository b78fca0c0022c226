//! Which store a command talks to: `--store URL`, else `TESSERA_STORE` (both handled by clap),
//! else the embedded SQLite store in the user's state directory.

use std::path::PathBuf;

use tessera::Store;

use crate::exit::{Failure, USAGE};

/// The default store URL: `sqlite://$XDG_STATE_HOME/tessera/tessera.db`, or
/// `sqlite://$HOME/.local/state/tessera/tessera.db` when `XDG_STATE_HOME` is unset, empty or
/// relative (the XDG spec says relative values are to be ignored). Pure: creates nothing.
pub fn default_db_path() -> Result<PathBuf, Failure> {
    let xdg = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = match xdg {
        Some(dir) => dir,
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .map(|home| home.join(".local").join("state"))
            .ok_or_else(|| {
                Failure::new(
                    USAGE,
                    "no store given and neither XDG_STATE_HOME nor HOME is set; use --store URL or TESSERA_STORE",
                )
            })?,
    };
    Ok(base.join("tessera").join("tessera.db"))
}

/// Connects to `url`, or to the default store (creating its directory) when `url` is `None`.
///
/// Call this only after every other argument has been validated: the SQLite store creates its
/// file on connect, and invalid input must touch nothing.
pub async fn connect(url: Option<&str>) -> Result<Store, Failure> {
    let url = match url {
        Some(u) if !u.trim().is_empty() => u.to_string(),
        _ => {
            let path = default_db_path()?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Failure::new(
                        crate::exit::UNAVAILABLE,
                        format!("cannot create the state directory {}: {e}", dir.display()),
                    )
                })?;
            }
            format!("sqlite://{}", path.display())
        }
    };
    let store = Store::connect(&url).await?;
    tracing::debug!(store = %store.url(), "connected");
    Ok(store)
}
