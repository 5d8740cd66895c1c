//! `dbservice-operator backup`: a base backup streamed from `pg_basebackup -Ft -D -` through
//! zstd into the object store, in chunks, without touching local disk. Memory is bounded by one
//! chunk. The `backup.json` manifest is written last, after the backup's last WAL segment is
//! archived, so a backup that failed halfway never looks usable.

use crate::lsn::{last_needed_wal_file, wal_file_name};
use crate::store::client::{S3Client, StoreError};
use crate::store::compression::Compression;
use crate::store::config::{BaseBackupArgs, StoreConfigError};
use crate::store::keys::{KeyError, KeyLayout, WalFileName};
use crate::store::manifest::{parse_backup_label, parse_wal_ranges_end, BackupChunk, BackupManifest};
use crate::store::signing::sha256_hex;
use crate::store::wal::SHA256_METADATA;
use bytes::Bytes;
use chrono::Utc;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kept of pg_basebackup's stderr for error messages.
const STDERR_TAIL: usize = 16 * 1024;

/// Kept of the end of `backup_manifest`: its WAL ranges close the document.
const MANIFEST_TAIL: usize = 256 * 1024;

/// Why a base backup failed.
#[derive(Debug, thiserror::Error)]
pub enum BaseBackupError {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] StoreConfigError),
    /// Bad backup id.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The database could not be queried.
    #[error("query {host}:{port}: {message}")]
    Query {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// Why.
        message: String,
    },
    /// A backup with this id exists already.
    #[error("backup {0} already exists")]
    Exists(String),
    /// pg_basebackup could not run or failed.
    #[error("pg_basebackup: {0}")]
    BaseBackup(String),
    /// The tar stream lacked backup_label or backup_manifest's WAL ranges.
    #[error("the backup stream has no {0}")]
    Incomplete(&'static str),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A WAL segment between the backup's begin and end is missing from the archive, or was not
    /// stored by wal-archive (no checksum): the backup could not be restored.
    #[error("WAL segment {segment}, between the backup's begin and end, is {problem}: the backup would not restore")]
    WalGap {
        /// The segment.
        segment: String,
        /// Missing, or unverified.
        problem: &'static str,
    },
    /// The last WAL segment the backup needs was not archived in time.
    #[error("WAL segment {segment} was not archived within {seconds}s (is archiving working?)")]
    WalNotArchived {
        /// The segment.
        segment: String,
        /// The wait.
        seconds: u64,
    },
}

/// Facts about the source server, read before the backup.
struct SourceFacts {
    major_version: u32,
    segment_size: u64,
    system_identifier: String,
    in_recovery: bool,
}

async fn connect(args: &BaseBackupArgs, host: &str) -> Result<tokio_postgres::Client, BaseBackupError> {
    connect_as(args, host, &args.user, password(args)?).await
}

/// --user's password: --password-file's (without a trailing newline), else PGPASSWORD's.
fn password(args: &BaseBackupArgs) -> Result<Option<String>, BaseBackupError> {
    match &args.password_file {
        Some(path) => std::fs::read_to_string(path)
            .map(|text| Some(text.trim_end_matches(['\n', '\r']).to_string()))
            .map_err(|error| BaseBackupError::BaseBackup(format!("read {}: {error}", path.display()))),
        None => Ok(std::env::var("PGPASSWORD").ok()),
    }
}

async fn connect_as(
    args: &BaseBackupArgs,
    host: &str,
    user: &str,
    password: Option<String>,
) -> Result<tokio_postgres::Client, BaseBackupError> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(host)
        .port(args.port)
        .user(user)
        .dbname("postgres")
        .application_name("dbservice-backup")
        // Privileged (replication) SQL: pinned search_path as the agent's (issue 37); no
        // statement timeout, a backup's waits are bounded by the job.
        .options(crate::postgres_tls::tool_options())
        .connect_timeout(Duration::from_secs(10));
    if let Some(password) = password {
        config.password(password);
    }
    crate::postgres_tls::connect(&config, args.ssl_root_certificate.as_deref())
        .await
        .map_err(|error| BaseBackupError::Query { host: host.to_string(), port: args.port, message: error.to_string() })
}

async fn source_facts(args: &BaseBackupArgs) -> Result<SourceFacts, BaseBackupError> {
    let client = connect(args, &args.host).await?;
    let query_error = |error: tokio_postgres::Error| BaseBackupError::Query {
        host: args.host.clone(),
        port: args.port,
        message: error.to_string(),
    };
    let row = client
        .query_one(
            "select pg_catalog.current_setting('server_version_num')::int, \
                    (select setting::bigint from pg_catalog.pg_settings where name = 'wal_segment_size'), \
                    (select system_identifier::text from pg_catalog.pg_control_system()), pg_catalog.pg_is_in_recovery()",
            &[],
        )
        .await
        .map_err(query_error)?;
    let version: i32 = row.get(0);
    let segment_size: i64 = row.get(1);
    Ok(SourceFacts {
        major_version: u32::try_from(version / 10_000).unwrap_or_default(),
        segment_size: u64::try_from(segment_size).unwrap_or(16 * 1024 * 1024),
        system_identifier: row.get(2),
        in_recovery: row.get(3),
    })
}

