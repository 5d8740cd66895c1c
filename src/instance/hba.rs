//! The operator's blocks in the data directory's pg_hba.conf: each is delimited by a BEGIN and an
//! END comment line, rewritten by the agent before every start (a clone or a rewind copies the
//! source's file), and left alone otherwise.

use crate::instance::InstanceConfig;

/// The lines of `hba` outside the block delimited by `begin` and `end`.
pub fn without_block<'a>(hba: &'a str, begin: &str, end: &str) -> Vec<&'a str> {
    let mut kept = Vec::new();
    let mut inside = false;
    for line in hba.lines() {
        if line == begin {
            inside = true;
        } else if line == end {
            inside = false;
        } else if !inside {
            kept.push(line);
        }
    }
    kept
}

/// `lines`, each ended by a newline.
pub fn joined(lines: &[&str]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

/// Rewrites the data directory's pg_hba.conf as `edit` makes it, only when that changes it
/// (through a temporary file and a rename; a missing file is left missing).
pub fn rewrite(config: &InstanceConfig, edit: impl FnOnce(&str) -> String) -> std::io::Result<()> {
    let path = config.pgdata.join("pg_hba.conf");
    let hba = match std::fs::read_to_string(&path) {
        Ok(hba) => hba,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    let wanted = edit(&hba);
    if wanted == hba {
        return Ok(());
    }
    let temporary = path.with_extension("conf.dbservice.tmp");
    std::fs::write(&temporary, wanted)?;
    std::fs::set_permissions(&temporary, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    config.chown(&[&temporary]);
    std::fs::rename(&temporary, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_cut_out_with_its_markers() {
        let hba = "a\n# B\nx\ny\n# E\nb\n";
        assert_eq!(without_block(hba, "# B", "# E"), ["a", "b"]);
        assert_eq!(joined(&without_block(hba, "# other", "# E")), "a\n# B\nx\ny\nb\n");
    }
}