/// Passes everything it reads on to `writer` too, counting it.
struct Tee<R, W> {
    reader: R,
    writer: W,
    bytes: u64,
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = self.reader.read(buffer)?;
        self.writer.write_all(&buffer[..read])?;
        self.bytes += read as u64;
        Ok(read)
    }
}

/// Uploads what is written to it as chunks of at least `chunk_bytes`.
struct ChunkUploader<'a> {
    runtime: tokio::runtime::Handle,
    client: &'a S3Client,
    layout: &'a KeyLayout,
    backup_id: &'a str,
    compression: Compression,
    chunk_bytes: usize,
    buffer: Vec<u8>,
    chunks: Vec<BackupChunk>,
}

impl ChunkUploader<'_> {
    fn upload(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let index = u32::try_from(self.chunks.len()).map_err(std::io::Error::other)?;
        let key =
            self.layout.backup_chunk_key(self.backup_id, index, self.compression).map_err(std::io::Error::other)?;
        let body = Bytes::from(std::mem::replace(&mut self.buffer, Vec::with_capacity(self.chunk_bytes)));
        let sha256 = sha256_hex(&body);
        let bytes = body.len() as u64;
        self.runtime
            .block_on(self.client.put_object(&key, body, &[(SHA256_METADATA, &sha256)]))
            .map_err(std::io::Error::other)?;
        self.chunks.push(BackupChunk { key, bytes, sha256 });
        Ok(())
    }
}

impl Write for ChunkUploader<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(data);
        if self.buffer.len() >= self.chunk_bytes {
            self.upload()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the stream told about the backup.
struct Streamed {
    label: Option<String>,
    manifest_tail: Vec<u8>,
    size_bytes: u64,
    chunks: Vec<BackupChunk>,
}

/// Reads the tar stream, keeping backup_label and the tail of backup_manifest, while every
/// byte goes on to `sink`. Returns (label, manifest tail, stream size, sink).
fn read_tar<R: Read, W: Write>(source: R, sink: W) -> std::io::Result<(Option<String>, Vec<u8>, u64, W)> {
    let mut archive = tar::Archive::new(Tee { reader: source, writer: sink, bytes: 0 });
    let mut label = None;
    let mut manifest_tail = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().trim_start_matches("./").to_string();
        if path == "backup_label" {
            let mut text = String::new();
            entry.by_ref().take(64 * 1024).read_to_string(&mut text)?;
            label = Some(text);
        } else if path == "backup_manifest" {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let read = entry.read(&mut buffer)?;
                if read == 0 {
                    break;
                }
                manifest_tail.extend_from_slice(&buffer[..read]);
                if manifest_tail.len() > MANIFEST_TAIL {
                    manifest_tail.drain(..manifest_tail.len() - MANIFEST_TAIL);
                }
            }
        }
    }
    let mut tee = archive.into_inner();
    // The end-of-archive blocks after the last entry belong to the stream too.
    std::io::copy(&mut tee, &mut std::io::sink())?;
    Ok((label, manifest_tail, tee.bytes, tee.writer))
}

/// Streams the tar from `source` through the compressor into the uploader.
fn stream<R: Read>(source: R, uploader: &mut ChunkUploader<'_>) -> std::io::Result<Streamed> {
    let (label, manifest_tail, size_bytes) = match uploader.compression {
        Compression::Zstd => {
            let encoder = zstd::stream::write::Encoder::new(&mut *uploader, 3)?;
            let (label, tail, size, encoder) = read_tar(source, encoder)?;
            encoder.finish()?;
            (label, tail, size)
        }
        Compression::None => {
            let (label, tail, size, _) = read_tar(source, &mut *uploader)?;
            (label, tail, size)
        }
    };
    uploader.upload()?;
    Ok(Streamed { label, manifest_tail, size_bytes, chunks: std::mem::take(&mut uploader.chunks) })
}

fn pg_basebackup_path(args: &BaseBackupArgs) -> std::path::PathBuf {
    match &args.pg_bin_dir {
        Some(directory) => directory.join("pg_basebackup"),
        None => "pg_basebackup".into(),
    }
}

/// Runs pg_basebackup and streams its output to the store (blocking: run it off the runtime).
fn run_pg_basebackup(args: &BaseBackupArgs, uploader: &mut ChunkUploader<'_>) -> Result<Streamed, BaseBackupError> {
    let mut command = Command::new(pg_basebackup_path(args));
    // The password as a file pg_basebackup alone reads, not in its environment.
    let password_file = match password(args)? {
        Some(password) => Some(
            crate::passfile::PasswordFile::new(&args.user, &password, None)
                .map_err(|error| BaseBackupError::BaseBackup(format!("password file: {error}")))?,
        ),
        None => None,
    };
    if let Some(file) = &password_file {
        command.env_remove("PGPASSWORD").env("PGPASSFILE", file.path());
    }
    let mut child = command
        .args(["-h", &args.host, "-p", &args.port.to_string(), "-U", &args.user])
        .args(["-D", "-", "-F", "t", "-X", "none", "-c", "fast", "-w", "-l"])
        .arg(format!("dbservice {}", uploader.backup_id))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| {
            BaseBackupError::BaseBackup(format!("start {}: {error}", pg_basebackup_path(args).display()))
        })?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        let start = text.len().saturating_sub(STDERR_TAIL);
        String::from_utf8_lossy(&text[start..]).trim().to_string()
    });
    let streamed = stream(stdout, uploader);
    if streamed.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().map_err(|error| BaseBackupError::BaseBackup(error.to_string()))?;
    let stderr = stderr_reader.join().unwrap_or_default();
    if !status.success() {
        return Err(BaseBackupError::BaseBackup(format!("{status}: {stderr}")));
    }
    streamed.map_err(|error| BaseBackupError::BaseBackup(format!("stream: {error}")))
}

/// Forces the segment holding the backup's end to complete, when a primary is reachable.
async fn switch_wal(args: &BaseBackupArgs, facts: &SourceFacts) -> Result<(), BaseBackupError> {
    let host = match (&args.switch_wal_host, facts.in_recovery) {
        (Some(host), _) => host.clone(),
        (None, false) => args.host.clone(),
        // A standby cannot switch; archive_timeout on the primary completes the segment.
        (None, true) => return Ok(()),
    };
    let client = match &args.switch_wal_user {
        Some(user) => {
            let password = match std::env::var("DBSERVICE_BACKUP_SWITCH_WAL_PASSWORD").ok() {
                Some(password) => Some(password),
                None => password(args)?,
            };
            connect_as(args, &host, user, password).await?
        }
        None => connect(args, &host).await?,
    };
    client.execute("select pg_catalog.pg_switch_wal()", &[]).await.map_err(|error| BaseBackupError::Query {
        host,
        port: args.port,
        message: error.to_string(),
    })?;
    Ok(())
}

/// Waits until `segment` is in the store, under either compression.
async fn wait_archived(
    client: &S3Client,
    layout: &KeyLayout,
    segment: &str,
    limit: Duration,
) -> Result<(), BaseBackupError> {
    let name = WalFileName::parse(segment)?;
    let keys = [layout.wal_key(&name, Compression::Zstd), layout.wal_key(&name, Compression::None)];
    let deadline = Instant::now() + limit;
    loop {
        for key in &keys {
            if client.head_object(key).await?.is_some() {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(BaseBackupError::WalNotArchived { segment: segment.to_string(), seconds: limit.as_secs() });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Most segments a backup's span is checked for (a backup spanning more WAL than this is checked
/// at its ends and first segments only; 4096 segments are 64 GiB at the default size).
const MAX_CHECKED_SEGMENTS: usize = 4096;

/// Checks that every segment from the backup's begin to its end is archived, with wal-archive's
/// checksum: a backup is complete only when all of them are, not just the last one.
async fn verify_archived_between(
    client: &S3Client,
    layout: &KeyLayout,
    timeline: u32,
    begin: crate::lsn::Lsn,
    end: crate::lsn::Lsn,
    segment_size: u64,
) -> Result<(), BaseBackupError> {
    for segment in crate::lsn::wal_file_names_between(timeline, begin, end, segment_size, MAX_CHECKED_SEGMENTS) {
        let name = WalFileName::parse(&segment)?;
        let mut problem = "missing from the archive";
        for compression in [Compression::Zstd, Compression::None] {
            if let Some(object) = client.head_object(&layout.wal_key(&name, compression)).await? {
                problem = if object.metadata.contains_key(crate::store::wal::SHA256_METADATA) {
                    ""
                } else {
                    "in the archive without wal-archive's checksum"
                };
                break;
            }
        }
        if !problem.is_empty() {
            return Err(BaseBackupError::WalGap { segment, problem });
        }
    }
    Ok(())
}

/// Deletes what a failed backup uploaded, so that failures never pile up in the store.
async fn discard(client: &S3Client, layout: &KeyLayout, backup_id: &str) {
    let Ok(prefix) = layout.base_backup_prefix(backup_id) else { return };
    if let Ok(objects) = client.list_objects(&prefix).await {
        for object in objects {
            let _ = client.delete_object(&object.key).await;
        }
    }
}

/// Takes one base backup; returns its manifest (also stored as `backup.json`).
pub async fn take_backup(args: BaseBackupArgs) -> Result<BackupManifest, BaseBackupError> {
    let (client, layout) = args.store.connect()?;
    let backup_id = args.backup_id.clone().unwrap_or_else(|| Utc::now().format("%Y%m%dT%H%M%SZ").to_string());
    let manifest_key = layout.backup_manifest_key(&backup_id)?;
    if client.head_object(&manifest_key).await?.is_some() {
        return Err(BaseBackupError::Exists(backup_id));
    }
    let facts = source_facts(&args).await?;
    let start_time = Utc::now();
    let result = async {
        let streamed = {
            let (args, client, layout, backup_id) = (args.clone(), client.clone(), layout.clone(), backup_id.clone());
            let runtime = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                let chunk_bytes = usize::try_from(args.chunk_mib).unwrap_or(64) * 1024 * 1024;
                let mut uploader = ChunkUploader {
                    runtime,
                    client: &client,
                    layout: &layout,
                    backup_id: &backup_id,
                    compression: args.store.compression,
                    chunk_bytes,
                    buffer: Vec::with_capacity(chunk_bytes),
                    chunks: Vec::new(),
                };
                run_pg_basebackup(&args, &mut uploader)
            })
            .await
            .map_err(|error| BaseBackupError::BaseBackup(format!("stream task: {error}")))??
        };
        let end_time = Utc::now();
        let (begin_lsn, timeline) = streamed
            .label
            .as_deref()
            .and_then(parse_backup_label)
            .ok_or(BaseBackupError::Incomplete("backup_label"))?;
        let (end_lsn, end_timeline) = parse_wal_ranges_end(&String::from_utf8_lossy(&streamed.manifest_tail))
            .ok_or(BaseBackupError::Incomplete("WAL-Ranges in backup_manifest"))?;
        let end_wal = last_needed_wal_file(end_timeline, end_lsn, facts.segment_size);
        switch_wal(&args, &facts).await?;
        wait_archived(&client, &layout, &end_wal, Duration::from_secs(args.wal_wait_seconds)).await?;
        if timeline == end_timeline {
            verify_archived_between(&client, &layout, timeline, begin_lsn, end_lsn, facts.segment_size).await?;
        }
        let manifest = BackupManifest {
            id: backup_id.clone(),
            server_name: args.store.server_name.clone(),
            begin_lsn,
            end_lsn,
            begin_wal: wal_file_name(timeline, begin_lsn, facts.segment_size),
            end_wal,
            start_time,
            end_time,
            timeline,
            postgres_major_version: facts.major_version,
            system_identifier: facts.system_identifier.clone(),
            from_standby: facts.in_recovery,
            size_bytes: streamed.size_bytes,
            stored_bytes: streamed.chunks.iter().map(|chunk| chunk.bytes).sum(),
            compression: format!("{:?}", args.store.compression).to_lowercase(),
            chunks: streamed.chunks,
        };
        let body = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
        client.put_object(&manifest_key, Bytes::from(body), &[]).await?;
        Ok(manifest)
    }
    .await;
    if result.is_err() {
        discard(&client, &layout, &backup_id).await;
    }
    result
}

/// `dbservice-operator backup`: prints the manifest (without its chunk list) as one JSON line,
/// after enforcing `--retention` when set, and writes it to `--summary-file` when set. A failed
/// retention does not fail the command (the backup is stored): the summary carries its error.
pub async fn backup_command(args: BaseBackupArgs) -> Result<(), BaseBackupError> {
    let retention = args.retention;
    let summary_file = args.summary_file.clone();
    let store = args.store.clone();
    let manifest = take_backup(args).await?;
    let mut summary = serde_json::to_value(&manifest).expect("a manifest serializes");
    let fields = summary.as_object_mut().expect("an object");
    fields.remove("chunks");
    if let Some(policy) = retention {
        let (client, layout) = store.connect()?;
        match crate::store::retention::enforce(&client, &layout, policy, Utc::now()).await {
            Ok(plan) => {
                fields.insert(
                    "retention".into(),
                    serde_json::json!({
                        "expiredBackups": plan.expired_backups,
                        "expiredWalFiles": plan.expired_wal.len(),
                        "abandonedBackups": plan.abandoned_backups,
                    }),
                );
            }
            Err(error) => {
                eprintln!("the backup is stored but retention failed: {error}");
                fields.insert("retentionError".into(), serde_json::Value::String(error.to_string()));
            }
        }
    }
    let line = summary.to_string();
    if let Some(path) = summary_file {
        if let Err(error) = std::fs::write(&path, &line) {
            eprintln!("cannot write the summary file {}: {error}", path.display());
        }
    }
    println!("{line}");
    Ok(())
}
